"""Latent-feedback fusion: the previous position's carried state enters the next input.

    x_t = (W_U h_{t-1}) * sigmoid(W_G RMSNorm_e(e_t))                      ("glu_cross", DESIGN.md §1)

The state is on the value path and the token only gates it: an additive ``e + W h`` would let the model
learn to ignore the state, the gate cannot. ``u_t = RMSNorm_in(x_t)`` is the stack's input. Where RMSNorm_in
lives depends on which inputs it sees: with ``input_norm="fused"`` (the default, and every retrofit) only fused
inputs, so it is this module's ``out_norm``; with ``"paper"`` or ``"all"`` plain embeddings meet it too, so it is
the native model's ``input_norm`` and the fusion has no norm of its own.
"""

from __future__ import annotations

import torch
from torch import nn

from fullband.config import ModelConfig
from fullband.model.layers import RMSNorm
from fullband.model.linear import Linear


class LatentFusion(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig | None = None,
        *,
        d_model: int | None = None,
        norm_eps: float = 1e-5,
        out_norm: bool = True,
        out_gain: float = 1.0,
    ) -> None:
        """From a ModelConfig, or from ``d_model``/``norm_eps`` alone for a network without one (a retrofit).

        ``out_norm`` adds RMSNorm_in on the fused input with its gain initialised at ``out_gain`` (a retrofit
        starts it at its embeddings' RMS, so fused inputs begin at the scale its plain inputs have).
        """
        super().__init__()
        own_gate_norm = True
        if cfg is not None:
            d_model, norm_eps, out_norm = cfg.d_model, cfg.norm_eps, cfg.input_norm == "fused"
            out_gain, own_gate_norm = cfg.input_gain, cfg.gate_norm == "own"
        if d_model is None:
            raise ValueError("LatentFusion needs a ModelConfig or d_model")
        # RMSNorm_e; None when the gate shares RMSNorm_in: out_norm below, or else the model's input norm (then the
        # caller passes normalised embeddings).
        self.token_norm = RMSNorm(d_model, norm_eps) if own_gate_norm else None
        self.gate_proj = Linear(d_model, d_model, bias=False)  # W_G
        self.state_proj = Linear(d_model, d_model, bias=False)  # W_U
        self.out_norm = RMSNorm(d_model, norm_eps, init=out_gain) if out_norm else None  # RMSNorm_in

    def forward(self, token_emb: torch.Tensor, prev_state: torch.Tensor) -> torch.Tensor:
        """token_emb e_t and prev_state h_{t-1}, both (..., D) -> fused input (..., D)."""
        if self.token_norm is not None:
            gate_input = self.token_norm(token_emb)
        elif self.out_norm is not None:  # gate_norm="shared" with the fused-only input norm
            gate_input = self.out_norm(token_emb)
        else:  # the model's input norm, already applied by the caller
            gate_input = token_emb
        gate = torch.sigmoid(self.gate_proj(gate_input))
        fused = self.state_proj(prev_state) * gate
        return self.out_norm(fused) if self.out_norm is not None else fused
