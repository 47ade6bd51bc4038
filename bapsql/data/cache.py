"""On-disk cache of executed gold queries, so a benchmark's gold SQL runs once per machine.

Contract: entries live in ``<cache_dir>/gold/<fingerprint>.json``, one JSON file per database *content* (SHA-256 of
the file's bytes, so a copied or moved database keeps its cache and a changed one never reuses stale results), each a
mapping from an entry key (hash of SQL, token counter and VM cap, see `GoldCache.key`) to a JSON-able value.
Files are written atomically (temp file + rename) by `flush`. An unwritable cache directory only loses the cache.
The cache directory defaults to ``$BAPSQL_CACHE_DIR`` or ``~/.cache/bapsql`` (database folders may be read-only).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

CACHE_VERSION = 1
_FINGERPRINTS: dict[tuple[str, int, int], str] = {}


def default_cache_dir() -> Path:
    """``$BAPSQL_CACHE_DIR`` or ``~/.cache/bapsql``."""
    env = os.environ.get("BAPSQL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "bapsql"


def file_fingerprint(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex), memoized per (path, size, mtime) within the process."""
    p = Path(path).resolve()
    st = p.stat()
    memo = (str(p), st.st_size, st.st_mtime_ns)
    if memo not in _FINGERPRINTS:
        _FINGERPRINTS[memo] = _sha256_via_sqlite(p, st.st_size)
    return _FINGERPRINTS[memo]


def _sha256_via_sqlite(path: Path, size: int) -> str:
    """SHA-256 of the file read through SQLite's file layer: closing a plain Python file on a database would drop
    the POSIX locks this process's connections hold on it (e.g. an episode's snapshot)."""
    import apsw

    h = hashlib.sha256()
    f = apsw.VFSFile("", str(path), [apsw.SQLITE_OPEN_MAIN_DB | apsw.SQLITE_OPEN_READONLY, 0])
    try:
        for off in range(0, size, 1 << 20):
            h.update(f.xRead(min(1 << 20, size - off), off))
    finally:
        f.xClose()
    return h.hexdigest()


class GoldCache:
    """Per-database JSON files of executed gold results. Use `get`/`put`, then `flush` once at the end."""

    def __init__(self, cache_dir: str | Path | None = None) -> None:
        self.root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._data: dict[str, dict] = {}
        self._dirty: set[str] = set()

    @staticmethod
    def key(sql: str, **params) -> str:
        """Entry key: hash of the SQL text and the parameters that change the stored value."""
        blob = json.dumps({"v": CACHE_VERSION, "sql": sql, **params}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def _file(self, fp: str) -> Path:
        return self.root / "gold" / f"{fp[:32]}.json"

    def _entries(self, db_path: str | Path) -> tuple[str, dict]:
        fp = file_fingerprint(db_path)
        if fp not in self._data:
            entries: dict = {}
            f = self._file(fp)
            if f.is_file():
                try:
                    obj = json.loads(f.read_text())
                    if obj.get("version") == CACHE_VERSION and obj.get("fingerprint") == fp:
                        entries = obj["entries"]
                except (OSError, ValueError, KeyError):
                    entries = {}  # a corrupt cache file is rebuilt
            self._data[fp] = entries
        return fp, self._data[fp]

    def get(self, db_path: str | Path, key: str):
        return self._entries(db_path)[1].get(key)

    def put(self, db_path: str | Path, key: str, value) -> None:
        fp, entries = self._entries(db_path)
        entries[key] = value
        self._dirty.add(fp)

    def flush(self) -> None:
        """Write every changed database's entries atomically; silently skip an unwritable cache directory."""
        for fp in sorted(self._dirty):
            target = self._file(fp)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
                with os.fdopen(fd, "w") as f:
                    json.dump({"version": CACHE_VERSION, "fingerprint": fp, "entries": self._data[fp]}, f)
                os.replace(tmp, target)
            except OSError:
                continue
        self._dirty.clear()
