"""ModelConfig and what every config shares: validation helpers, the decoding mode names and defaults, the preset
mechanism. The other configs live beside the code they configure: fullband.training.config (``fullband train``),
fullband.generation.config (``fullband generate``), fullband.experiments.<study>.config (the studies),
fullband.evaluation.config (``fullband eval``).

Every field carries a ``help`` string in its metadata; the CLI builds its ``--help`` from it. Bad values
raise :class:`ConfigError` naming the field and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fullband import rundir
from fullband.files import write_json


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; ``field`` names the option, where one is at fault
    (the server answers a bad request field with it)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def doc(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with a default and a help text (shown by ``fullband <cmd> --help``)."""
    return field(default=default, metadata={"help": help}, **kwargs)


FEEDBACK_SOURCES = ("residual", "normed")
FUSIONS = ("glu_cross",)
GATE_NORMS = ("own", "shared")
# Which stack inputs the input RMSNorm sees (DESIGN.md §1): fused only; the paper's literal code; every input.
INPUT_NORMS = ("fused", "paper", "all")
# forward_exact's methods; auto = fullband.model.recurrence.auto_exact_method's choice for the device
EXACT_METHODS = ("auto", "sequential", "chunked", "jacobi")
# Positional encoding of the attention (DESIGN.md §1): rotary on queries and keys, or none at all (NoPE).
POSITION_ENCODINGS = ("rope", "none")


@dataclass
class ModelConfig:
    """Architecture of a full-bandwidth transformer (``feedback=False`` gives the plain baseline)."""

    vocab_size: int = doc(256, "Number of token ids.")
    d_model: int = doc(256, "Width D of the residual stream.")
    n_layers: int = doc(4, "Number of transformer blocks L.")
    n_heads: int = doc(4, "Attention heads (query).")
    n_kv_heads: int | None = doc(None, "Key/value heads for grouped-query attention; None = n_heads.")
    d_ff: int | None = doc(None, "Hidden width of the SwiGLU MLP; None = 8/3 * d_model rounded up to 64.")
    max_seq_len: int = doc(1024, "Longest sequence (prompt + generated) the model accepts.")
    position_encoding: str = doc(
        "rope",
        "rope = rotary position embedding (RoPE) on queries and keys; none = no positional encoding (NoPE, "
        "Kazemnejad et al. 2023, 'The impact of positional encoding on length generalization in transformers'): "
        "attention is causal, so position is still inferable.",
    )
    rope_theta: float = doc(10000.0, "RoPE base frequency (read only with position_encoding='rope').")
    norm_eps: float = doc(1e-5, "RMSNorm epsilon.")
    tie_embeddings: bool = doc(True, "Share the input embedding with the output head.")
    init_std: float = doc(0.02, "Std of the normal init; residual output projections get init_std/sqrt(2L).")
    feedback: bool = doc(True, "Latent feedback on; False builds the plain baseline with no fusion weights.")
    fusion: str = doc(
        "glu_cross", "Fusion of carried state and token: glu_cross = RMSNorm((W_U h) * sigmoid(W_G RMSNorm(e)))."
    )
    input_norm: str = doc(
        "fused",
        "Which inputs of the stack go through the input RMSNorm (DESIGN.md section 1): 'fused' = fused inputs only, "
        "plain positions take the raw embedding in every pass, so pass 1 and standard decoding are the baseline's "
        "computation; 'paper' = the paper's literal App. C code, which also normalises the plain-prefix positions "
        "of training passes >= 2 (raw in pass 1 and at inference); 'all' = every input, plain or fused. true and "
        "false read as 'all' and 'fused' (as configs and checkpoints that say so were trained).",
    )
    input_norm_init: float | None = doc(
        None,
        "Initial gain of the input RMSNorm; none = 1 for input_norm='fused' (fused inputs start at unit RMS, as "
        "the recipe study measured best) and 0.02 (the embeddings' init scale) for 'paper' and 'all', whose norm "
        "also meets plain embeddings.",
    )
    gate_norm: str = doc(
        "own",
        "Norm of the token embedding the fusion's gate reads: 'own' = its own RMSNorm (gain init 1), 'shared' = the "
        "input RMSNorm, gain shared with the fused inputs' norm (the paper's `glu_cross(h, input_rmsnorm(e))`).",
    )
    feedback_source: str = doc(
        "residual",
        "Carried state: 'residual' = top block output before the final norm, 'normed' = after it, "
        "'layer:N' = output of block N (1..n_layers).",
    )
    feedback_target: int = doc(
        0,
        "Where the carried state enters (DESIGN.md section 1's span): k = the residual stream entering block k+1, "
        "after k blocks; 0 = the embedding (the full-bandwidth model). Must lie below the source layer; blocks "
        "1..k run once per position in every mode (a Jacobi pass re-runs blocks k+1..n_layers only). k > 0 needs "
        "input_norm='fused'.",
    )
    feedback_shift: int = doc(
        1,
        "Which earlier state pass k fuses into position t: 1 = h_{t-1} (the recurrence along the sequence); 0 = h_t, "
        "its own state from pass k-1 (the looped control of DESIGN.md section 7: extra depth, no state carried along "
        "positions; decoded by recomputing whole-sequence passes, no KV-cache recurrence).",
    )

    def __post_init__(self) -> None:
        self.read_boolean_input_norm()
        validate_model_config(self)

    def read_boolean_input_norm(self) -> None:
        """``input_norm`` true/false (configs and checkpoints from before the three forms) -> "all"/"fused"."""
        legacy = self.input_norm if isinstance(self.input_norm, bool) else BOOL_WORDS.get(str(self.input_norm).lower())
        if legacy is not None:
            self.input_norm = "all" if legacy else "fused"
            if not legacy:  # the old raw-plain form's fused-input norm always started at gain 1, whatever this said
                self.input_norm_init = 1.0

    @property
    def input_gain(self) -> float:
        """The input RMSNorm's initial gain (``input_norm_init``, or its default for the form)."""
        if self.input_norm_init is not None:
            return float(self.input_norm_init)
        return 1.0 if self.input_norm == "fused" else 0.02

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def ffn_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        return 64 * math.ceil(8 * self.d_model / 3 / 64)

    @property
    def feedback_layer(self) -> int:
        """1-based index of the block whose output is carried (n_layers for residual/normed)."""
        if self.feedback_source.startswith("layer:"):
            return int(self.feedback_source.split(":", 1)[1])
        return self.n_layers

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        return from_dict(cls, data)

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"no model config at {path}") from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} is not valid JSON: {err}") from None
        if isinstance(data, dict):
            # Checkpoints saved before the input norm existed were trained without it (the 'fused' form).
            data.setdefault("input_norm", False)
        return cls.from_dict(data)


