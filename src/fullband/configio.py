"""Config files + ``--section.key`` overrides -> validated, nested config dataclasses.

Precedence is dataclass default < config file (TOML/YAML/JSON) < command line; a config class with presets
applies the one its ``preset`` names in its ``__post_init__`` (``fullband.config.apply_preset``), between its
defaults and the file: the config is built inside ``explicit_keys`` of what the file and command line set.
Unknown keys are rejected anywhere; for an optional field the string ``none``/``null`` means
None everywhere (this is also how a resolved TOML file, which has no null, records None).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import re
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, Union

from fullband.config import BOOL_WORDS, ConfigError, explicit_keys
from fullband.files import dumps, write_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")
_DEST = "_cfg:"  # argparse dest prefix; what follows is the dotted key
_NONE = ("none", "null")


@functools.cache
def _fields(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """Init fields of a dataclass with their resolved types (annotations are strings)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _type_name(tp: Any) -> str:
    base, optional = _unwrap(tp)
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is list or (origin is tuple and args[-1:] == (Ellipsis,)):
        name = f"a comma-separated list of {args[0].__name__}"
    elif origin is tuple:
        name = f"{len(args)} comma-separated values ({', '.join(a.__name__ for a in args)})"
    else:
        name = {bool: "a bool (true/false/1/0/yes/no)", int: "an int", float: "a float"}.get(base, "a string")
    return name + (" or none" if optional else "")


def _convert(value: Any, tp: Any) -> Any:
    """Convert a file value or a CLI string to ``tp``; ValueError if it does not fit."""
    base, optional = _unwrap(tp)
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in _NONE):
        if optional:
            return None
        raise ValueError
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin in (list, tuple):
        if isinstance(value, str):  # CLI form "0,1,2" (brackets tolerated); "" is the empty list
            text = value.strip().strip("[]").strip()
            value = [p.strip() for p in text.split(",")] if text else []
        if not isinstance(value, (list, tuple)):
            raise ValueError
        if origin is list or args[-1:] == (Ellipsis,):
            items = [_convert(v, args[0]) for v in value]
        else:  # fixed-length tuple; a wrong length raises ValueError from zip
            items = [_convert(v, a) for v, a in zip(value, args, strict=True)]
        return items if origin is list else tuple(items)
    if base not in (bool, int, float, str):
        raise TypeError(f"unsupported config field type {tp!r}")
    if base is bool and isinstance(value, str):
        value = BOOL_WORDS.get(value.strip().lower(), value)
    elif base in (int, float) and isinstance(value, str):  # also YAML, which reads 3e-4 (no dot) as a string
        value = base(value.strip())
    elif base is int and isinstance(value, float) and value.is_integer():  # 1e5 steps written in TOML/YAML
        value = int(value)
    elif base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif base is str and isinstance(value, bool):  # resume = true in a file: the option's words are strings
        value = str(value).lower()
    elif base is str and isinstance(value, int):  # threads = 2 in a file
        value = str(value)
    if not isinstance(value, base) or (base is int and isinstance(value, bool)):
        raise ValueError
    return value


def _typed(value: Any, tp: Any, label: str) -> Any:
    try:
        return _convert(value, tp)
    except ValueError:
        raise ConfigError(f"{label}={value!r}: expected {_type_name(tp)}") from None


def _lookup(cls: type, key: str, prefix: str, dash: str) -> Any:
    """Type of field ``key`` of ``cls``, or a ConfigError naming the key and the close match (or, for a key the
    section retired, what replaced it)."""
    fields = _fields(cls)
    if key in fields:
        return fields[key][1]
    if prefix and key in _retired_keys(cls):
        raise _replaced(f"{prefix}{key}", _retired_keys(cls)[key], prefix, dash)
    close = difflib.get_close_matches(key, fields, n=1)
    hint = f"; did you mean {dash}{prefix}{close[0]}?" if close else ""
    where = f"[{prefix[:-1]}]" if prefix else "the top level"
    raise ConfigError(f"unknown key {dash}{prefix}{key}{hint} (valid keys in {where}: {', '.join(fields)})")


