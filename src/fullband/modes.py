"""The decoding modes of DESIGN.md §4 as one value, registered in one place (:data:`REGISTRY`), parsed once; how
each prefills the prompt; and how to decode (:class:`DecodeOptions`: a mode plus the sampling settings).

A mode is registered once, as a :class:`ModeSpec` (its name, its prefill, whether it takes a pass count, a line of
help): the built-in ``standard``, ``soft``, ``fused`` and ``exact`` below, and any other with :func:`register_mode`
(docs/architecture.md, "Adding a decoding mode"). Everything that lists or tells modes apart asks the registry:
the names (:func:`mode_names`), the spellings in help texts and errors (:func:`spellings`), the server's schema
pattern (:func:`mode_pattern`), what a mode does with the prompt (:func:`prefill_of`). Generation, the server, the
FLOPs count, transformers' generate and lm-eval scoring name no mode.

What a user types has one spelling per mode: ``standard``, ``soft``, ``fused:K``, ``exact``
(:meth:`DecodingMode.parse`; ``str(mode)`` gives it back). The spellings the studies write into results.json and
their reports are properties of the value, so they stay the committed strings: :attr:`DecodingMode.result_key`
(``fused2``) and :attr:`DecodingMode.label` (``fused(2)``); given as input they are refused with a line naming
the spelling to use, as a bare ``fused`` and the retired ``prefill_passes`` are. Torch-free: the command line checks
a mode before importing torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from fullband.config import ConfigError, doc, is_int, require


@dataclass(frozen=True)
class Prefill:
    """How a mode processes the prompt: ``passes`` whole-prompt passes with the first real token plain and the rest
    fused (1 = one plain pass), or ``passes=None``: the fully recurrent (exact) prompt. ``carries``: whether the
    prompt's last state is carried into decoding (and so whether decoding feeds its states back)."""

    passes: int | None
    carries: bool

    @property
    def exact(self) -> bool:
        return self.passes is None


@dataclass(frozen=True)
class ModeSpec:
    """One decoding mode, as :func:`register_mode` takes it.

    ``name``: what a user types (lower-case letters and ``_``); ``prefill``: the mode's pass argument (``K`` of
    ``NAME:K``, 0 for a mode that takes none) -> its :class:`Prefill`, the one thing consumers ask of a mode;
    ``takes_passes``: spelled ``NAME:K`` (K >= 0) rather than ``NAME``; ``help``: one line for help texts and docs.
    """

    name: str
    prefill: Callable[[int], Prefill]
    takes_passes: bool = False
    help: str = ""

    @property
    def spelling(self) -> str:
        """How a user types it: ``NAME``, or ``NAME:K``."""
        return f"{self.name}:K" if self.takes_passes else self.name


# The modes by name, in registration order (the built-ins first). Read through the functions below.
REGISTRY: dict[str, ModeSpec] = {}
BUILT_IN = ("standard", "soft", "fused", "exact")  # DESIGN.md §4; never unregistered
_NAME = re.compile(r"[a-z](?:[a-z_]*[a-z])?")  # no digits: a results key is NAME + K (fused2)


def register_mode(spec: ModeSpec) -> ModeSpec:
    """Add a decoding mode: generation, the server (its schema too), transformers' generate, lm-eval scoring and
    the FLOPs count take it from then on (docs/architecture.md, "Adding a decoding mode")."""
    if not _NAME.fullmatch(spec.name):
        raise ValueError(f"mode name {spec.name!r}: use lower-case letters and '_' (no digits: a study writes a "
                         "mode with a pass count as NAME + K)")
    if spec.name in REGISTRY:
        raise ValueError(f"mode {spec.name!r} is already registered")
    REGISTRY[spec.name] = spec
    return spec


def unregister_mode(name: str) -> None:
    """Remove a mode :func:`register_mode` added (a test's toy mode); the built-in modes stay."""
    if name in BUILT_IN:
        raise ValueError(f"mode {name!r} is built in (DESIGN.md §4) and stays registered")
    REGISTRY.pop(name, None)


