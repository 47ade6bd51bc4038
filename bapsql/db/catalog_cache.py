"""The catalog cache, and when a catalog is stale.

Contract:
- A catalog's key is its ``fingerprint``: the absolute path, `CATALOG_VERSION`, a SHA-256 of the schema and a cheap
  data fingerprint (page and free-page counts, every rowid table's largest rowid, every WITHOUT ROWID table's
  row count), all read in the read transaction the statistics come from (`bapsql.db.dbfile.data_fingerprint`).
- `staleness(cached, current, tolerance)` compares two fingerprints: another schema (or catalog version) always
  means rebuild; other data means rebuild when the *drift* (the largest relative change of the page count or of any
  table's largest rowid or WITHOUT ROWID row count) is above ``tolerance``. ``tolerance=0`` (the default of
  `load_or_build_catalog`) rebuilds on any change; a long-lived handle on a database that is written all the time
  uses a small tolerance so that a trickle of inserts does not rebuild the catalog for every episode
  (`bapsql.env.handles`).
- Every rebuild logs one line saying why (logger ``bapsql.db.catalog_cache``, WARNING when a cached or open catalog
  was outdated, INFO for a first build); a catalog reused although the data moved (within the tolerance) is logged
  too. So estimates never use another version's statistics silently.
- `load_or_build_catalog(path, cache_dir)` caches under ``<cache>/catalogs/`` keyed by the file's absolute path,
  written atomically; an unwritable cache directory only loses the cache, never the catalog.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bapsql.db.catalog import CATALOG_VERSION, Catalog, build_catalog, open_readonly
from bapsql.db.dbfile import BusyWait, data_fingerprint

log = logging.getLogger(__name__)


def fingerprint(db_path: str | Path, wait: BusyWait | None = None) -> dict[str, Any]:
    """The fingerprint the catalog of ``db_path`` would carry if built now (one short read transaction)."""
    p = Path(db_path).resolve()
    conn = open_readonly(p, wait)
    try:
        conn.execute("BEGIN").fetchall()
        return full_fingerprint(p, data_fingerprint(conn))
    finally:
        conn.close()


def full_fingerprint(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """A catalog fingerprint from a `data_fingerprint` read elsewhere (e.g. by the sandbox, inside its snapshot)."""
    return {"path": str(Path(path).resolve()), "version": CATALOG_VERSION, **data}


@dataclass(frozen=True)
class Staleness:
    """``rebuild``: the cached catalog must not be used; ``reason``: why (empty when the fingerprints match);
    ``drift``: largest relative change of the data fingerprint (0.0 when identical, inf for another schema)."""

    rebuild: bool
    reason: str
    drift: float


def _rel(old: Any, new: Any) -> float:
    if old == new:
        return 0.0
    if old is None or new is None:
        return float("inf")
    return abs(new - old) / max(abs(old), 1)


def staleness(cached: dict[str, Any] | None, current: dict[str, Any], tolerance: float = 0.0) -> Staleness:
    """Whether a catalog built for ``cached`` may describe the data of ``current`` (see the module docstring)."""
    if cached is None:
        return Staleness(True, "no cached catalog", float("inf"))
    if cached.get("version") != current.get("version"):
        return Staleness(True, f"catalog format {cached.get('version')} → {current.get('version')}", float("inf"))
    if cached.get("schema_sha256") != current.get("schema_sha256"):
        return Staleness(True, "the schema changed", float("inf"))
    changes = []
    drift = 0.0
    for key in ("page_count", "freelist_count"):
        old, new = cached.get(key), current.get(key)
        if old != new:
            changes.append((_rel(old, new) if key == "page_count" else 0.0, f"{key} {old} → {new}"))
    old_rows, new_rows = cached.get("max_rowid") or {}, current.get("max_rowid") or {}
    for table in sorted(set(old_rows) | set(new_rows)):
        old, new = old_rows.get(table), new_rows.get(table)
        if old != new:
            changes.append((_rel(old, new), f"{table} rows/rowid {old} → {new}"))
    if not changes:
        return Staleness(False, "", 0.0)
    drift = max(c[0] for c in changes)
    shown = "; ".join(text for _, text in sorted(changes, key=lambda c: -c[0])[:3])
    more = f" (+{len(changes) - 3} more)" if len(changes) > 3 else ""
    rebuild = drift > tolerance or tolerance <= 0
    verdict = "above" if rebuild else "within"
    reason = f"the data changed ({shown}{more}): drift {drift:.1%}, {verdict} the tolerance {tolerance:.1%}"
    return Staleness(rebuild, reason, drift)


def default_cache_dir() -> Path:
    """``$BAPSQL_CACHE_DIR`` or ``~/.cache/bapsql`` (database folders may be read-only)."""
    env = os.environ.get("BAPSQL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "bapsql"


def catalog_cache_path(db_path: str | Path, cache_dir: Path | None = None) -> Path:
    """Where the catalog of ``db_path`` is cached: one JSON file per absolute path."""
    p = Path(db_path).resolve()
    key = hashlib.sha256(str(p).encode()).hexdigest()[:16]
    return (cache_dir or default_cache_dir()) / "catalogs" / f"{p.stem}-{key}.json"


def _read_cached(cache: Path) -> Catalog | None:
    if not cache.is_file():
        return None
    try:
        return Catalog.from_json(json.loads(cache.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a corrupt or outdated cache entry is rebuilt


def load_or_build_catalog(db_path: str | Path, cache_dir: Path | None = None, *, tolerance: float = 0.0,
                          current: dict[str, Any] | None = None, wait: BusyWait | None = None,
                          progress: Callable[[int, int, str], None] | None = None) -> Catalog:
    """The catalog of ``db_path`` from the cache when it is not stale against the data now (``current``: a
    fingerprint the caller already read, else one is read), else freshly built (``progress`` as in
    `build_catalog`) and cached, with a log line saying why.

    Raises `DatabaseError` when the file is missing or not a readable SQLite database, `DatabaseBusy` when a writer
    held its lock past the wait."""
    path = Path(db_path).resolve()
    current = current if current is not None else fingerprint(path, wait)
    cache = catalog_cache_path(path, cache_dir)
    cached = _read_cached(cache)
    verdict = staleness(cached.fingerprint if cached is not None else None, current, tolerance)
    if not verdict.rebuild:
        if verdict.reason:
            log.warning("catalog of %s reused: %s", path.name, verdict.reason)
        return cached
    (log.info if cached is None else log.warning)("catalog of %s rebuilt: %s", path.name, verdict.reason)
    catalog = build_catalog(path, progress=progress, wait=wait)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=cache.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(catalog.to_json(), f)
        os.replace(tmp, cache)
    except OSError:
        pass  # unwritable cache: the catalog is still valid, only not reused
    return catalog