def _retired(cls: type) -> dict[str, str]:
    """A config class's retired flat option names -> the ``section.key`` that replaced each (``ALIASES``, if any):
    given, they are refused with a one-line hint naming it."""
    return getattr(cls, "ALIASES", {})


def _retired_keys(cls: type) -> dict[str, str]:
    """A section class's retired keys -> what replaced each, ``"KEY VALUE"`` (``RETIRED``, if any): given, they
    are refused with a line naming the replacement (``[decode] prefill_passes`` -> ``mode fused:K``)."""
    return getattr(cls, "RETIRED", {})


def _renamed(flat: str, dotted: str, dash: str) -> ConfigError:
    section, name = dotted.split(".")
    if " " in name:  # a key retired from the section too: its replacement with the value to give it
        return _replaced(flat, name, f"{section}.", dash)
    where = f"--{dotted}" if dash else f"{dotted} ([{section}] {name} in a config file)"
    return ConfigError(f"{dash}{flat} is now {where}")


def _replaced(given: str, replacement: str, prefix: str, dash: str) -> ConfigError:
    """``given`` (an option or key) is retired: the line naming ``replacement`` (``"KEY VALUE"``) in ``prefix``."""
    key, _, value = replacement.partition(" ")
    if dash:
        return ConfigError(f"{dash}{given} is retired: use {dash}{prefix}{key} {value}")
    return ConfigError(f'{given} is retired: use {key} = "{value}" in [{prefix[:-1]}] of the config file')


def _file_tree(cls: type, data: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        where = prefix[:-1] or "config"
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} keys, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not prefix and str(key) in _retired(cls):
            raise _renamed(str(key), _retired(cls)[str(key)], "")
        tp = _lookup(cls, str(key), prefix, "")
        dotted = f"{prefix}{key}"
        out[key] = _file_tree(tp, value, dotted + ".") if _is_section(tp) else _typed(value, tp, dotted)
    return out


def _set_override(cls: type, key: str, value: Any, tree: dict[str, Any]) -> None:
    key = key.lstrip("-").replace("-", "_")
    if key in _retired(cls):
        raise _renamed(key, _retired(cls)[key], "--")
    parts = key.split(".")
    prefix = ""
    for part in parts[:-1]:
        cls = _lookup(cls, part, prefix, "--")
        if not _is_section(cls):
            raise ConfigError(f"--{prefix}{part} is not a section, so --{key.lstrip('-')} does not exist")
        tree = tree.setdefault(part, {})
        prefix += part + "."
    tp = _lookup(cls, parts[-1], prefix, "--")
    if _is_section(tp):
        raise ConfigError(f"--{prefix}{parts[-1]} is a section; set one of its keys, e.g. --{prefix}{parts[-1]}.KEY")
    tree[parts[-1]] = _typed(value, tp, f"--{prefix}{parts[-1]}")


def _instantiate(cls: type[T], tree: dict[str, Any], prefix: str, base: Any) -> T:
    """Build ``cls`` from typed values, falling back to ``base`` (a default instance) or field defaults."""
    kwargs = {}
    for name, (f, tp) in _fields(cls).items():
        if _is_section(tp):
            sub = getattr(base, name) if base is not None else _default(f)
            sub = None if sub is dataclasses.MISSING else sub
            kwargs[name] = _instantiate(tp, tree.get(name, {}), f"{prefix}{name}.", sub)
        elif name in tree:
            kwargs[name] = tree[name]
        elif base is not None:
            kwargs[name] = getattr(base, name)
        elif _default(f) is dataclasses.MISSING:
            raise ConfigError(f"missing required key {prefix}{name} (set it in the config file or --{prefix}{name})")
    try:
        return cls(**kwargs)
    except ValueError as err:  # ConfigError included: say which section the message is about
        msg = str(err)
        if not prefix:
            raise ConfigError(msg) from None
        first = re.match(r"\w+", msg)
        sep = "." if first and first.group() in _fields(cls) else ": "
        raise ConfigError(f"{prefix[:-1]}{sep}{msg}") from None