def mode_names() -> tuple[str, ...]:
    """The registered modes' names."""
    return tuple(REGISTRY)


def spellings() -> str:
    """Every registered mode as a user types it, for help texts and errors: ``standard, soft, fused:K, exact``."""
    return ", ".join(spec.spelling for spec in REGISTRY.values())


def mode_pattern() -> str:
    """A regular expression of exactly the spellings :meth:`DecodingMode.parse` takes (the server's schema)."""
    plain = [re.escape(s.name) for s in REGISTRY.values() if not s.takes_passes]
    counted = [f"{re.escape(s.name)}:[0-9]+" for s in REGISTRY.values() if s.takes_passes]
    return f"^({'|'.join(plain + counted)})$"


def mode_help() -> str:
    """One line per registered mode (``--help`` and the docs)."""
    return "; ".join(f"{spec.spelling} = {spec.help}" for spec in REGISTRY.values())


register_mode(ModeSpec("standard", lambda _: Prefill(1, carries=False),
                       help="plain prompt, plain decoding (an ordinary transformer)"))
register_mode(ModeSpec("soft", lambda _: Prefill(1, carries=True), help="plain prompt, fused decoding"))
register_mode(ModeSpec("fused", lambda k: Prefill(1 + k, carries=True), takes_passes=True,
                       help="the prompt gets K >= 0 extra fused (Jacobi) passes, then fused decoding"))
register_mode(ModeSpec("exact", lambda _: Prefill(None, carries=True),
                       help="the prompt fully recurrent, then fused decoding"))

# The built-in modes' names (a study's list of modes to evaluate names them; the live list is mode_names()).
DECODING_MODES = BUILT_IN
# Decoding (generate / stream, `fullband generate` and `serve`, transformers' generate()): soft, the mode DESIGN.md §5
# shows and the cheapest one that uses the feedback (plain prompt, fused generated tokens).
DEFAULT_MODE = "soft"
# Scoring a given text (`fullband eval`, the lm-eval model, a transformers forward without a decoding state):
# standard, one plain pass, the number every other tool gives for the same network.
DEFAULT_SCORE_MODE = "standard"
DECODE_STEPS = ("eager", "static", "compiled")  # DecodeOptions.step (fullband.generation.static)


