"""The decoding modes of DESIGN.md §4 as one value, parsed once, the one map from a mode to its prefill, and how
to decode (:class:`DecodeOptions`: a mode plus the sampling settings).

A mode is what a user types (``standard``, ``soft``, ``fused``, ``fused:k``, ``exact``); every consumer
(generation, the server, transformers' generate, lm-eval scoring, the studies) parses it with
:meth:`DecodingMode.parse` and asks :func:`prefill_of` how the prompt is processed, instead of comparing strings.
The older spelling ``mode="fused"`` with a separate ``prefill_passes=k`` parses to the same value as ``fused:k``.
The mode names and the default modes are defined here and nowhere else.

:class:`DecodeOptions` is the ``[decode]`` section of ``fullband generate``, ``serve`` and ``eval`` and the argument
of the decoding functions (``fullband.generation``), the looped and speculative decoders and the server's requests.

The names the studies write into results.json and their reports are properties of the value, so they stay the
strings the committed reports hold: :attr:`DecodingMode.result_key` (``standard``, ``fused2``, ``exact``) and
:attr:`DecodingMode.label` (``fused(2)``). Torch-free: the command line checks a mode before importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from fullband.config import ConfigError, _is_int, _require, doc

# The inference modes of DESIGN.md §4, and the defaults of every entry point.
NAMES = DECODING_MODES = ("standard", "soft", "fused", "exact")
# Decoding (generate / stream, `fullband generate` and `serve`, transformers' generate()): soft, the mode DESIGN.md §5
# shows and the cheapest one that uses the feedback (plain prompt, fused generated tokens).
DEFAULT_MODE = "soft"
# Scoring a given text (`fullband eval`, the lm-eval model, a transformers forward without a decoding state):
# standard, one plain pass, the number every other tool gives for the same network.
DEFAULT_SCORE_MODE = "standard"
MODE_PATTERN = "^(standard|soft|fused(:[0-9]+)?|exact)$"  # every spelling parse() takes (the server's schema)
DECODE_STEPS = ("eager", "static", "compiled")  # DecodeOptions.step (fullband.generation.static)
SPELLINGS = "standard, soft, fused (with prefill_passes), fused:K (K >= 0 extra fused prompt passes), exact"


@dataclass(frozen=True)
class DecodingMode:
    """``name`` is one of :data:`NAMES`; ``passes`` is fused mode's extra fused (Jacobi) passes over the prompt
    (0 for the other modes)."""

    name: str
    passes: int = 0

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ConfigError(f"mode={self.name!r} is invalid: must be one of {SPELLINGS}")
        if not (_is_int(self.passes) and self.passes >= 0):
            raise ConfigError(f"prefill_passes={self.passes!r} is invalid: must be an integer >= 0 (extra fused "
                              "prompt passes in fused mode)")
        if self.name != "fused" and self.passes:
            raise ConfigError(f"mode {self.name!r} takes no prompt passes (got {self.passes}); only fused does")

    @classmethod
    def parse(cls, value: str | DecodingMode, prefill_passes: int = 1, name: str = "mode") -> DecodingMode:
        """The mode a user typed: ``standard | soft | fused | fused:K | exact``. ``prefill_passes`` is the pass
        count of a bare ``fused`` (the older two-option spelling); ``fused:K`` carries its own. ``name`` is the
        option named in the error."""
        if isinstance(value, DecodingMode):
            return value
        text = value
        if isinstance(text, str) and text.startswith("fused:"):
            count = text.removeprefix("fused:")
            if not (count.isascii() and count.isdigit()):
                raise ConfigError(f"{name}={value!r} is invalid: fused:K needs K an integer >= 0 (extra fused "
                                  f"prompt passes); valid modes: {SPELLINGS}")
            return cls("fused", int(count))
        if text not in NAMES:
            raise ConfigError(f"{name}={value!r} is invalid: must be one of {SPELLINGS}")
        return cls(text, prefill_passes if text == "fused" else 0)

    def __str__(self) -> str:
        """The canonical spelling: ``standard``, ``soft``, ``fused:K``, ``exact``."""
        return f"fused:{self.passes}" if self.name == "fused" else self.name

    @property
    def feeds_back(self) -> bool:
        """Whether decoding feeds the carried state into the generated positions (every mode but standard)."""
        return self.name != "standard"

    @property
    def result_key(self) -> str:
        """The key of this mode in a compare study's results (``standard``, ``fusedK``, ``exact``)."""
        return f"fused{self.passes}" if self.name == "fused" else self.name

    @property
    def label(self) -> str:
        """The mode as reports print it (``standard``, ``soft``, ``fused(K)``, ``exact``)."""
        return f"fused({self.passes})" if self.name == "fused" else self.name

    @classmethod
    def from_result_key(cls, key: str) -> DecodingMode:
        """The inverse of :attr:`result_key`."""
        if key.startswith("fused") and key.removeprefix("fused").isascii() and key.removeprefix("fused").isdigit():
            return cls("fused", int(key.removeprefix("fused")))
        return cls.parse(key, name="result key")

    @classmethod
    def from_label(cls, label: str) -> DecodingMode:
        """The inverse of :attr:`label`."""
        if label.startswith("fused(") and label.endswith(")"):
            return cls.parse(f"fused:{label[len('fused('):-1]}", name="label")
        return cls.parse(label, name="label")


