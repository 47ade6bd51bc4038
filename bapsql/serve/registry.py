"""The databases a service answers about: registered once at start-up, addressed by name only.

Contract: `DatabaseRegistry.open(paths, token_counter, progress=...)` names each SQLite file by its stem (``shop.db``
→ ``shop``), refuses a missing file, a duplicate stem or a stem that is not a plain name (letters, digits, ``_``,
``.``, ``-``; at most 64 characters), and opens each once read-only to build (with ``progress(done, total, table)``)
or load from the catalog cache its catalog, so the first request does not pay for it. ``registry[name]`` is the
`RegisteredDatabase`; a name not registered raises `KeyError`. Requests can never reach a path: they only name a
registered database (`NAME_PATTERN` is what the service accepts before looking a name up).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from bapsql.errors import ConfigError

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)


@dataclass(frozen=True)
class TableInfo:
    name: str
    rows: int


@dataclass(frozen=True)
class RegisteredDatabase:
    """One database the service may query: its name (the file's stem), resolved path and tables (exact row
    counts from the catalog)."""

    name: str
    path: Path
    tables: tuple[TableInfo, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "tables": [{"name": t.name, "rows": t.rows} for t in self.tables]}


class DatabaseRegistry:
    """Name → `RegisteredDatabase` (see the module docstring)."""

    def __init__(self, databases: Sequence[RegisteredDatabase]):
        self._by_name = {d.name: d for d in databases}

    @classmethod
    def open(cls, paths: Sequence[str | Path], token_counter: Any, *, calibration: Any = None,
             cache_dir: Path | None = None,
             progress: Callable[[str, int, int, str], None] | None = None) -> "DatabaseRegistry":
        """Register ``paths`` (see the module docstring); ``progress(db, done, total, table)`` follows catalog
        builds. `ConfigError` names the offending path."""
        from bapsql.db.handle import open_database

        if not paths:
            raise ConfigError("serve: register at least one database (--db FILE)")
        seen: dict[str, Path] = {}
        for raw in paths:
            path = Path(raw).expanduser().resolve()
            if not path.is_file():
                raise ConfigError(f"--db {raw}: no such file; pass an SQLite database file")
            name = path.stem
            if not _NAME.match(name):
                raise ConfigError(f"--db {raw}: the file's stem {name!r} is not a plain name (letters, digits, _ . -); "
                                  "rename or link the file")
            if name in seen:
                raise ConfigError(f"--db {raw}: the name {name!r} is already taken by {seen[name]}; databases are "
                                  "addressed by their file's stem, so give each a distinct one")
            seen[name] = path
        out = []
        for name, path in seen.items():
            report = (lambda done, total, table, _n=name: progress(_n, done, total, table)) if progress else None
            handle = open_database(path, token_counter=token_counter, calibration=calibration, cache_dir=cache_dir,
                                   progress=report)
            try:
                tables = tuple(TableInfo(t.name, int(t.rows)) for t in handle.catalog.tables)
            finally:
                handle.close()
            out.append(RegisteredDatabase(name, path, tables))
        return cls(out)

    def __getitem__(self, name: str) -> RegisteredDatabase:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def to_json(self) -> list[dict]:
        return [d.to_json() for d in self._by_name.values()]