@dataclass(frozen=True)
class DecodingMode:
    """``name`` is a registered mode; ``passes`` is its pass argument (``K`` of ``fused:K``; 0 for a mode that takes
    none)."""

    name: str
    passes: int = 0

    def __post_init__(self) -> None:
        if self.name not in REGISTRY:
            raise ConfigError(f"mode={self.name!r} is invalid: must be one of {spellings()}")
        if not (is_int(self.passes) and self.passes >= 0):
            raise ConfigError(f"mode {self.name}:{self.passes!r} is invalid: K must be an integer >= 0")
        if self.passes and not self.spec.takes_passes:
            raise ConfigError(f"mode {self.name!r} takes no pass count (got {self.passes}); "
                              f"{', '.join(s.spelling for s in REGISTRY.values() if s.takes_passes)} do")

    @classmethod
    def parse(cls, value: str | DecodingMode, passes: int | None = None, name: str = "mode") -> DecodingMode:
        """The mode a user typed: one of :func:`spellings` (``standard``, ``soft``, ``fused:K``, ``exact``). ``name``
        is the option named in the error.

        ``passes`` is for code that holds a mode's name and its count apart (a study evaluating ``fused`` at several
        counts): the count of a bare ``NAME`` of a mode that takes one (0 or None for the others). Typed input never
        gives it: there a bare ``fused`` is refused with a line naming ``fused:K``, as are the report spellings
        ``fused2`` and ``fused(2)``."""
        if isinstance(value, DecodingMode):
            return value
        if not isinstance(value, str):
            raise ConfigError(f"{name}={value!r} is invalid: must be one of {spellings()}", name)
        head, colon, count = value.partition(":")
        spec = REGISTRY.get(head)
        if spec is None:
            raise ConfigError(_unknown(value, name), name)
        if not colon:
            if spec.takes_passes and passes is None:
                raise ConfigError(f"{name}={value!r} needs its pass count: write {head}:K (K >= 0, e.g. {head}:1)",
                                  name)
            if not spec.takes_passes and passes:
                raise ConfigError(f"{name}={value!r} takes no pass count (got {passes})", name)
            return cls(head, passes if spec.takes_passes else 0)
        if not spec.takes_passes:
            raise ConfigError(f"{name}={value!r} is invalid: {head} takes no pass count; write {head}", name)
        if passes is not None:
            raise ConfigError(f"{name}={value!r} carries its pass count: give no other (got {passes})", name)
        if not (count.isascii() and count.isdigit()):
            raise ConfigError(f"{name}={value!r} is invalid: {head}:K needs K an integer >= 0; valid modes: "
                              f"{spellings()}", name)
        return cls(head, int(count))

    def __str__(self) -> str:
        """The canonical spelling: ``standard``, ``soft``, ``fused:K``, ``exact``."""
        return f"{self.name}:{self.passes}" if self.spec.takes_passes else self.name

    @property
    def spec(self) -> ModeSpec:
        return REGISTRY[self.name]

    @property
    def feeds_back(self) -> bool:
        """Whether decoding feeds the carried state into the generated positions (every built-in mode but
        standard): whether its prefill carries a state."""
        return prefill_of(self).carries

    @property
    def result_key(self) -> str:
        """The key of this mode in a compare study's results (``standard``, ``fusedK``, ``exact``)."""
        return f"{self.name}{self.passes}" if self.spec.takes_passes else self.name

    @property
    def label(self) -> str:
        """The mode as reports print it (``standard``, ``soft``, ``fused(K)``, ``exact``)."""
        return f"{self.name}({self.passes})" if self.spec.takes_passes else self.name

    @classmethod
    def from_result_key(cls, key: str) -> DecodingMode:
        """The inverse of :attr:`result_key` (reading results.json; not a spelling a user types)."""
        report = _report_spelling(key)
        if report is not None and report[1] == "key":
            return report[0]
        return cls.parse(key, name="result key")

    @classmethod
    def from_label(cls, label: str) -> DecodingMode:
        """The inverse of :attr:`label` (reading a report's variant; not a spelling a user types)."""
        report = _report_spelling(label)
        if report is not None and report[1] == "label":
            return report[0]
        return cls.parse(label, name="label")


def _report_spelling(text: str) -> tuple[DecodingMode, str] | None:
    """``fused2`` (a results key) or ``fused(2)`` (a report label) of a mode that takes a count -> (mode, which)."""
    match = re.fullmatch(r"([a-z_]+?)(?:([0-9]+)|\(([0-9]+)\))", text)
    if match is None or match[1] not in REGISTRY or not REGISTRY[match[1]].takes_passes:
        return None
    return DecodingMode(match[1], int(match[2] or match[3])), "key" if match[2] is not None else "label"


def _unknown(value: str, name: str) -> str:
    """The one line refusing ``value``: the canonical spelling where it is a report's spelling of a mode, else the
    valid ones."""
    report = _report_spelling(value)
    if report is not None:
        return f"{name}={value!r} is how reports name a mode, not a spelling it takes: write {report[0]}"
    return f"{name}={value!r} is invalid: must be one of {spellings()}"


STANDARD = DecodingMode("standard")
SOFT = DecodingMode("soft")
EXACT = DecodingMode("exact")


def fused(passes: int) -> DecodingMode:
    """fused:k: ``passes`` extra fused passes over the prompt."""
    return DecodingMode("fused", passes)


def prefill_of(mode: DecodingMode) -> Prefill:
    """What ``mode`` does with the prompt (DESIGN.md §4): its registered prefill."""
    return mode.spec.prefill(mode.passes)


