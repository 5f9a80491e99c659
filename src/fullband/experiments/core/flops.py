"""FLOPs of training and of answering one problem, counted one way for every model of a study.

The formula (multiply-adds count 2):

- A token meets ``N`` weights per pass: each block's attention (q, k, v, o) and SwiGLU (gate, up, down) matrices,
  the output head (V·D) and, at a fused position, the fusion's two D×D matrices. Embedding lookups, norms and
  gates are O(D) and not counted.
- Forward over positions ``t``: ``2·N`` per token, plus attention ``4·L·D·t`` at position t (scores q·k and the
  weighted sum of values over its t keys, causal), so a causal forward over T tokens costs
  ``2·N·T + 2·L·D·T·(T+1)``.
- A pass with gradients costs 3x its forward (forward + backward ≈ 6·N per token).
- A model whose feedback enters after ``target`` blocks (DESIGN.md §1's span) runs those blocks once per position:
  a pass after the first (``upper``) meets only the ``L - target`` blocks above them (and the head and fusion).
- An objective that reuses a plain prefix of P positions (``reuse_prefix``) runs a pass after the first over the
  positions after it only (each still attending to every key before it).

Training counts every pass the objective runs, step by step (the batch plan of the run replayed: each step's
padded batch B×T, its pass count, the passes with gradients; see :func:`step_flops`). Inference counts what an
answer-only greedy decode needs: the prompt's prefill, then one position per generated token (see
:func:`decode_flops`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fullband.modes import DecodingMode, prefill_of


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the FLOPs of a model depend on."""

    d_model: int
    n_layers: int
    kv_dim: int  # width of k and v (kv heads x head size)
    ffn_dim: int
    vocab_size: int
    target: int = 0  # the blocks below the feedback target, which a pass after the first does not re-run

    @classmethod
    def of(cls, cfg: Any) -> Shape:
        """From a ModelConfig (resolved vocabulary)."""
        return cls(cfg.d_model, cfg.n_layers, cfg.kv_heads * cfg.head_dim, cfg.ffn_dim, cfg.vocab_size,
                   getattr(cfg, "feedback_target", 0))

    def layers(self, upper: bool = False) -> int:
        """The blocks a pass runs: all of them, or (``upper``: a pass after the first) those above the target."""
        return max(0, self.n_layers - self.target) if upper else self.n_layers

    def weights(self, fused: bool, upper: bool = False) -> int:
        """N: the weights one token meets in one pass (the fusion's at a fused position; ``upper``: the blocks above
        the target only)."""
        D = self.d_model
        block = 2 * D * D + 2 * D * self.kv_dim + 3 * D * self.ffn_dim
        return self.layers(upper) * block + self.vocab_size * D + (2 * D * D if fused else 0)


def positions_flops(shape: Shape, first: int, last: int, fused: bool, upper: bool = False) -> float:
    """Forward FLOPs of positions first..last (1-based, inclusive) attending causally to everything before
    (``upper``: a pass after the first, through the blocks above the feedback target only)."""
    if last < first:
        return 0.0
    count = last - first + 1
    position_sum = (first + last) * count / 2
    return 2.0 * shape.weights(fused, upper) * count + 4.0 * shape.layers(upper) * shape.d_model * position_sum


def forward_flops(shape: Shape, T: int, fused: bool, upper: bool = False) -> float:
    """One causal forward over T tokens: 2·N·T + 2·L·D·T·(T+1) (``upper``: a pass after the first)."""
    return positions_flops(shape, 1, T, fused, upper)


def step_flops(shape: Shape, rows: int, T: int, passes: int, *, feedback: bool, grad_passes: int = 0,
               shift: int = 1, exact_passes: int | None = None, reused_prefix: int = 0) -> float:
    """FLOPs of one training step on a padded batch (rows, T), as
    :class:`fullband.training.objective.MultiPassObjective` runs it: pass 1 plain with gradients; then, with
    ``grad_passes`` m > 0, the passes are capped at the exact count (``exact_passes``, T with plain prefix 1), the
    middle ones without gradients (computed sequentially, as one forward, when the cap is reached and the model
    recurs), the last m with; with m = 0 every pass with gradients. Every pass after the first runs the blocks above
    the feedback target only, and (``reused_prefix`` P: the objective's ``reuse_prefix`` on a plain prefix of P
    positions) only the positions after the prefix."""
    plain = forward_flops(shape, T, False)
    whole = forward_flops(shape, T, True, upper=True)
    fused = positions_flops(shape, reused_prefix + 1, T, True, upper=True) if reused_prefix > 1 else whole
    total = 3 * plain
    if feedback and passes > 1:
        if grad_passes > 0:
            exact = T if exact_passes is None else exact_passes
            passes = min(passes, exact)
            first_grad = max(2, passes - grad_passes + 1)
            if shift == 1 and passes == exact and first_grad > 2:
                total += whole  # the fixed point, sequentially: one forward over the positions
            else:
                total += (first_grad - 2) * fused
            total += 3 * (passes - first_grad + 1) * fused
        else:
            total += 3 * (passes - 1) * fused
    return rows * total