HF_PREFIX = "hf:"  # a model argument "hf:PATH": the transformers model saved in PATH (retrofitted)


DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"
_DEVICE_NAME = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def validate_device_name(name: Any, field: str = "device") -> None:
    """The spelling of a device; whether this machine has it is :func:`fullband.devices.resolve_device`'s check."""
    require(isinstance(name, str) and bool(_DEVICE_NAME.fullmatch(name)), field, name, f"use {DEVICE_CHOICES}")


THREADS_HELP = ("torch CPU threads: auto = the cores this process may use (its CPU affinity), at most OMP_NUM_THREADS "
                "when that is set, shared among torchrun's processes on one machine, less the cores other running "
                "processes hold at start; or a count >= 1.")


def install_hint(extra: str) -> str:
    """How to install an optional part, for an installed package and for a clone (where ``pip install
    'fullband[...]'`` would fetch another copy of fullband instead of adding the extra to this one)."""
    return f"pip install 'fullband[{extra}]' (in a clone: pip install -e '.[{extra}]')"


def plural(count: int, noun: str) -> str:
    """``1 layer``, ``4 layers``: what the terminal says about a count."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def duration(seconds: float) -> str:
    """A wall time as a person reads it: ``42 s`` under a minute, else ``3.5 min``."""
    return f"{seconds:.0f} s" if seconds < 59.5 else f"{seconds / 60:.1f} min"


def device_field(runs: str = "", note: str = "") -> Any:
    """The ``device`` option every command has, in one wording: ``runs`` says what runs on it ("the float64
    model"), ``note`` what the command adds ("mps has no float64")."""
    where = f" {runs}" if runs else ""
    extra = f" ({note})" if note else ""
    return doc("auto", f"Torch device{where}: auto (cuda when available, else cpu), cpu, cuda, cuda:N or mps{extra}.")


def threads_field(default: str = "auto") -> Any:
    """The ``threads`` option every command has (resolved and applied by :func:`fullband.devices.apply_threads`)."""
    return doc(default, THREADS_HELP)


def validate_threads(value: Any, field: str = "threads") -> str:
    """``auto`` or a whole number >= 1 (an int from Python or a file is accepted), as the string the config keeps."""
    text = str(value).strip() if is_int(value) or isinstance(value, str) else None
    ok = text == "auto" or (text is not None and text.isdigit() and int(text) >= 1)
    require(ok, field, value, "use auto (the cores this process may use) or a whole number of threads >= 1")
    return text if text == "auto" else str(int(text))


# What a boolean option accepts as text (the command line, YAML's strings), lower-cased.
BOOL_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}

# ``--resume`` in every command that resumes: true = continue (an error when there is nothing to continue), auto =
# continue when there is something to, else start, false = start (an error when out_dir already holds a run).
RESUME = ("false", "true", "auto")