# Options retired from [decode], with what replaced each (fullband.configio refuses them in one line naming it).
RETIRED_DECODE_KEYS = {"prefill_passes": "mode fused:K"}


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode: the mode and the sampling settings ([decode] of fullband generate, serve and eval)."""

    RETIRED: ClassVar[dict[str, str]] = RETIRED_DECODE_KEYS

    mode: str = doc(DEFAULT_MODE, f"Decoding mode (DESIGN.md section 4): {mode_help()}.")
    exact_chunk_size: int = doc(1, "exact mode: prompt chunk per exact Jacobi solve (1 = sequential).")
    temperature: float = doc(0.0, "Sampling temperature; 0 (or below float32's smallest normal number) = greedy.")
    top_k: int = doc(0, "Keep the k most likely tokens (0 = off).")
    top_p: float = doc(1.0, "Nucleus sampling mass (1 = off).")
    seed: int | None = doc(None, "Sampling seed for reproducible draws: any integer, read modulo 2**64 as torch reads "
                           "a seed (none = the global RNG).")
    stop_token_ids: tuple[int, ...] = doc((), "Token ids that end a row, besides the tokenizer's end-of-text where "
                                          "the command stops at it.")
    pad_token_id: int | None = doc(None, "What a stopped row yields while others go on (none = the first stop id, "
                                   "or 0).")
    step: str = doc("eager", "How each token is decoded after the prefill: eager (the model's forward), static (a "
                    "preallocated KV cache and carried state written in place, one shape per decode) or compiled "
                    "(static, through torch.compile; on CUDA replayed as a CUDA graph; on a CPU the fastest at batch "
                    "1, after seconds of compiling). Native models; others decode eagerly. In `fullband serve` the "
                    "engine's setting for every decode step.")

    def __post_init__(self) -> None:
        mode = str(self.mode) if isinstance(self.mode, DecodingMode) else self.mode
        object.__setattr__(self, "mode", mode)  # a DecodingMode given: its canonical spelling
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        try:
            DecodingMode.parse(mode)  # typed input: the canonical spellings only
        except ConfigError as err:
            raise ConfigError(str(err), "mode") from None
        require(is_int(self.exact_chunk_size) and self.exact_chunk_size >= 1, "exact_chunk_size",
                self.exact_chunk_size, "must be an integer >= 1 (1 = sequential)")
        require(_is_real(self.temperature) and self.temperature >= 0, "temperature", self.temperature,
                "must be >= 0 (0 = greedy)")
        require(is_int(self.top_k) and self.top_k >= 0, "top_k", self.top_k, "must be an integer >= 0 (0 = off)")
        require(_is_real(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        require(self.seed is None or is_int(self.seed), "seed", self.seed, "must be an integer, or none")
        require(all(is_int(t) and t >= 0 for t in self.stop_token_ids), "stop_token_ids", self.stop_token_ids,
                "must be token ids >= 0")
        require(self.step in DECODE_STEPS, "step", self.step, f"must be one of {', '.join(DECODE_STEPS)}")
        require(self.pad_token_id is None or (is_int(self.pad_token_id) and self.pad_token_id >= 0),
                "pad_token_id", self.pad_token_id, "must be a token id >= 0, or none")

    @property
    def decoding_mode(self) -> DecodingMode:
        """The parsed mode."""
        return DecodingMode.parse(self.mode)


def torch_seed(seed: int) -> int:
    """What a seed seeds: torch's ``manual_seed`` takes -2**63 .. 2**64 - 1 and reads it modulo 2**64, so every
    integer is read that way (the server's schema then needs no bounds that a JSON reader could round)."""
    return seed % 2**64


def retired_to_decode(*names: str) -> dict[str, str]:
    """A command's flat options that are now keys of its [decode] section, as a config class's ``ALIASES``: given,
    they stop the parse with a line naming ``--decode.NAME`` (fullband.configio), or for a key retired from [decode]
    itself what replaced it (``--prefill_passes`` -> ``--decode.mode fused:K``)."""
    return {name: f"decode.{RETIRED_DECODE_KEYS.get(name, name)}" for name in names}


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
