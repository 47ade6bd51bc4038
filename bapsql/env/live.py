"""An episode over a database that other programs may be writing: its one snapshot and the busy outcome.

`EpisodeSnapshot` joins the sandbox's read snapshot at the episode's first database action (not at reset, so a
writer's lock is met by a turn, whose observation can say so) and leaves it when the episode ends: every query,
estimate and the gold answer of one episode read the same committed state. Waiting for a writer's lock is bounded
by ``EnvOptions.busy_timeout_s``, cut to what is left of ``EnvOptions.request_wall_s`` since reset. When the wait
runs out the turn is a rejection whose observation says the database is busy (never an SQL error of the policy),
and the next database action tries again.
"""

from __future__ import annotations

import time

from bapsql.db.sandbox import Sandbox
from bapsql.errors import DatabaseBusy


class EpisodeSnapshot:
    """One episode's hold on its sandbox's read snapshot (see the module docstring)."""

    def __init__(self, sandbox: Sandbox, *, busy_timeout_s: float, request_wall_s: float | None) -> None:
        self.sandbox = sandbox
        self.busy_timeout_s = busy_timeout_s
        self.deadline = None if request_wall_s is None else time.monotonic() + request_wall_s
        self.held = False

    def join(self) -> tuple[float, DatabaseBusy | None]:
        """(seconds waited, None) once the snapshot is held; (seconds waited, the `DatabaseBusy`) when a writer held
        its lock for the whole bounded wait."""
        if self.held:
            return 0.0, None
        self.sandbox.wait.timeout_s = self.busy_timeout_s
        try:
            waited = self.sandbox.begin_snapshot(deadline=self.deadline)
        except DatabaseBusy as exc:
            return exc.waited_s, exc
        self.held = True
        return waited, None

    def release(self) -> None:
        """Leave the snapshot (idempotent)."""
        if self.held:
            self.held = False
            self.sandbox.end_snapshot()
