"""Strict loading of frozen dataclass configs from YAML/JSON mappings.

Configs are read once, at the edge, and turned into frozen dataclasses. Unknown keys, missing keys and values of the
wrong type are rejected with a `ConfigError` naming the key path, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from bapsql.errors import ConfigError

T = TypeVar("T")


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file, raising `ConfigError` (with the path) when it is missing or not valid YAML."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc


def _check_value(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in args:
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _check_value(value, arm, where)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:  # ``X | None`` given something that is not None: X's own error names the bad key
            raise errors[0]
        raise ConfigError(f"{where}: {value!r} matches none of {tp}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, where)
    if origin in (tuple,):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        inner = args[0] if args else Any
        return tuple(_check_value(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict,) or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        kt, vt = args if args else (Any, Any)
        return {_check_value(k, kt, f"{where}.<key>"): _check_value(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)):
            raise ConfigError(f"{where}: expected a path string, got {value!r}")
        return Path(value)
    return value


def from_mapping(cls: type[T], data: Any, where: str = "<root>") -> T:
    """Build frozen dataclass `cls` from a mapping, strictly.

    Raises `ConfigError` naming ``where.key`` for unknown keys, missing required keys and ill-typed values. After
    construction the dataclass's own ``__post_init__`` may validate ranges (and should raise `ConfigError` too).
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown} for {cls.__name__}; allowed keys are {sorted(fields)}"
        )
    kwargs = {}
    for name, f in fields.items():
        key = f"{where}.{name}" if where != "<root>" else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{key}: required key is missing for {cls.__name__}")
            continue
        kwargs[name] = _check_value(data[name], hints[name], key)
    return cls(**kwargs)


def flat_config(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A config (dataclasses and mappings, nested) as ``{"section.key": value}``: tuples become lists, and values
    that are not JSON scalars or lists become their ``str``, so the result is JSON-ready and comparable across runs."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flat_config(v, f"{prefix}{k}."))
        return out
    value = list(obj) if isinstance(obj, tuple) else obj
    return {prefix[:-1]: value if isinstance(value, (str, int, float, bool, list, type(None))) else str(value)}