def validate_resume(value: object, field: str = "resume") -> str:
    """``resume`` as one of RESUME: true/false (a bool from Python or a file, or yes/no/1/0) or auto."""
    if isinstance(value, bool):
        return str(value).lower()
    word = value.lower() if isinstance(value, str) else value
    word = str(BOOL_WORDS[word]).lower() if word in BOOL_WORDS else word
    require(word in RESUME, field, value, "use true (continue; an error when there is nothing to resume), auto "
            "(continue if there is something to, else start) or false")
    return word


def resume_field(what: str) -> Any:
    """The ``resume`` option of a study that continues ``what`` in its out_dir (see :func:`study_resumes`)."""
    return doc("false", f"Continue an interrupted study in out_dir: true = continue ({what}), an error when out_dir "
               "holds none; auto = continue one if out_dir holds it (its config.toml), else start; false = start, "
               "in an empty out_dir.")


def study_resumes(value: object, out_dir: str) -> bool:
    """Whether a study continues the one in ``out_dir``: ``value`` is its resume option (true, false or auto; auto =
    whether ``out_dir`` holds a study's config.toml)."""
    word = validate_resume(value)
    return word == "true" or (word == "auto" and (Path(out_dir) / rundir.SETTINGS).is_file())



def require(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r} is invalid: {allowed}", name)


