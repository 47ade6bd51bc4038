"""One warm bundle per database: sandbox, catalog, estimator and shield (DESIGN §2: env workers keep them open).

`open_database(path, token_counter=...)` opens the read-only `Sandbox`, loads (or builds and caches) the `Catalog`,
and wires an `Estimator` and a `Shield` to them. `default_counter()` is the one place that decides which token
counter tools use when none is configured: the packaged tokenizer when it exists, else the regex approximation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bapsql.db.calibration import Calibration, load_calibration
from bapsql.db.catalog import Catalog, load_or_build_catalog
from bapsql.db.estimator import Estimator
from bapsql.db.sandbox import Sandbox
from bapsql.db.shield import Shield
from bapsql.tokens import DEFAULT_TOKENIZER_DIR, TokenCounter, load_token_counter


@dataclass
class DatabaseHandle:
    """Everything the environment needs for one database file."""

    path: Path
    sandbox: Sandbox
    catalog: Catalog
    estimator: Estimator
    shield: Shield

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
                  cache_dir: Path | None = None) -> DatabaseHandle:
    """Open ``db_path`` read-only and bundle its sandbox, catalog, estimator and shield.

    ``calibration`` defaults to the packaged factors; ``cache_dir`` to ``$BAPSQL_CACHE_DIR`` or ``~/.cache/bapsql``.
    Raises `DatabaseError` when the file cannot be opened."""
    sandbox = Sandbox(db_path)
    try:
        catalog = load_or_build_catalog(sandbox.path, cache_dir)
        cal = calibration if calibration is not None else load_calibration()
    except BaseException:
        sandbox.close()
        raise
    estimator = Estimator(sandbox, catalog, cal, token_counter)
    return DatabaseHandle(sandbox.path, sandbox, catalog, estimator, Shield(sandbox, token_counter))