def build_config(cls: type[T], file_data: dict[str, Any] | None,
                 overrides: dict[str, Any] | argparse.Namespace) -> T:
    """Defaults, then the file's nested mapping, then dotted CLI overrides; validated."""
    tree = _given_tree(cls, file_data, overrides)
    with explicit_keys(_flat(tree)):  # a preset never replaces what the file or command line set
        return _instantiate(cls, tree, "", None)


def _given_tree(cls: type, file_data: dict[str, Any] | None,
                overrides: dict[str, Any] | argparse.Namespace) -> dict[str, Any]:
    """The typed values the file and the overrides set, nested by section (the command line wins)."""
    tree = _file_tree(cls, file_data, "") if file_data else {}
    if isinstance(overrides, argparse.Namespace):
        overrides = {k[len(_DEST):]: v for k, v in vars(overrides).items() if k.startswith(_DEST)}
    for key, value in overrides.items():
        _set_override(cls, key, value, tree)
    return tree


def given_values(cls: type, args: argparse.Namespace, config_path_attr: str = "config") -> dict[str, Any]:
    """{dotted key: typed value} of what ``args``' config file and command line set, as :func:`config_from_args`
    reads them (the command line wins): what a user asked for, as opposed to defaults and presets. Not yet checked
    together: :func:`build_config` (``cls``, None, these) builds and validates them."""
    path = getattr(args, config_path_attr, None)
    return _flat(_given_tree(cls, load_config_file(path) if path else None, args))


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def show_value(value: Any) -> str:
    """A config value as the command line spells it (``none``, ``true``, ``0,1,2``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(map(show_value, value))
    return str(value)


def _metavar(tp: Any) -> str:
    base, _ = _unwrap(tp)
    if typing.get_origin(base) in (list, tuple):
        return f"{_metavar(typing.get_args(base)[0])},..."
    return {bool: "BOOL", int: "INT", float: "FLOAT"}.get(base, "STR")


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add ``--section.key VALUE`` (and ``--key`` for top-level leaves) for every leaf field of ``cls``; its retired
    flat names (``ALIASES``), hidden from ``--help``, stop the parse with a line naming the sectioned flag."""
    _add_arguments(parser, parser, cls, "", None)
    for flat, dotted in _retired(cls).items():
        for spelling in {flat, flat.replace("_", "-")}:
            parser.add_argument(f"--{spelling}", action=_Retired, nargs="?", dotted=dotted, help=argparse.SUPPRESS)


class _Retired(argparse.Action):
    """A retired flat option: parsing it is an error that names the sectioned flag to use instead."""

    def __init__(self, option_strings: list[str], dest: str, dotted: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)
        self.dotted = dotted

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(str(_renamed((option_string or "").lstrip("-"), self.dotted, "--")))


def _add_arguments(parser: argparse.ArgumentParser, group: Any, cls: type, prefix: str, base: Any) -> None:
    for key, replacement in _retired_keys(cls).items() if prefix else ():  # hidden: given, a line naming the new one
        for spelling in {key, key.replace("_", "-")}:
            parser.add_argument(f"--{prefix}{spelling}", action=_Retired, nargs="?", dotted=f"{prefix}{replacement}",
                                help=argparse.SUPPRESS)
    for name, (f, tp) in _fields(cls).items():
        default = getattr(base, name) if base is not None else _default(f)
        if _is_section(tp):
            own_doc = (tp.__doc__ or "").strip()
            # The docstring's first paragraph, lines joined (dataclass's generated __doc__ is no description).
            desc = None if own_doc.startswith(tp.__name__ + "(") else " ".join(own_doc.split("\n\n")[0].split())
            sub_base = None if default is dataclasses.MISSING else default
            _add_arguments(parser, parser.add_argument_group(prefix + name, desc), tp, f"{prefix}{name}.", sub_base)
            continue
        dotted = prefix + name
        help_text = (f.metadata.get("help", "") + _shown_default(default)).strip().replace("%", "%%")
        common = {"dest": _DEST + dotted, "default": argparse.SUPPRESS, "metavar": _metavar(tp)}
        group.add_argument(f"--{dotted}", help=help_text, **common)
        if "_" in dotted:  # dash spelling works too, hidden so --help lists each key once
            group.add_argument(f"--{dotted.replace('_', '-')}", help=argparse.SUPPRESS, **common)


