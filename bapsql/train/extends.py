"""``extends:`` between training config files: a config mapping with the mapping of the file it names (a path
relative to it) merged underneath, recursively; mappings merge key by key, lists and values replace, and a cycle of
``extends:`` is a `ConfigError`.

`bapsql.train.config.load_train_config` reads training YAML through `read_raw`;
`bapsql.train.experiments.table2` reads experiment files through it too (a variant ``extends:`` another experiment
file) and resolves their ``train:`` mappings with `resolve_extends`. The strict typed loading
itself (`from_mapping`, `read_yaml`) is `bapsql.config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bapsql.config import read_yaml
from bapsql.errors import ConfigError


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` merged over ``base`` (neither modified): mappings key by key, recursively; lists and values
    replace."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_raw(path: Path, seen: tuple[Path, ...] = (), *, kind: str = "training config",
              adjust: Callable[[dict, Path], dict] | None = None) -> dict:
    """The YAML mapping of ``path`` with its ``extends:`` parent (a path relative to it) merged underneath.
    ``adjust(mapping, folder)``, when given, rewrites each file's own mapping first (``folder``: the file's), e.g.
    to make a nested path absolute before a mapping from another folder is merged over it."""
    p = path.resolve()
    if p in seen:
        raise ConfigError(f"{path}: extends forms a cycle")
    raw = read_yaml(p)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    if adjust is not None:
        raw = adjust(dict(raw), p.parent)
    return resolve_extends(raw, p.parent, (*seen, p), where=str(path), kind=kind, adjust=adjust)


def resolve_extends(raw: dict, base_dir: Path, seen: tuple[Path, ...] = (), *, where: str = "config",
                    kind: str = "training config", adjust: Callable[[dict, Path], dict] | None = None) -> dict:
    """``raw`` (a ``kind`` mapping) with its ``extends:`` parent (a path relative to ``base_dir``) merged
    underneath, recursively (``adjust``: as in `read_raw`); ``raw`` itself is not modified."""
    raw = dict(raw)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"{where}: extends: expected a path to another {kind}")
    return deep_merge(read_raw(base_dir / parent, seen, kind=kind, adjust=adjust), raw)
