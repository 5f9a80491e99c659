"""Pre-norm decoder blocks: RMSNorm, RoPE (or no positional encoding), grouped-query attention, SwiGLU."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from fullband.config import ModelConfig
from fullband.model.kv_cache import KVCache
from fullband.model.linear import Linear, cpu_inference, fsdp_managed, fuses, product


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, init: float = 1.0) -> None:
        super().__init__()
        self.eps = eps
        self.init = init  # the gain's initial value (reset_parameters restores it)
        self.weight = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_inference(x):
            return self.one_op(x)
        return self.formula(x)

    def one_op(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`formula` in one op where that gives the same numbers: float32 or float64 x and weight (torch's
        RMSNorm computes this formula in x's dtype)."""
        if x.dtype in (torch.float32, torch.float64) and self.weight.dtype == x.dtype:
            return torch.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.formula(x)

    def formula(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in at least float32 so bf16 activations keep their precision here.
        dtype = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(dtype)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """RoPE inverse frequencies (head_dim/2,), in float32 as Hugging Face Llama computes them."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)


class RopeTables(tuple):
    """RoPE's (cos, sin) for one forward, as :func:`apply_rope` takes them (``*rope`` unpacks it), with the
    full-width tables :func:`rotate` needs, made once for every block that reads them."""

    @functools.cached_property
    def full(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) over the whole head, the sine signed as rotate-half needs it."""
        cos, sin = self
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos/sin of shape (B, 1, T, head_dim/2) for integer positions (B, T).

    Angles are computed in float32 exactly as Hugging Face Llama does, so converted weights give identical
    logits; every execution mode uses this same function, so they agree in any dtype.
    """
    angles = positions.float()[..., None] * inv_freq.float()  # (B, T, hd/2)
    return angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Rotate-half convention (as in Llama/HF), so weights convert to LlamaForCausalLM unchanged.
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotate(x: torch.Tensor, rope: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """:func:`apply_rope` in four ops instead of nine, the same numbers (x1 cos - x2 sin is x1 cos + x2 (-sin) in
    floating point): the fused decoding step's, where each op's fixed cost counts."""
    cos, sin = (rope if isinstance(rope, RopeTables) else RopeTables(rope)).full
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, D)
        rope: tuple[torch.Tensor, ...] | None,  # RoPE's (cos, sin); None = no positional encoding (NoPE)
        mask: torch.Tensor | None,  # (B, 1, T, S) bool or additive, None = plain causal
        cache: KVCache | None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return self.o_proj(self.attend(q, k, v, mask, cache))

    def fused(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, ...] | None, mask: torch.Tensor | None, cache: KVCache | None
    ) -> torch.Tensor:
        """:meth:`forward` of a decoding step on a CPU (:func:`~fullband.model.linear.fuses`; the block decides): q,
        k and v in one product, q and k rotated together in fewer ops, the projections as their weights' products
        (no module calls); the same numbers."""
        B, T, _ = x.shape
        H, Hkv = self.n_heads, self.n_kv_heads
        qkv = product(x, self, ("q_proj", "k_proj", "v_proj"))
        qkv = qkv.view(B, T, H + 2 * Hkv, self.head_dim).transpose(1, 2)  # (B, H + 2 Hkv, T, hd)
        qk = qkv[:, : H + Hkv] if rope is None else rotate(qkv[:, : H + Hkv], rope)
        return product(self.attend(qk[:, :H], qk[:, H:], qkv[:, H + Hkv :], mask, cache), self, ("o_proj",))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, cache: KVCache | None
    ) -> torch.Tensor:
        """Attention of q (B, H, T, hd) over the cached keys/values and k, v (B, Hkv, T, hd) -> (B, T, H hd), the
        heads side by side (o_proj's input)."""
        B, _, T, _ = q.shape
        if cache is not None:
            # Writes at the pending positions; a later pass over the same chunk overwrites them.
            k, v = cache.write(self.layer_index, k, v)  # (B, Hkv, S, hd)
        if self.n_kv_heads != self.n_heads:
            repeat = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return y.transpose(1, 2).reshape(B, T, -1)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.up_proj = Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.down_proj = Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of a decoding step on a CPU (the block decides): gate and up in one product, the
        projections as their weights' products (no module calls); the same numbers."""
        gate, up = product(x, self, ("gate_proj", "up_proj")).chunk(2, dim=-1)
        return product(F.silu(gate) * up, self, ("down_proj",))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer_index)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, ...] | None, mask: torch.Tensor | None,
        cache: KVCache | None,
    ) -> torch.Tensor:
        if fuses(x) and not fsdp_managed(self):  # a decoding step on a CPU: the fused paths, no submodule calls
            x = x + self.attn.fused(self.attn_norm.one_op(x), rope, mask, cache)
            return x + self.mlp.fused(self.mlp_norm.one_op(x))
        x = x + self.attn(self.attn_norm(x), rope, mask, cache)
        return x + self.mlp(self.mlp_norm(x))