def training_flops(run_cfg: Any, lengths: list[int] | None = None) -> float:
    """Training FLOPs of a ``fullband train`` run config, replaying its batch plan (each step's padded length from
    the run's own batches, each step's pass count from its schedule). ``lengths`` (from :func:`batch_lengths`)
    saves rebuilding the batches when several runs share them (the same data, seed and batch size).

    A random plain prefix per row (prefix mixin) is counted as prefix 1: an upper bound on the fused positions
    and on the truncated objective's pass cap."""
    from fullband.data import ByteTokenizer
    from fullband.training.schedule import FeedbackSchedule

    model = run_cfg.model.resolve(ByteTokenizer().vocab_size)
    shape, t = Shape.of(model), run_cfg.train
    lengths = batch_lengths(run_cfg) if lengths is None else lengths
    schedule = FeedbackSchedule(run_cfg.schedule, len(lengths), t.seed, feedback=model.feedback)
    return sum(step_flops(shape, t.batch_size, T, schedule.passes_at(step), feedback=model.feedback,
                          grad_passes=t.grad_passes, shift=model.feedback_shift)
               for step, T in enumerate(lengths))


def batch_lengths(run_cfg: Any) -> list[int]:
    """The padded length T of every training step's batch, from the run's own batch function."""
    from fullband.data import ByteTokenizer
    from fullband.training.run import build_batches

    batch_fn = build_batches(run_cfg, ByteTokenizer(), 1).batch_fn
    return [batch_fn(step, 0, 1)[0].shape[1] for step in range(run_cfg.train.total_steps(1))]


def decode_flops(shape: Shape, prompt_len: int, generated: int, mode: DecodingMode) -> float:
    """FLOPs of one greedy decode in ``mode``: a ``prompt_len`` prompt, ``generated`` tokens (the last one,
    end-of-text, needs no forward). Its registered prefill (:func:`~fullband.modes.prefill_of`) decides, whatever the
    mode is called: no state carried (plain throughout: standard, the baselines), exact (the prompt fully recurrent,
    one position at a time, then fused decoding: each position once), or ``passes`` passes over the prompt carried
    into fused decoding (fused:k, soft)."""
    total = prompt_len + generated - 1
    plan = prefill_of(mode)
    if plan.exact:
        return positions_flops(shape, 1, 1, False) + positions_flops(shape, 2, total, True)
    if not plan.carries:
        return positions_flops(shape, 1, total, False)
    prompt = (positions_flops(shape, 1, prompt_len, False)
              + (plan.passes - 1) * positions_flops(shape, 1, prompt_len, True, upper=True))
    return prompt + positions_flops(shape, prompt_len + 1, total, True)


def looped_decode_flops(shape: Shape, prompt_len: int, generated: int, passes: int) -> float:
    """:func:`decode_flops` of a looped model: ``passes`` passes at every position, counted as an implementation that
    keeps every pass's keys and values would run it, since earlier positions never change, though ours reruns the
    whole sequence per token."""
    total = prompt_len + generated - 1
    return positions_flops(shape, 1, total, False) + (passes - 1) * positions_flops(shape, 1, total, True,
                                                                                    upper=True)


def equal_flops_depth(shape: Shape, target: float, flops_of: Any) -> int:
    """The depth at which a plain model of ``shape``'s width reaches ``target`` training FLOPs: ``flops_of(shape)``
    is affine in the depth, so two evaluations solve it (rounded to the nearest, at least ``shape.n_layers``)."""
    at0 = flops_of(dataclasses.replace(shape, n_layers=0))
    per_layer = flops_of(dataclasses.replace(shape, n_layers=1)) - at0
    return max(shape.n_layers, round((target - at0) / per_layer))
