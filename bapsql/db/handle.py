"""One warm bundle per database: sandbox, catalog, estimator and shield (DESIGN §2: env workers keep them open).

`open_database(path, token_counter=...)` opens the read-only `Sandbox`, loads (or builds and caches) the `Catalog`,
and wires an `Estimator` and a `Shield` to them. `DatabaseHandle.stale(tolerance)` says whether the database has
moved away from the catalog since (a file-stamp test first, then the data fingerprint; see
`bapsql.db.catalog_cache`), logging why. `default_counter()` is the one place that decides which token
counter tools use when none is configured: the packaged tokenizer when it exists, else the regex approximation.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bapsql.db.calibration import Calibration, load_calibration
from bapsql.db.catalog import Catalog
from bapsql.db.catalog_cache import full_fingerprint, load_or_build_catalog, staleness
from bapsql.db.dbfile import DEFAULT_BUSY_TIMEOUT_S, file_stamp
from bapsql.db.estimator import Estimator
from bapsql.db.sandbox import Sandbox
from bapsql.db.shield import Shield
from bapsql.errors import DatabaseBusy
from bapsql.tokens import DEFAULT_TOKENIZER_DIR, TokenCounter, load_token_counter

log = logging.getLogger(__name__)


@dataclass
class DatabaseHandle:
    """Everything the environment needs for one database file."""

    path: Path
    sandbox: Sandbox
    catalog: Catalog
    estimator: Estimator
    shield: Shield
    stamp: tuple = field(default=())  # `file_stamp` when the catalog was last compared with the data
    _noted: str = ""  # the last within-tolerance drift that was logged
    checked: float = float("-inf")  # time.monotonic() of the last fingerprint check

    def stale(self, tolerance: float, *, interval_s: float = 0.0) -> bool:
        """True when the data moved away from the catalog by more than ``tolerance`` (or the schema changed): the
        caller should reopen. Cheap when the file and its ``-wal`` are untouched; otherwise the data fingerprint is
        read (one short read transaction), at most once per ``interval_s`` seconds: on a rollback-journal database
        that a writer keeps busy, every extra shared lock costs a wait. Never inside an episode's snapshot. A
        database too busy to fingerprint is not called stale (the next check tries again)."""
        stamp = file_stamp(self.path)
        if stamp == self.stamp or self.sandbox.in_snapshot:
            return False
        now = time.monotonic()
        if now - self.checked < interval_s:
            return False
        self.checked = now
        try:
            current = full_fingerprint(self.path, self.sandbox.fingerprint())
        except DatabaseBusy:
            return False
        verdict = staleness(self.catalog.fingerprint, current, tolerance)
        if verdict.rebuild:
            log.warning("catalog of %s is stale, reopening: %s", self.path.name, verdict.reason)
            return True
        self.stamp = stamp
        if verdict.reason and verdict.drift > 0 and verdict.reason != self._noted:
            log.info("catalog of %s kept: %s", self.path.name, verdict.reason)
            self._noted = verdict.reason
        return False

    def close(self) -> None:
        """Close the sandbox connection and the estimator's EXPLAIN connection (idempotent)."""
        self.estimator.close()
        self.sandbox.close()

    def __enter__(self) -> "DatabaseHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def default_counter() -> TokenCounter:
    """The packaged tokenizer (``load_token_counter("default")``) when it is installed, else ``"regex"``."""
    if (DEFAULT_TOKENIZER_DIR / "tokenizer.json").is_file():
        return load_token_counter("default")
    return load_token_counter("regex")


def open_database(db_path: str | Path, *, token_counter: TokenCounter, calibration: Calibration | None = None,
                  cache_dir: Path | None = None, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
                  catalog_tolerance: float = 0.0,
                  progress: Callable[[int, int, str], None] | None = None) -> DatabaseHandle:
    """Open ``db_path`` read-only and bundle its sandbox, catalog, estimator and shield.

    ``calibration`` defaults to the packaged factors; ``cache_dir`` to ``$BAPSQL_CACHE_DIR`` or ``~/.cache/bapsql``;
    a cached catalog is reused while the data drifted at most ``catalog_tolerance`` (`bapsql.db.catalog_cache`),
    else rebuilt with ``progress(done, total, table)``. Raises `DatabaseError` when the file cannot be opened
    (cause and fix in the message), `DatabaseBusy` when a writer held its lock past ``busy_timeout_s``."""
    sandbox = Sandbox(db_path, busy_timeout_s=busy_timeout_s)
    try:
        stamp = file_stamp(sandbox.path)
        current = full_fingerprint(sandbox.path, sandbox.fingerprint())
        catalog = load_or_build_catalog(sandbox.path, cache_dir, tolerance=catalog_tolerance, current=current,
                                        wait=sandbox.wait, progress=progress)
        cal = calibration if calibration is not None else load_calibration()
    except BaseException:
        sandbox.close()
        raise
    estimator = Estimator(sandbox, catalog, cal, token_counter)
    return DatabaseHandle(sandbox.path, sandbox, catalog, estimator, Shield(sandbox, token_counter), stamp)