STANDARD = DecodingMode("standard")
SOFT = DecodingMode("soft")
EXACT = DecodingMode("exact")


def fused(passes: int) -> DecodingMode:
    """fused(k): ``passes`` extra fused passes over the prompt."""
    return DecodingMode("fused", passes)


@dataclass(frozen=True)
class Prefill:
    """How a mode processes the prompt: ``passes`` whole-prompt passes with the first real token plain and the rest
    fused (1 = one plain pass), or ``passes=None``: the fully recurrent (exact) prompt. ``carries``: whether the
    prompt's last state is carried into decoding."""

    passes: int | None
    carries: bool

    @property
    def exact(self) -> bool:
        return self.passes is None


def prefill_of(mode: DecodingMode) -> Prefill:
    """The one place that says what each mode does with the prompt (DESIGN.md §4)."""
    if mode.name == "exact":
        return Prefill(None, carries=True)
    if mode.name == "fused":
        return Prefill(1 + mode.passes, carries=True)
    return Prefill(1, carries=mode.feeds_back)


def mode_of_prefill(prefill: Prefill) -> DecodingMode:
    """The mode whose prefill is ``prefill`` (one plain pass is soft when it carries its state, else standard): the
    server groups arrivals by their prefill and runs each group's as this mode's."""
    if prefill.exact:
        return EXACT
    if prefill.passes > 1:
        return fused(prefill.passes - 1)
    return SOFT if prefill.carries else STANDARD


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode: the mode and the sampling settings ([decode] of fullband generate, serve and eval)."""

    mode: str = doc(DEFAULT_MODE, "Decoding mode: standard | soft | fused | fused:K | exact (DESIGN.md section 4; "
                    "fused = fused:prefill_passes).")
    prefill_passes: int = doc(1, "fused mode: extra fused (Jacobi) passes over the prompt.")
    exact_chunk_size: int = doc(1, "exact mode: prompt chunk per exact Jacobi solve (1 = sequential).")
    temperature: float = doc(0.0, "Sampling temperature; 0 = greedy.")
    top_k: int = doc(0, "Keep the k most likely tokens (0 = off).")
    top_p: float = doc(1.0, "Nucleus sampling mass (1 = off).")
    seed: int | None = doc(None, "Sampling seed for reproducible draws (none = the global RNG).")
    stop_token_ids: tuple[int, ...] = doc((), "Token ids that end a row, besides the tokenizer's end-of-text where "
                                          "the command stops at it.")
    pad_token_id: int | None = doc(None, "What a stopped row yields while others go on (none = the first stop id, "
                                   "or 0).")
    step: str = doc("eager", "How each token is decoded after the prefill: eager (the model's forward), static (a "
                    "preallocated KV cache and carried state written in place, one shape per decode) or compiled "
                    "(static, through torch.compile; on CUDA replayed as a CUDA graph). Native models; others decode "
                    "eagerly. In `fullband serve` the engine's setting for every decode step.")

    def __post_init__(self) -> None:
        mode = str(self.mode) if isinstance(self.mode, DecodingMode) else self.mode
        object.__setattr__(self, "mode", mode)  # a DecodingMode given: its canonical spelling
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _require(_is_int(self.prefill_passes) and self.prefill_passes >= 0, "prefill_passes", self.prefill_passes,
                 "must be an integer >= 0 (extra fused prompt passes in fused mode)")
        try:
            DecodingMode.parse(mode, self.prefill_passes)
        except ConfigError as err:
            raise ConfigError(str(err), "mode") from None
        _require(_is_int(self.exact_chunk_size) and self.exact_chunk_size >= 1, "exact_chunk_size",
                 self.exact_chunk_size, "must be an integer >= 1 (1 = sequential)")
        _require(_is_real(self.temperature) and self.temperature >= 0, "temperature", self.temperature,
                 "must be >= 0 (0 = greedy)")
        _require(_is_int(self.top_k) and self.top_k >= 0, "top_k", self.top_k, "must be an integer >= 0 (0 = off)")
        _require(_is_real(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        _require(self.seed is None or (_is_int(self.seed) and -(2**63) <= self.seed < 2**64), "seed", self.seed,
                 "must be an integer in -2**63 .. 2**64 - 1 (what torch's seeding takes), or none")
        _require(all(_is_int(t) and t >= 0 for t in self.stop_token_ids), "stop_token_ids", self.stop_token_ids,
                 "must be token ids >= 0")
        _require(self.step in DECODE_STEPS, "step", self.step, f"must be one of {', '.join(DECODE_STEPS)}")
        _require(self.pad_token_id is None or (_is_int(self.pad_token_id) and self.pad_token_id >= 0),
                 "pad_token_id", self.pad_token_id, "must be a token id >= 0, or none")

    @property
    def decoding_mode(self) -> DecodingMode:
        """The parsed mode (``fused`` takes ``prefill_passes``; ``fused:K`` carries its own)."""
        return DecodingMode.parse(self.mode, self.prefill_passes)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def retired_to_decode(*names: str) -> dict[str, str]:
    """A command's flat options that are now keys of its [decode] section, as a config class's ``ALIASES``: given,
    they stop the parse with a line naming ``--decode.NAME`` (fullband.configio)."""
    return {name: f"decode.{name}" for name in names}


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