def _shown_default(default: Any) -> str:
    """What --help adds after an option's help: its default, or nothing for an empty one (a required option, whose
    help says so, or one that is unset unless given: ``(default: )`` would say neither)."""
    if default is dataclasses.MISSING:
        return " (required)"
    if isinstance(default, (str, tuple, list)) and not default:
        return ""
    return f" (default: {show_value(default)})"


def short_help(parser: argparse.ArgumentParser, common: Sequence[str], more: str) -> str:
    """``parser``'s help with only the ``common`` options (their ``--name`` spellings, in the parser's order), then
    the line ``more`` (how to see every option): the short view litgpt and Hugging Face give a long command."""
    formatter = parser._get_formatter()
    formatter.add_usage(f"{parser.prog} [--config FILE] [--OPTION VALUE ...]", None, [])
    formatter.add_text(parser.description)
    formatter.start_section("common options")
    formatter.add_arguments([a for a in parser._actions if set(a.option_strings) & set(common)])
    formatter.end_section()
    formatter.add_text(more)
    return formatter.format_help()


def config_from_args(cls: type[T], args: argparse.Namespace, config_path_attr: str = "config") -> T:
    """Build ``cls`` from ``args.<config_path_attr>`` (a file path or None) plus the dotted overrides given."""
    path = getattr(args, config_path_attr, None)
    return build_config(cls, load_config_file(path) if path else None, args)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a .toml, .yaml/.yml or .json config file into a nested dict."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError(f"{path}: unknown config file type {suffix!r} (use .toml, .yaml, .yml or .json)")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text) if suffix == ".toml" else json.loads(text) if suffix == ".json" else None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: invalid {suffix[1:].upper()}: {err}") from None
    if suffix in (".yaml", ".yml"):
        data = _load_yaml(text, path)
    if data is None:  # an empty YAML file
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _load_yaml(text: str, path: Path) -> Any:
    try:
        import yaml  # optional dependency: only YAML users need it
    except ImportError:
        raise ConfigError(f"reading {path} needs PyYAML: pip install pyyaml") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None


def config_to_dict(instance: Any) -> dict[str, Any]:
    """Nested plain dict of a config dataclass (tuples become lists, None stays None)."""
    return _plain(instance, None, saving=False)


def _plain(instance: Any, none: Any, saving: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (_, tp) in _fields(type(instance)).items():
        value = getattr(instance, name)
        if _is_section(tp):
            out[name] = _plain(value, none, saving)
            continue
        if saving and _unwrap(tp)[1] and isinstance(value, str) and value.strip().lower() in _NONE:
            raise ConfigError(f"cannot save {name}={value!r}: an optional field reads this string back as None")
        out[name] = none if value is None else list(value) if isinstance(value, tuple) else value
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # exact for floats; inf/-inf/nan are TOML too
    if isinstance(value, str):  # a JSON string is a TOML basic string once DEL is escaped
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml_value, value)) + "]"
    raise ConfigError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def _toml_lines(data: dict[str, Any], table: str) -> list[str]:
    # Leaves first: after a [table] header every key belongs to that table.
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for key, value in data.items():
        if isinstance(value, dict):
            name = f"{table}.{_toml_key(key)}" if table else _toml_key(key)
            lines += ["", f"[{name}]", *_toml_lines(value, name)]
    return lines


def save_resolved_config(instance: Any, path: str | Path) -> None:
    """Write every resolved key: TOML for a .toml path, JSON otherwise; loads back to an equal config. Atomic."""
    path = Path(path)
    if path.suffix.lower() == ".toml":
        # TOML has no null: write "none", which the loader turns back into None for an optional field.
        text = "\n".join(_toml_lines(_plain(instance, "none", saving=True), "")) + "\n"
    else:
        text = dumps(_plain(instance, None, saving=True)) + "\n"
    write_text(path, text)  # atomically: a run's config.toml is never left half written
