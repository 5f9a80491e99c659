"""The two control networks of ``fullband eval-controls`` that are not a :class:`~fullband.model.FeedbackLM`
(DESIGN.md §7): a looped transformer as the literature builds it, and an RNN.

Both map tokens (B, T) to logits (B, T, V) per position, causally: the logits of position t depend on tokens
0..t only, so one sequence scores every prefix, as the transformers' and the full-bandwidth model's do.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import torch
from torch import nn

from fullband.config import ModelConfig
from fullband.model import FullBandwidthLM


class LoopedTransformer(nn.Module):
    """Depth recurrence: the blocks of a plain transformer applied ``k`` times at every position, the token's
    embedding added to the state at every loop, ``x^(k) = h^(k-1) + e_t`` (input injection; Fan et al. 2024,
    "Looped transformers for length generalization"). No state moves along the sequence except through attention
    within a loop, so a position's serial depth is ``k x n_layers`` whatever its index.

    How many loops a problem gets is a rule of its length (``loops_per_step`` x n, at least 1), the same in
    training and decoding: position t (the t-th step) is read after ``loops_for(t)`` loops. By causality the states
    of positions <= t after k loops over a whole sequence equal those of a run over its first t + 1 tokens, so one
    run of the longest position's count scores every prefix with its own count. Gradients flow through every loop.
    """

    def __init__(self, config: ModelConfig, loops_per_step: int) -> None:
        super().__init__()
        if loops_per_step < 1:
            raise ValueError(f"loops_per_step must be >= 1, got {loops_per_step}")
        self.loops_per_step = loops_per_step
        self.net = FullBandwidthLM(dataclasses.replace(config, feedback=False))  # embedding, blocks, head

    @property
    def config(self) -> ModelConfig:
        return self.net.config

    def loops_for(self, T: int, device: torch.device) -> torch.Tensor:
        """(T,) loops of each position: ``loops_per_step`` x its index (the steps it has read), at least 1."""
        return (torch.arange(T, device=device) * self.loops_per_step).clamp(min=1)

    def loop_logits(self, tokens: torch.Tensor, loops: int) -> Iterator[torch.Tensor]:
        """Logits (B, T, V) after each of ``loops`` loops over the whole sequence."""
        emb = self.net.embed(tokens)  # (B, T, D)
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        x = emb
        for _ in range(loops):
            state, normed = self.net.run_stack(x, positions)
            yield self.net.lm_head(normed)
            x = state + emb

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) -> logits (B, T, V), each position's after its own loop count."""
        loops = self.loops_for(tokens.shape[1], tokens.device)
        out = None
        for k, logits in enumerate(self.loop_logits(tokens, int(loops.max())), start=1):
            here = (loops == k)[None, :, None]
            out = torch.where(here, logits, out) if out is not None else torch.where(here, logits, 0.0)
        return out


class RNNLM(nn.Module):
    """A one-layer GRU or LSTM language model (embedding, cell, linear head): the reference recurrence."""

    def __init__(self, vocab_size: int, hidden: int, cell: str) -> None:
        super().__init__()
        if cell not in RNN_CELLS:
            raise ValueError(f"cell must be one of {tuple(RNN_CELLS)}, got {cell!r}")
        self.cell = cell
        self.embed = nn.Embedding(vocab_size, hidden)
        self.rnn = RNN_CELLS[cell](hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(self.embed(tokens))  # (B, T, H)
        return self.head(states)


RNN_CELLS: dict[str, type[nn.RNNBase]] = {"gru": nn.GRU, "lstm": nn.LSTM}


def rnn_parameters(vocab_size: int, hidden: int, cell: str) -> int:
    """Parameters of :class:`RNNLM`: embedding, the cell's gates (input and recurrent weights and two biases per
    gate), head with bias."""
    gates = {"gru": 3, "lstm": 4}[cell]
    return vocab_size * hidden + gates * (2 * hidden * hidden + 2 * hidden) + hidden * vocab_size + vocab_size


def matched_rnn_hidden(vocab_size: int, cell: str, parameters: int) -> int:
    """The hidden size whose :class:`RNNLM` has the number of parameters nearest to ``parameters``."""
    gates = {"gru": 3, "lstm": 4}[cell]
    a, b = 2 * gates, 2 * vocab_size + 2 * gates  # parameters = a H^2 + b H + vocab_size
    guess = int((-b + math.sqrt(b * b + 4 * a * (parameters - vocab_size))) / (2 * a))
    return min((guess, guess + 1), key=lambda h: abs(rnn_parameters(vocab_size, h, cell) - parameters))
