"""The decoding modes of DESIGN.md §4 as one value, parsed once, and the one map from a mode to its prefill.

A mode is what a user types (``standard``, ``soft``, ``fused``, ``fused:k``, ``exact``); every consumer
(generation, the server, transformers' generate, lm-eval scoring, the studies) parses it with
:meth:`DecodingMode.parse` and asks :func:`prefill_of` how the prompt is processed, instead of comparing strings.
The older spelling ``mode="fused"`` with a separate ``prefill_passes=k`` parses to the same value as ``fused:k``.

The names the studies write into results.json and their reports are properties of the value, so they stay the
strings the committed reports hold: :attr:`DecodingMode.result_key` (``standard``, ``fused2``, ``exact``) and
:attr:`DecodingMode.label` (``fused(2)``). Torch-free: the command line checks a mode before importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from fullband.config import DECODING_MODES, ConfigError, _is_int, _require

NAMES = DECODING_MODES  # ("standard", "soft", "fused", "exact")
MODE_PATTERN = "^(standard|soft|fused(:[0-9]+)?|exact)$"  # every spelling parse() takes (the server's schema)
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


def validate_decoding_options(
    mode: str | DecodingMode, prefill_passes: int, temperature: float, top_k: int, top_p: float,
    max_new_tokens: int, exact_chunk_size: int,
) -> DecodingMode:
    """Checks shared by ``generate()``, ``fullband generate``, ``fullband serve`` and transformers' generate; the
    parsed mode."""
    _require(_is_int(prefill_passes) and prefill_passes >= 0, "prefill_passes", prefill_passes,
             "must be an integer >= 0 (extra fused prompt passes in fused mode)")
    parsed = DecodingMode.parse(mode, prefill_passes)
    _require(isinstance(temperature, (int, float)) and temperature >= 0, "temperature", temperature,
             "must be >= 0 (0 = greedy)")
    _require(_is_int(top_k) and top_k >= 0, "top_k", top_k, "must be an integer >= 0 (0 = off)")
    _require(isinstance(top_p, (int, float)) and 0 < top_p <= 1, "top_p", top_p, "must be in (0, 1]")
    _require(_is_int(max_new_tokens) and max_new_tokens >= 0, "max_new_tokens", max_new_tokens,
             "must be an integer >= 0")
    _require(_is_int(exact_chunk_size) and exact_chunk_size >= 1, "exact_chunk_size", exact_chunk_size,
             "must be an integer >= 1 (1 = sequential)")
    return parsed