def require_ints(config: Any, limits: dict[str, int]) -> None:
    """Each field ``name`` of ``config`` in ``limits`` is an integer >= its limit."""
    for name, low in limits.items():
        value = getattr(config, name)
        require(is_int(value) and value >= low, name, value, f"must be an integer >= {low}")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_model_config(c: ModelConfig) -> None:
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
        value = getattr(c, name)
        require(is_int(value) and value >= 1, name, value, "must be an integer >= 1")
    require(c.d_model % c.n_heads == 0, "n_heads", c.n_heads, f"must divide d_model={c.d_model}")
    require(c.position_encoding in POSITION_ENCODINGS, "position_encoding", c.position_encoding,
            f"must be one of {POSITION_ENCODINGS} (rope = rotary embedding, none = no positional encoding)")
    if c.position_encoding == "rope":  # RoPE rotates pairs of head dimensions
        require((c.d_model // c.n_heads) % 2 == 0, "n_heads", c.n_heads,
                f"d_model/n_heads must be even for RoPE (got {c.d_model}/{c.n_heads})")
    if c.n_kv_heads is not None:
        require(is_int(c.n_kv_heads) and c.n_kv_heads >= 1 and c.n_heads % c.n_kv_heads == 0,
                "n_kv_heads", c.n_kv_heads, f"must be a positive divisor of n_heads={c.n_heads} (or None)")
    if c.d_ff is not None:
        require(is_int(c.d_ff) and c.d_ff >= 1, "d_ff", c.d_ff, "must be an integer >= 1 (or None)")
    require(isinstance(c.rope_theta, (int, float)) and c.rope_theta > 0, "rope_theta", c.rope_theta, "must be > 0")
    require(isinstance(c.norm_eps, (int, float)) and 0 < c.norm_eps < 1, "norm_eps", c.norm_eps, "must be in (0, 1)")
    require(isinstance(c.init_std, (int, float)) and c.init_std > 0, "init_std", c.init_std, "must be > 0")
    require(c.input_norm_init is None or (is_number(c.input_norm_init) and c.input_norm_init > 0),
            "input_norm_init", c.input_norm_init, "must be > 0 (or none: the form's default)")
    require(c.input_norm in INPUT_NORMS, "input_norm", c.input_norm, f"must be one of {INPUT_NORMS}")
    for name in ("tie_embeddings", "feedback"):
        require(isinstance(getattr(c, name), bool), name, getattr(c, name), "must be true or false")
    require(c.fusion in FUSIONS, "fusion", c.fusion, f"must be one of {FUSIONS}")
    require(c.gate_norm in GATE_NORMS, "gate_norm", c.gate_norm, f"must be one of {GATE_NORMS}")
    require(c.feedback_shift in (0, 1) and is_int(c.feedback_shift), "feedback_shift", c.feedback_shift,
            "must be 1 (the recurrence) or 0 (looped)")
    source = c.feedback_source
    if isinstance(source, str) and source.startswith("layer:"):
        n = source.split(":", 1)[1]
        require(n.isdigit() and 1 <= int(n) <= c.n_layers, "feedback_source", source,
                f"layer index must be in 1..n_layers={c.n_layers}")
    else:
        require(source in FEEDBACK_SOURCES, "feedback_source", source,
                f"must be one of {FEEDBACK_SOURCES} or 'layer:N'")
    validate_span(c)


def validate_span(c: ModelConfig) -> None:
    """The recurrence span (DESIGN.md §1): the target stream lies below the source layer, in the fused input form."""
    target, source = c.feedback_target, c.feedback_layer
    require(is_int(target) and 0 <= target < c.n_layers, "feedback_target", target,
            f"must be an integer in 0..n_layers-1={c.n_layers - 1} (the stream after that many blocks)")
    if target >= source:
        raise ConfigError(f"feedback_target={target} with feedback_source={c.feedback_source!r} is an impossible span: "
                          f"the target must lie below the source layer {source} (feedback_target < {source})",
                          "feedback_target")
    if target > 0 and c.input_norm != "fused":
        raise ConfigError(f"feedback_target={target} with input_norm={c.input_norm!r} is invalid: inside the stack "
                          "only input_norm='fused' is meaningful (the other forms normalise plain embeddings too)",
                          "feedback_target")


def validate_speculative_options(drafter: Any, gamma: int, max_gamma: int = 16) -> None:
    """Checks shared by ``generate(..., speculative=...)`` and ``fullband generate --drafter``."""
    require(is_int(gamma) and gamma >= 1, "gamma", gamma, "must be an integer >= 1 (tokens drafted per "
            "verification)")
    require(is_int(max_gamma) and max_gamma >= gamma, "max_gamma", max_gamma, f"must be an integer >= gamma={gamma}")
    require(not isinstance(drafter, str) or bool(drafter), "drafter", drafter,
            "name one: standard, early_exit, early_exit:N, a model (or on the command line a checkpoint directory)")


@dataclass
class CheckConfig:
    """Options of ``fullband check``."""

    seq_len: int = doc(48, "Tokens in the test sequence.")
    plain_prefix: int = doc(8, "Plain positions before the fused ones.")
    seed: int = doc(0, "Seed of the random model and tokens.")
    device: str = device_field("the float64 model runs on", "mps has no float64")
    threads: str = threads_field()

    def __post_init__(self) -> None:
        self.threads = validate_threads(self.threads)
        validate_device_name(self.device)
        require(is_int(self.seq_len) and 2 <= self.seq_len <= 512, "seq_len", self.seq_len, "must be in 2..512")
        require(is_int(self.plain_prefix) and 1 <= self.plain_prefix < self.seq_len, "plain_prefix",
                self.plain_prefix, f"must be in 1..seq_len-1={self.seq_len - 1}")


T = TypeVar("T")


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build a config dataclass from a mapping, rejecting unknown keys by name."""
    if not isinstance(data, dict):
        raise ConfigError(f"{cls.__name__} expects a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} key(s) {unknown}; known keys: {sorted(known)}")
    try:
        return cls(**data)
    except TypeError as err:
        raise ConfigError(f"bad {cls.__name__}: {err}") from None


# ---------------------------------------------------------------------------------------------- presets

# Keys (dotted, "train.seq_len") a config file or the command line set: configio builds a config inside
# explicit_keys(...), so that its __post_init__ keeps them over the preset's values.
_EXPLICIT: ContextVar[frozenset[str]] = ContextVar("fullband_explicit_keys", default=frozenset())


def current_explicit_keys() -> frozenset[str]:
    """The keys (dotted) a config file or the command line set for the config being built (see explicit_keys)."""
    return _EXPLICIT.get()


@contextmanager
def explicit_keys(keys: Iterable[str]) -> Iterator[None]:
    """Within this block, configs being built treat ``keys`` as given (configio: the file's and the command line's)."""
    token = _EXPLICIT.set(frozenset(keys))
    try:
        yield
    finally:
        _EXPLICIT.reset(token)


def apply_preset(config: Any, presets: dict[str, dict[str, Any]]) -> None:
    """Give ``config`` the values of its preset (``config.preset``), the one preset mechanism of every study.

    Precedence: defaults < preset < what the caller gave. A field takes the preset's value when it is None by
    default and still None ("none = the preset's"), or when it still has its default and no config file or command
    line set it; from Python, a field given its default value counts as left at the default. A preset entry that
    is a mapping sets keys of that section (``{"model": {"d_model": 32}}``).
    """
    require(config.preset in presets, "preset", config.preset, f"must be one of {tuple(presets)}")
    explicit = _EXPLICIT.get()
    for name, value in presets[config.preset].items():
        f = {f.name: f for f in dataclasses.fields(config)}[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        current = getattr(config, name)
        if isinstance(value, dict):  # a section: replace() runs its own checks again
            changes = {key: v for key, v in value.items()
                       if _takes_preset(getattr(current, key), getattr(default, key), f"{name}.{key}", explicit)}
            setattr(config, name, dataclasses.replace(current, **changes) if changes else current)
        elif _takes_preset(current, default, name, explicit):
            setattr(config, name, value)


def _takes_preset(current: Any, default: Any, key: str, explicit: frozenset[str]) -> bool:
    if current is None and default is None:
        return True
    return key not in explicit and current == default
