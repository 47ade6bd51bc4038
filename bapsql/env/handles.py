"""A small warm cache of database handles for environments (DESIGN §2: workers keep connections and catalogs warm).

`DatabaseHandles.get(path)` opens a `bapsql.db.handle.DatabaseHandle` (sandbox, catalog, estimator, shield) on
first use and keeps it open; beyond ``max_open`` handles the least recently used one is closed. One cache serves
many episodes over the same databases; it is not thread-safe (one per worker). An episode leases its handle
(`acquire` at reset, `release` when it ends): a leased handle is never closed or reopened under the episode, so
episodes interleaved over more databases than ``max_open`` (model rollouts keep many in flight on one worker) keep
the cache over its cap until they end, rather than finding their connection closed. A database that other programs
write is checked at every `get` (a file stamp, then — at most once per ``check_interval_s`` — the data fingerprint;
`bapsql.db.catalog_cache`): once its data drifted past ``catalog_tolerance`` (or its schema changed) the handle is
reopened and its catalog rebuilt, with a log line saying why; a handle holding an episode's snapshot is never
reopened under it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from bapsql.errors import DatabaseBusy
from bapsql.tokens import TokenCounter

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.db.calibration import Calibration
    from bapsql.db.handle import DatabaseHandle


class DatabaseHandles:
    """LRU cache of open `DatabaseHandle` objects keyed by resolved database path."""

    def __init__(
        self,
        token_counter: TokenCounter,
        *,
        calibration: "Calibration | None" = None,
        cache_dir: Path | None = None,
        max_open: int = 16,
        catalog_tolerance: float = 0.05,
        check_interval_s: float = 1.0,
        busy_timeout_s: float = 3.0,
        progress: "Callable[[int, int, str], None] | None" = None,
    ) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be at least 1, got {max_open}")
        self.token_counter = token_counter
        self.calibration = calibration
        self.cache_dir = cache_dir
        self.max_open = max_open
        self.catalog_tolerance = catalog_tolerance
        self.check_interval_s = check_interval_s
        self.busy_timeout_s = busy_timeout_s  # bound on waiting for a writer while opening (episodes set their own)
        self.progress = progress  # called per table while a catalog is (re)built: progress(done, total, table)
        self._open: OrderedDict[str, DatabaseHandle] = OrderedDict()
        self._leases: dict[str, int] = {}  # key -> episodes holding that handle

    def acquire(self, db_path: str | Path) -> "DatabaseHandle":
        """`get` the handle of ``db_path`` and lease it to an episode until `release` (module docstring)."""
        handle = self.get(db_path)
        key = _key(db_path)
        self._leases[key] = self._leases.get(key, 0) + 1
        return handle

    def release(self, db_path: str | Path) -> None:
        """End one lease of ``db_path``'s handle (from `acquire`); closes handles over the cap that no episode holds."""
        key = _key(db_path)
        left = self._leases.get(key, 0) - 1
        if left < 0:
            raise ValueError(f"release of {db_path} without an acquire")
        if left:
            self._leases[key] = left
        else:
            del self._leases[key]
        self._trim()

    def get(self, db_path: str | Path) -> "DatabaseHandle":
        """The handle of ``db_path`` (opened on first use; `DatabaseError` if the file cannot be opened,
        `DatabaseBusy` if a writer kept it locked past the wait on first use)."""
        from bapsql.db.handle import open_database

        key = _key(db_path)
        old = self._open.get(key)
        if old is not None and (key in self._leases  # an episode reads it: never reopened under it
                                or not old.stale(self.catalog_tolerance, interval_s=self.check_interval_s)):
            self._open.move_to_end(key)
            return old
        try:
            handle = open_database(key, token_counter=self.token_counter, calibration=self.calibration,
                                   cache_dir=self.cache_dir, catalog_tolerance=self.catalog_tolerance,
                                   busy_timeout_s=self.busy_timeout_s, progress=self.progress)
        except DatabaseBusy:
            if old is None:
                raise
            log.warning("catalog of %s is stale but the database is busy; the open handle serves until the next "
                        "check", Path(key).name)
            self._open.move_to_end(key)
            return old
        if old is not None:
            old.close()
        self._open[key] = handle
        self._open.move_to_end(key)
        self._trim(keep=key)
        return handle

    def _trim(self, keep: str | None = None) -> None:
        """Close least recently used handles that no episode leases (nor ``keep``, the one being handed out) until
        at most ``max_open`` stay open."""
        while len(self._open) > self.max_open:
            victim = next((k for k in self._open if k not in self._leases and k != keep), None)
            if victim is None:  # every open handle serves an unfinished episode: over the cap until one ends
                return
            self._open.pop(victim).close()

    def __len__(self) -> int:
        return len(self._open)

    def close(self) -> None:
        """Close every open handle."""
        self._leases.clear()
        while self._open:
            _, h = self._open.popitem()
            h.close()

    def __enter__(self) -> "DatabaseHandles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _key(db_path: str | Path) -> str:
    return str(Path(db_path).expanduser().resolve())
