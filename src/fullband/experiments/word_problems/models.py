"""The control networks of the word-problem studies that are not a plain :class:`~fullband.model.FeedbackLM`
(DESIGN.md §7): a looped transformer as the literature builds it, the growing-depth read-out of the shift-0 pass loop,
and an RNN.

Each maps tokens (B, T) to logits (B, T, V) per position, causally: the logits of position t depend on tokens
0..t only, so one sequence scores every prefix, as the transformers' and the full-bandwidth model's do.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from fullband.config import ModelConfig
from fullband.model import FullBandwidthLM


def loops_per_position(T: int, loops_per_step: int, device: torch.device | None = None,
                       prefix: int = 0) -> torch.Tensor:
    """(T,) the depth rule of the looped control and the growing-depth ablation (DESIGN.md §7): the position of the
    t-th step (the start cup is step 0, at index ``prefix``, after a lookup problem's table) is read after
    ``loops_per_step`` x t loops (or passes), at least 1. One rule in training and answering."""
    return ((torch.arange(T, device=device) - prefix) * loops_per_step).clamp(min=1)


def read_at_own_depth(per_loop: Iterator[torch.Tensor], loops: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) with each position taken from the loop ``loops[t]`` (1-based) of ``per_loop``, which yields
    the logits after each loop over the whole sequence. By causality position t's logits after k loops over the whole
    sequence equal those of a run over its first t + 1 tokens, so one run scores every prefix at its own depth."""
    out = None
    for k, logits in enumerate(per_loop, start=1):
        here = (loops == k)[None, :, None]
        out = torch.where(here, logits, out if out is not None else 0.0)
        if k == int(loops.max()):
            break
    return out


INJECTIONS = ("raw", "normed")


class LoopedTransformer(nn.Module):
    """Depth recurrence: the blocks of a plain transformer applied ``k`` times at every position, the token's
    embedding added to the state at every loop (input injection; Yang et al. 2024, "Looped transformers are better at
    learning learning algorithms"; Fan et al. 2024, "Looped transformers for length generalization"). No state moves
    along the sequence except through attention within a loop, so a position's serial depth is ``k x n_layers``
    whatever its index.

    ``injection`` says what is fed back: ``raw`` = the residual stream ``x^(k) = h^(k-1) + e_t``; ``normed`` = the
    state after the final RMSNorm, the one the head reads, ``x^(k) = RMSNorm(h^(k-1)) + e_t``: the form of Yang et
    al.'s code, whose GPT-2 backbone returns its output after the final LayerNorm and loops it back, so the state's
    scale cannot drift over many more loops than training ran (DESIGN.md §7's strongest form).

    How many loops a problem gets is a rule of its length (:func:`loops_per_position`), the same in training and
    decoding; one run of the longest position's count scores every prefix with its own count
    (:func:`read_at_own_depth`). Gradients flow through every loop.
    """

    def __init__(self, config: ModelConfig, loops_per_step: int, injection: str = "raw") -> None:
        super().__init__()
        if loops_per_step < 1:
            raise ValueError(f"loops_per_step must be >= 1, got {loops_per_step}")
        if injection not in INJECTIONS:
            raise ValueError(f"injection must be one of {INJECTIONS}, got {injection!r}")
        self.loops_per_step = loops_per_step
        self.injection = injection
        self.net = FullBandwidthLM(dataclasses.replace(config, feedback=False))  # embedding, blocks, head

    @property
    def config(self) -> ModelConfig:
        return self.net.config

    def loops_for(self, T: int, device: torch.device, prefix: int = 0) -> torch.Tensor:
        """(T,) loops of each position (:func:`loops_per_position`)."""
        return loops_per_position(T, self.loops_per_step, device, prefix)

    def loop_logits(self, tokens: torch.Tensor, loops: int) -> Iterator[torch.Tensor]:
        """Logits (B, T, V) after each of ``loops`` loops over the whole sequence."""
        emb = self.net.embed(tokens)  # (B, T, D)
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        x = emb
        for _ in range(loops):
            state, normed = self.net.run_stack(x, positions)
            yield self.net.lm_head(normed)
            x = (normed if self.injection == "normed" else state) + emb

    def forward(self, tokens: torch.Tensor, prefix: int = 0) -> torch.Tensor:
        """(B, T) -> logits (B, T, V), each position's after its own loop count (steps counted after ``prefix``)."""
        loops = self.loops_for(tokens.shape[1], tokens.device, prefix)
        return read_at_own_depth(self.loop_logits(tokens, int(loops.max())), loops)


def growing_depth_logits(model: FullBandwidthLM, tokens: torch.Tensor, loops_per_step: int,
                         prefix: int = 0) -> torch.Tensor:
    """(B, T) -> logits (B, T, V) of a shift-0 full-bandwidth model (``feedback_shift`` 0: pass k fuses a position's
    own state from pass k-1, nothing moves along the sequence but attention) with each position read after its own
    pass count, the looped rule (:func:`loops_per_position`): DESIGN.md §7's growing-depth ablation, the same
    parameters and fusion as the full-bandwidth model and depth that grows with n, without the shift."""
    if model.feedback_shift != 0:
        raise ValueError("growing_depth_logits needs a model with feedback_shift=0")
    loops = loops_per_position(tokens.shape[1], loops_per_step, tokens.device, prefix)
    passes = model.iterate_passes(tokens, int(loops.max()), plain_prefix=prefix + 1)
    return read_at_own_depth((model.lm_head(p.head_input) for p in passes), loops)


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


class AttentionThenLSTM(nn.Module):
    """The strongest control that has both halves: a transformer's embedding and causal blocks (attention can read a
    problem's table back) whose outputs feed a one-layer LSTM (a state carried along the sequence), then a head:
    logits (B, T, V) per position, causally. It carries a small state along the sequence, where the full-bandwidth
    model carries its whole top-layer state through the whole depth again."""

    def __init__(self, config: ModelConfig, hidden: int) -> None:
        super().__init__()
        self.net = FullBandwidthLM(dataclasses.replace(config, feedback=False, tie_embeddings=False))
        del self.net.lm_head  # the LSTM's head answers
        self.rnn = nn.LSTM(config.d_model, hidden, batch_first=True)
        self.head = nn.Linear(hidden, config.vocab_size)

    @property
    def config(self) -> ModelConfig:
        return self.net.config

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        _, normed = self.net.run_stack(self.net.embed(tokens), positions)  # (B, T, D) after the final norm
        states, _ = self.rnn(normed)
        return self.head(states)


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


_META_PARAMETERS: dict[tuple[str, str], int] = {}  # (builder, repr(config)) -> parameters


def meta_parameters(config: ModelConfig, build: Callable[[ModelConfig], nn.Module]) -> int:
    """Parameters of ``build(config)``, built once per builder and config on the meta device: the width searches ask
    for the same count many times, and a meta build still runs every initialiser."""
    key = (build.__qualname__, repr(config))
    if key not in _META_PARAMETERS:
        with torch.device("meta"):
            _META_PARAMETERS[key] = parameters(build(config))
    return _META_PARAMETERS[key]


def _hybrid_blocks(config: ModelConfig) -> nn.Module:
    return AttentionThenLSTM(config, 1).net


def hybrid_parameters(config: ModelConfig, hidden: int) -> int:
    """Parameters of :class:`AttentionThenLSTM`: its embedding and blocks (:func:`meta_parameters`), then the LSTM's
    (four gates: input and recurrent weights, two biases) and the head's (with bias)."""
    d, V = config.d_model, config.vocab_size
    return meta_parameters(config, _hybrid_blocks) + 4 * hidden * (d + hidden + 2) + hidden * V + V


def matched_hybrid_hidden(config: ModelConfig, parameters: int) -> int:
    """The LSTM width whose :class:`AttentionThenLSTM` has the parameter count nearest to ``parameters`` (at least 1:
    when the blocks alone have more, the smallest LSTM)."""
    low, high = 1, 4 * config.d_model
    while low < high:  # the count grows with the width
        mid = (low + high) // 2
        low, high = (mid + 1, high) if hybrid_parameters(config, mid) < parameters else (low, mid)
    return min((max(1, low - 1), low), key=lambda h: abs(hybrid_parameters(config, h) - parameters))


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
