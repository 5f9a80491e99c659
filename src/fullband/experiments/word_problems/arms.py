"""The arms of ``fullband eval-controls``: how each model is built, what one training step computes, how it answers,
and what that costs in FLOPs (counted as :mod:`fullband.experiments.core.flops` counts them).

Every arm answers a problem of length n at the position of its n-th step (:mod:`fullband.tasks.word_problems`);
each has one knob of its own beside the learning rate and the steps that every arm's grid shares (DESIGN.md §7):

=============  =============================================================  ==========================
arm            model                                                          knob
=============  =============================================================  ==========================
baseline       the plain transformer, one pass                                AdamW weight decay
equal_flops    a plain transformer with the full-bandwidth model's training   deep (more blocks) or wide
               FLOPs per step
looped         the baseline's blocks looped k = c x n times, the token        c, loops per step
               embedding added at every loop (models.LoopedTransformer)
rnn            a GRU or LSTM with the full-bandwidth model's parameter count  the cell
fullband       the full-bandwidth model trained on its exact recurrence (all  lambda, the feedback passes'
               passes, gradients through pass 1 and the last grad_passes),    loss weight
               answering with exact (fully recurrent) prefill
shift0         ablation: the full-bandwidth pass loop with feedback_shift 0,  fullband's chosen lambda
               the pass count of its training at every length
growing_depth  the shift-0 pass loop read at position t after c x t passes    c, passes per step
               (the looped rule): same parameters and fusion as fullband,
               depth that grows with n, no state from the previous position
=============  =============================================================  ==========================

A study may also give an arm a *variant*: study-wide options beside its knob, named in :attr:`Arm.variant_axes` and
spelled ``"position=none,injection=normed"`` (:func:`parse_variant`): ``position`` (every transformer arm: ``rope``
or ``none``, the model's ``position_encoding``) and ``injection`` (looped: ``raw`` or ``normed``). The empty variant
is each axis's first value, the arms as ``fullband eval-controls`` trains them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import torch
from torch import nn

from fullband.config import ModelConfig
from fullband.experiments.core.flops import Shape, equal_flops_depth, forward_flops, positions_flops, step_flops
from fullband.experiments.word_problems.config import ControlsConfig
from fullband.experiments.word_problems.models import (
    INJECTIONS,
    RNNLM,
    AttentionThenLSTM,
    LoopedTransformer,
    growing_depth_logits,
    matched_hybrid_hidden,
    matched_rnn_hidden,
    meta_parameters,
    rnn_parameters,
)
from fullband.model import FullBandwidthLM
from fullband.model.recurrence import ntp_loss
from fullband.tasks.word_problems import WordBatch, WordProblems
from fullband.training.objective import MultiPassObjective
from fullband.training.optim import fusion_names, param_groups

POSITIONS = ("rope", "none")  # fullband.config.POSITION_ENCODINGS
VARIANT_VALUES: dict[str, tuple[str, ...]] = {"position": POSITIONS, "injection": INJECTIONS}  # first = default


def parse_variant(variant: str) -> dict[str, str]:
    """``"position=none,injection=normed"`` -> ``{"position": "none", "injection": "normed"}`` ("" -> {})."""
    out = {}
    for item in filter(None, variant.split(",")):
        key, _, value = item.partition("=")
        if key not in VARIANT_VALUES or value not in VARIANT_VALUES[key]:
            raise ValueError(f"unknown variant {item!r}: axes and values are {VARIANT_VALUES}")
        out[key] = value
    return out


def variant_name(values: dict[str, str]) -> str:
    """The spelling of a variant (:func:`parse_variant`'s inverse, axes in a fixed order)."""
    return ",".join(f"{axis}={values[axis]}" for axis in VARIANT_VALUES if axis in values)


class Arm:
    """One model of the study. ``knob`` is a value of :meth:`knobs`; tokens and labels are a
    :class:`~fullband.tasks.word_problems.WordBatch`'s (n + 2 positions: start cup, n steps, END). ``variant``: the
    study-wide options of :attr:`variant_axes` (see the module docstring)."""

    name: ClassVar[str]
    title: ClassVar[str]
    knob_name: ClassVar[str]
    other_modes: ClassVar[tuple[str, ...]] = ()  # other ways the same model answers, scored beside its own
    variant_axes: ClassVar[tuple[str, ...]] = ("position",)  # the options a study may vary beside the knob

    def __init__(self, cfg: ControlsConfig, problems: WordProblems, variant: str = "") -> None:
        self.cfg = cfg
        self.problems = problems
        # Tokens of a training problem: a lookup problem's table and separator (its mean, when K varies) first.
        self.train_prefix = problems.mean_prefix
        self.train_T = cfg.train_length + 2 + round(self.train_prefix)
        values = parse_variant(variant)
        if unknown := set(values) - set(self.variant_axes):
            raise ValueError(f"arm {self.name} has no variant axis {sorted(unknown)} (its axes: {self.variant_axes})")
        self.variant = variant_name(values)
        self.position = values.get("position", POSITIONS[0])
        self.injection = values.get("injection", INJECTIONS[0])

    def knobs(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def build(self, knob: Any) -> nn.Module:
        raise NotImplementedError

    def optimizer_groups(self, model: nn.Module, knob: Any) -> list[dict]:
        """AdamW's parameter groups (weight decay on the matrices, as ``fullband train``)."""
        return param_groups(model.named_parameters(), 0.0)

    def loss(self, model: nn.Module, batch: WordBatch, knob: Any, step: int = 0) -> torch.Tensor:
        """The training loss of one batch (``step``: the training step, for an arm whose objective draws from it)."""
        return ntp_loss(self.logits(model, batch.tokens, knob, batch.prefix), batch.labels)

    def logits(self, model: nn.Module, tokens: torch.Tensor, knob: Any, prefix: int = 0) -> torch.Tensor:
        """(B, T, V): each position's prediction as the arm answers (its decoding); ``prefix``: tokens before the
        start cup (a lookup problem's table and separator)."""
        raise NotImplementedError

    def mode_logits(self, mode: str, model: nn.Module, tokens: torch.Tensor, prefix: int = 0) -> torch.Tensor:
        """(B, T, V): the prediction of one of :attr:`other_modes`."""
        raise NotImplementedError

    def shape(self, knob: Any) -> Shape | None:
        return None

    def train_flops(self, knob: Any) -> float:
        """FLOPs of one training step (``batch_size`` problems of ``train_length`` steps)."""
        raise NotImplementedError

    def inference_flops(self, knob: Any, n: int, prefix: int = 0) -> float:
        """FLOPs of answering one problem of ``n`` steps (``prefix`` tokens, the start cup and n steps read, no
        END)."""
        raise NotImplementedError

    def model_config(self, **changes: Any) -> ModelConfig:
        """The transformers' shared shape (plain unless ``changes`` say otherwise), long enough for every test."""
        cfg = self.cfg
        shared = dict(vocab_size=self.problems.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
                      n_heads=cfg.n_heads, max_seq_len=self.problems.max_tokens(cfg.max_test_length), feedback=False,
                      position_encoding=self.position)
        return ModelConfig(**(shared | changes))

    def describe(self, knob: Any) -> str:
        return self.with_variant(f"{self.knob_name} {knob}")

    def with_variant(self, text: str) -> str:
        """``text`` (what the knob made) with the variant's values ("RoPE" or "NoPE", "normed injection"), when the
        arm has one (eval-controls' arms have none and read as they did)."""
        values = parse_variant(self.variant)
        notes = [{"rope": "RoPE", "none": "NoPE"}[values["position"]]] if "position" in values else []
        notes += [f"{values['injection']} injection"] if "injection" in values else []
        return ", ".join([text, *notes])


class Transformer(Arm):
    """A plain transformer answering in one pass (standard decoding)."""

    def plain_config(self, knob: Any) -> ModelConfig:
        return self.model_config()

    def build(self, knob: Any) -> nn.Module:
        return FullBandwidthLM(self.plain_config(knob))

    def loss(self, model: nn.Module, batch: WordBatch, knob: Any, step: int = 0) -> torch.Tensor:
        return MultiPassObjective()(model, batch.tokens, batch.labels).loss

    def logits(self, model: nn.Module, tokens: torch.Tensor, knob: Any, prefix: int = 0) -> torch.Tensor:
        return model(tokens).logits

    def shape(self, knob: Any) -> Shape:
        return Shape.of(self.plain_config(knob))

    def train_flops(self, knob: Any) -> float:
        return step_flops(self.shape(knob), self.cfg.batch_size, self.train_T, 1, feedback=False)

    def inference_flops(self, knob: Any, n: int, prefix: int = 0) -> float:
        return forward_flops(self.shape(knob), prefix + n + 1, False)

    def describe(self, knob: Any) -> str:
        s = self.shape(knob)
        return self.with_variant(f"{s.n_layers} blocks x d_model {s.d_model}")


class Baseline(Transformer):
    name, title, knob_name = "baseline", "baseline", "weight decay"

    def knobs(self) -> tuple[Any, ...]:
        return self.cfg.weight_decays

    def optimizer_groups(self, model: nn.Module, knob: Any) -> list[dict]:
        return param_groups(model.named_parameters(), knob)

    def describe(self, knob: Any) -> str:
        return self.with_variant(f"weight decay {knob:g}")


class FullBandwidth(Arm):
    """The full-bandwidth model trained on every pass up to its exact count (plain prefix 1: pass 1 plain, then the
    recurrence), gradients through pass 1 and the last ``grad_passes`` (from the sequential fixed point when more
    passes run), answering with exact prefill: the fully recurrent states."""

    name, title, knob_name = "fullband", "full-bandwidth (exact)", "lambda"

    def knobs(self) -> tuple[Any, ...]:
        return self.cfg.feedback_weights

    def config(self) -> ModelConfig:
        # The study's span (eval-controls' feedback_source / feedback_target; the full-bandwidth default elsewhere)
        span = {name: getattr(self.cfg, name) for name in ("feedback_source", "feedback_target") if hasattr(self.cfg,
                                                                                                          name)}
        return self.model_config(feedback=True, **span)

    def build(self, knob: Any) -> nn.Module:
        return FullBandwidthLM(self.config())

    def optimizer_groups(self, model: nn.Module, knob: Any) -> list[dict]:
        return param_groups(model.named_parameters(), 0.0, self.cfg.fusion_lr_mult, fusion_names(model))

    def loss(self, model: nn.Module, batch: WordBatch, knob: Any, step: int = 0) -> torch.Tensor:
        # The start cup and what comes before it are plain; passes beyond the exact count change nothing.
        exact = batch.tokens.shape[1] - batch.prefix
        objective = MultiPassObjective(feedback_weight=knob, grad_passes=self.cfg.grad_passes, reuse_prefix=True)
        return objective(model, batch.tokens, batch.labels, exact, batch.prefix + 1).loss

    def logits(self, model: nn.Module, tokens: torch.Tensor, knob: Any, prefix: int = 0) -> torch.Tensor:
        return model.forward_exact(tokens, plain_prefix=prefix + 1, method="sequential").logits

    other_modes = ("standard",)  # the same model without feedback (one plain pass): what its recurrence adds

    def mode_logits(self, mode: str, model: nn.Module, tokens: torch.Tensor, prefix: int = 0) -> torch.Tensor:
        return model(tokens).logits  # standard

    def shape(self, knob: Any) -> Shape:
        return Shape.of(self.config())

    def train_flops(self, knob: Any) -> float:
        T = self.train_T
        exact = T - round(self.train_prefix)
        return step_flops(self.shape(knob), self.cfg.batch_size, T, exact, feedback=True,
                          grad_passes=self.cfg.grad_passes, exact_passes=exact, reused_prefix=self.reused_prefix)

    @property
    def reused_prefix(self) -> int:
        """The plain prefix whose keys and values the passes after the first reuse (MultiPassObjective's
        ``reuse_prefix``: a table before the start cup; 1 in plain word problems, where nothing is reused)."""
        return round(self.train_prefix) + 1

    def inference_flops(self, knob: Any, n: int, prefix: int = 0) -> float:
        s = self.shape(knob)  # the plain prefix and the start cup once, then each step fused
        return positions_flops(s, 1, prefix + 1, False) + positions_flops(s, prefix + 2, prefix + n + 1, True)

    def describe(self, knob: Any) -> str:
        return self.with_variant(f"lambda {knob:g}")


class Shift0(FullBandwidth):
    """Ablation: the pass loop with feedback_shift 0 (pass k fuses a position's own state from pass k-1), trained
    as the full-bandwidth model and answering with its training's pass count at every length."""

    name, title, knob_name = "shift0", "shift-0 ablation", "lambda"
    other_modes = ()

    def config(self) -> ModelConfig:
        return self.model_config(feedback=True, feedback_shift=0)

    def logits(self, model: nn.Module, tokens: torch.Tensor, knob: Any, prefix: int = 0) -> torch.Tensor:
        return model(tokens, passes=self.train_T, plain_prefix=prefix + 1).logits

    def train_flops(self, knob: Any) -> float:
        T = self.train_T
        return step_flops(self.shape(knob), self.cfg.batch_size, T, T, feedback=True,
                          grad_passes=self.cfg.grad_passes, shift=0)

    def inference_flops(self, knob: Any, n: int, prefix: int = 0) -> float:
        s = self.shape(knob)
        return forward_flops(s, prefix + n + 1, False) + (self.train_T - 1) * forward_flops(s, prefix + n + 1, True)


class EqualFlops(Transformer):
    """A plain transformer whose training FLOPs per step equal the full-bandwidth model's: d_model wide and as deep
    as needed (``deep``), or n_layers deep and as wide as needed in steps of 2 x n_heads (``wide``)."""

    name, title, knob_name = "equal_flops", "equal-FLOPs transformer", "shape"

    def knobs(self) -> tuple[Any, ...]:
        return self.cfg.equal_flops_shapes

    def plain_config(self, knob: Any) -> ModelConfig:
        cfg = self.cfg
        target = FullBandwidth(cfg, self.problems).train_flops(None)
        base = self.model_config()

        def cost(shape: Shape) -> float:
            return step_flops(shape, cfg.batch_size, self.train_T, 1, feedback=False)

        if knob == "deep":
            return dataclasses.replace(base, n_layers=equal_flops_depth(Shape.of(base), target, cost))
        unit = 2 * cfg.n_heads  # heads of even size (RoPE)
        widths = range(cfg.d_model, 16 * cfg.d_model + 1, unit)
        width = min(widths, key=lambda d: abs(cost(Shape.of(dataclasses.replace(base, d_model=d))) - target))
        return dataclasses.replace(base, d_model=width)


class Looped(Arm):
    name, title, knob_name = "looped", "looped (input injection)", "loops per step"
    variant_axes = ("position", "injection")

    def knobs(self) -> tuple[Any, ...]:
        return self.cfg.loops_per_step

    def build(self, knob: Any) -> nn.Module:
        return LoopedTransformer(self.model_config(), knob, self.injection)

    def logits(self, model: nn.Module, tokens: torch.Tensor, knob: Any, prefix: int = 0) -> torch.Tensor:
        # END carries no answer: leave it out, so the last step's loop count is the longest run.
        out = model(tokens[:, :-1], prefix)
        return torch.cat((out, out.new_zeros(out.shape[0], 1, out.shape[2])), dim=1)

    def shape(self, knob: Any) -> Shape:
        return Shape.of(self.model_config())

    def train_flops(self, knob: Any) -> float:
        loops = knob * self.cfg.train_length
        return self.cfg.batch_size * 3 * loops * forward_flops(self.shape(knob), self.train_T - 1, False)

    def inference_flops(self, knob: Any, n: int, prefix: int = 0) -> float:
        return knob * n * forward_flops(self.shape(knob), prefix + n + 1, False)

    def describe(self, knob: Any) -> str:
        return self.with_variant(f"k = {knob} x n")


class GrowingDepth(Arm):
    """DESIGN.md §7's growing-depth ablation: the full-bandwidth model's parameters and fusion with
    ``feedback_shift`` 0 (pass k fuses a position's own state from pass k-1), position t read after c x t passes by
    the looped rule in training and answering, gradients through every pass. What it lacks beside the
    full-bandwidth model is only the state from the previous position."""

    name, title, knob_name = "growing_depth", "shift-0, depth grows with n", "passes per step"

    def knobs(self) -> tuple[Any, ...]:
        return self.cfg.loops_per_step

    def config(self) -> ModelConfig:
        return self.model_config(feedback=True, feedback_shift=0)

    def build(self, knob: Any) -> nn.Module:
        return FullBandwidthLM(self.config())

    def optimizer_groups(self, model: nn.Module, knob: Any) -> list[dict]:
        return param_groups(model.named_parameters(), 0.0, self.cfg.fusion_lr_mult, fusion_names(model))

    def logits(self, model: nn.Module, tokens: torch.Tensor, knob: Any, prefix: int = 0) -> torch.Tensor:
        # END carries no answer: leave it out, so the last step's pass count is the longest run (as looped).
        out = growing_depth_logits(model, tokens[:, :-1], knob, prefix)
        return torch.cat((out, out.new_zeros(out.shape[0], 1, out.shape[2])), dim=1)

    def shape(self, knob: Any) -> Shape:
        return Shape.of(self.config())

    def train_flops(self, knob: Any) -> float:
        s, T, passes = self.shape(knob), self.train_T - 1, knob * self.cfg.train_length
        return self.cfg.batch_size * 3 * (forward_flops(s, T, False) + (passes - 1) * forward_flops(s, T, True))

    def inference_flops(self, knob: Any, n: int, prefix: int = 0) -> float:
        s, T = self.shape(knob), prefix + n + 1
        return forward_flops(s, T, False) + (knob * n - 1) * forward_flops(s, T, True)

    def describe(self, knob: Any) -> str:
        return self.with_variant(f"c = {knob} (passes = c x n)")


class RNN(Arm):
    name, title, knob_name = "rnn", "RNN (reference)", "cell"
    variant_axes = ()

    def knobs(self) -> tuple[Any, ...]:
        return self.cfg.rnn_cells

    def hidden(self, cell: str) -> int:
        return matched_rnn_hidden(self.problems.vocab_size, cell, full_bandwidth_parameters(self))

    def build(self, knob: Any) -> nn.Module:
        return RNNLM(self.problems.vocab_size, self.hidden(knob), knob)

    def logits(self, model: nn.Module, tokens: torch.Tensor, knob: Any, prefix: int = 0) -> torch.Tensor:
        return model(tokens)

    def token_flops(self, knob: Any) -> float:
        """Forward FLOPs of one token: the cell's gate matrices and the head."""
        H, gates = self.hidden(knob), {"gru": 3, "lstm": 4}[knob]
        return 2.0 * (gates * 2 * H * H + H * self.problems.vocab_size)

    def train_flops(self, knob: Any) -> float:
        return self.cfg.batch_size * self.train_T * 3 * self.token_flops(knob)

    def inference_flops(self, knob: Any, n: int, prefix: int = 0) -> float:
        return (prefix + n + 1) * self.token_flops(knob)

    def describe(self, knob: Any) -> str:
        H = self.hidden(knob)
        return f"{knob.upper()}, hidden {H} ({rnn_parameters(self.problems.vocab_size, H, knob):,} parameters)"


class WideLSTM(RNN):
    """An LSTM as wide as the full-bandwidth model's training FLOPs allow (eval-recall): the most an RNN can be
    given for the same training compute, whatever its parameter count."""

    name, title, knob_name = "wide_lstm", "LSTM, equal training FLOPs", "cell"

    def knobs(self) -> tuple[Any, ...]:
        return ("lstm",)

    def hidden(self, cell: str) -> int:
        # Sized on the full task in every variant: the diagnostic variants (compose-only has no table, so shorter
        # problems) train the same LSTM, at the learning rate chosen for it on the full task.
        problems = self.problems
        if getattr(problems, "variant", "full") != "full":
            problems = dataclasses.replace(problems, variant="full")
        full = FullBandwidth(self.cfg, problems)
        target = full.train_flops(None)
        per_token = self.cfg.batch_size * full.train_T * 3 * 2.0  # train_flops = this x (8 H^2 + H V)
        a, b = 8 * per_token, self.problems.vocab_size * per_token
        return max(1, round((-b + math.sqrt(b * b + 4 * a * target)) / (2 * a)))


class Hybrid(Arm):
    """Attention then recurrence (eval-recall): the transformer's embedding and blocks, whose outputs feed a
    one-layer LSTM as wide as the full-bandwidth model's parameter count allows (models.AttentionThenLSTM). The knob
    is the number of blocks before the LSTM: more attention, or a wider LSTM."""

    name, title, knob_name = "hybrid", "attention then LSTM", "blocks"

    def knobs(self) -> tuple[Any, ...]:
        return tuple(range(1, self.cfg.n_layers + 1))

    def blocks_config(self, knob: Any) -> ModelConfig:
        return self.model_config(n_layers=knob)

    def hidden(self, knob: Any) -> int:
        return matched_hybrid_hidden(self.blocks_config(knob), full_bandwidth_parameters(self))

    def build(self, knob: Any) -> nn.Module:
        return AttentionThenLSTM(self.blocks_config(knob), self.hidden(knob))

    def logits(self, model: nn.Module, tokens: torch.Tensor, knob: Any, prefix: int = 0) -> torch.Tensor:
        return model(tokens)

    def shape(self, knob: Any) -> Shape:
        return Shape.of(self.blocks_config(knob))

    def token_flops(self, knob: Any) -> float:
        """Forward FLOPs of one token in the LSTM and its head (the blocks are counted as a transformer's)."""
        H = self.hidden(knob)
        return 2.0 * (4 * (self.cfg.d_model * H + H * H) + H * self.problems.vocab_size)

    def train_flops(self, knob: Any) -> float:
        blocks = dataclasses.replace(self.shape(knob), vocab_size=0)  # the blocks' head is the LSTM's
        return (step_flops(blocks, self.cfg.batch_size, self.train_T, 1, feedback=False)
                + self.cfg.batch_size * self.train_T * 3 * self.token_flops(knob))

    def inference_flops(self, knob: Any, n: int, prefix: int = 0) -> float:
        T = prefix + n + 1
        return forward_flops(dataclasses.replace(self.shape(knob), vocab_size=0), T, False) + T * self.token_flops(knob)

    def describe(self, knob: Any) -> str:
        return self.with_variant(f"{knob} block{'s' * (knob > 1)} x d_model {self.cfg.d_model}, then an LSTM of "
                                 f"{self.hidden(knob)}")


PAPER_PASS_MIX = {2: 0.45, 3: 0.35, 4: 0.15, 8: 0.05}  # the paper's few passes, a small share of deeper ones
PAPER_JITTER = 0.02  # the paper's (DESIGN.md §3)


class FullBandwidthPaper(FullBandwidth):
    """The full-bandwidth model trained with the paper's schedule (eval-recall): each step a few Jacobi passes
    (:data:`PAPER_PASS_MIX`, drawn per step from the seed and the step), every pass scored and with gradients,
    jitter on the carried states, not the exact count; answering as :class:`FullBandwidth` does, with exact
    (fully recurrent) prefill. Training stays parallel: its passes do not grow with n."""

    name, title, knob_name = "fullband_paper", "full-bandwidth (paper schedule)", "lambda"

    def passes_at(self, step: int) -> int:
        """The pass count of training step ``step`` (the same for every seed: the schedule is not a seed's)."""
        draw = torch.rand((), generator=torch.Generator().manual_seed(7_919 * step + 13)).item()
        total = 0.0
        for passes, share in PAPER_PASS_MIX.items():
            total += share
            if draw < total:
                return passes
        return max(PAPER_PASS_MIX)

    def loss(self, model: nn.Module, batch: WordBatch, knob: Any, step: int = 0) -> torch.Tensor:
        objective = MultiPassObjective(feedback_weight=knob, jitter=PAPER_JITTER, reuse_prefix=True)
        return objective(model, batch.tokens, batch.labels, self.passes_at(step), batch.prefix + 1).loss

    def train_flops(self, knob: Any) -> float:
        mean = sum(passes * share for passes, share in PAPER_PASS_MIX.items())  # step_flops is linear in the passes
        T, reused = self.train_T, self.reused_prefix
        return step_flops(self.shape(knob), self.cfg.batch_size, T, 1, feedback=True) + (mean - 1) * (
            step_flops(self.shape(knob), self.cfg.batch_size, T, 2, feedback=True, reused_prefix=reused)
            - step_flops(self.shape(knob), self.cfg.batch_size, T, 1, feedback=True))


def full_bandwidth_parameters(arm: Arm) -> int:
    """The full-bandwidth model's parameter count in ``arm``'s study (:func:`meta_parameters`: the RNN and hybrid arms
    ask at every width and FLOP count)."""
    return meta_parameters(FullBandwidth(arm.cfg, arm.problems).config(), FullBandwidthLM)


ARM_TYPES: dict[str, type[Arm]] = {a.name: a for a in (Baseline, EqualFlops, Looped, RNN, FullBandwidth, Shift0,
                                                       GrowingDepth, WideLSTM, Hybrid, FullBandwidthPaper)}


def make_arm(name: str, cfg: ControlsConfig, problems: WordProblems, variant: str = "") -> Arm:
    return ARM_TYPES[name](cfg, problems, variant)
