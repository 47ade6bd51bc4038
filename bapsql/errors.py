"""The project's error hierarchy. Every error the library raises on purpose is a `BapsqlError`.

Bad model output is *not* an error: it becomes an invalid action with an explanatory observation. Errors are for
bad configuration, bad user input at the edges (CLI, files), and broken invariants.
"""


class BapsqlError(Exception):
    """Base class of every error bapsql raises deliberately."""


class ConfigError(BapsqlError):
    """Raised at load time when a YAML/JSON config has an unknown key, a missing key or a bad value.

    The message names the offending key path (e.g. ``levels.XS.queries``) and what to do about it.
    """


class DatabaseError(BapsqlError):
    """Raised when a database file cannot be opened read-only (missing, not SQLite, unreadable)."""


class SQLRejected(BapsqlError):
    """Raised by the sandbox when a statement is refused before it runs (write, PRAGMA, ATTACH, banned function,
    several statements, over-long SQL). The shield converts it into a typed ``rejected`` result; callers outside the
    shield see the exception."""


class DataError(BapsqlError):
    """Raised when a benchmark folder or task file is malformed (unknown layout, unreadable JSON, missing fields)."""


class BudgetBreach(BapsqlError):
    """Raised only by audit checks when accounting finds a channel beyond its limit.

    The shield makes hard breaches unreachable by construction; this error exists so an accounting bug fails loudly
    in tests instead of silently producing an infeasible 'success'."""


class EngineError(BapsqlError):
    """Raised when a model engine cannot be started or fails to generate."""


class WeightSyncError(BapsqlError):
    """Raised when the engine's logprobs on the check prompt disagree with the learner's after a weight sync."""


class SQLExecutionError(BapsqlError):
    """Raised by the sandbox when SQLite reports an error while preparing or running an allowed statement (syntax
    error, unknown table or column, type error). The shield converts it into a typed ``error`` result."""
