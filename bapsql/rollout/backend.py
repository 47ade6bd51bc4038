"""How the driver talks to its actors, without knowing whether they are Ray actors or plain objects.

Contract of a `Backend`:

- actors are addressed by `ActorKey` s: ``("env", i)``, ``("engine", name, replica)``, ``("writer", 0)``;
  `Backend.start(specs)` creates them from `ActorSpec` s (a class and its constructor arguments — a restarted
  actor is rebuilt from the same spec, so it must rebuild everything it needs from them);
- ``submit(key, method, *args) -> ticket`` calls ``method`` on the actor asynchronously; ``poll(timeout)`` returns
  the `Outcome` s that completed (at least one when any call is pending and one completes within ``timeout``);
- an actor that dies (killed, crashed, its node lost) fails its pending calls with ``Outcome.died``; the backend
  restarts it (Ray's ``max_restarts``; here by rebuilding it) and later calls go to the new incarnation, which
  holds none of the old one's state. An exception raised by the actor's own code is ``Outcome.error`` (a bug: the
  driver stops loudly).

`LocalBackend` runs the plain classes in this process: calls queue and run, in submission order, when polled —
deterministic, no Ray, and `kill` simulates a crash (pending calls die, the actor is rebuilt) for fault tests.
`bapsql.rollout.ray_shell.RayBackend` is the distributed one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

ActorKey = tuple


@dataclass(frozen=True)
class ActorSpec:
    """How to build one actor: ``cls(*args, **kwargs)``. On a cluster it reserves ``num_cpus``, ``num_gpus`` and the
    custom ``resources`` (only nodes offering them host it), and ``placement`` is ``"default"``, ``"spread"``
    (across nodes) or ``"driver"`` (on the driver's node); see `bapsql.rollout.ray_shell.nodes`."""

    key: ActorKey
    cls: type
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict = field(default_factory=dict)
    placement: str = "default"


@dataclass(frozen=True)
class Outcome:
    """A finished call: ``value`` when it returned; ``died`` when its actor died; ``error`` when its code raised."""

    ticket: int
    key: ActorKey
    method: str
    value: Any = None
    died: bool = False
    error: BaseException | None = None


class Backend(Protocol):
    """See the module docstring."""

    def start(self, specs: list[ActorSpec]) -> None: ...

    def submit(self, key: ActorKey, method: str, *args: Any) -> int: ...

    def poll(self, timeout: float) -> list[Outcome]: ...

    def pending(self) -> int: ...

    def restarts(self) -> dict[ActorKey, int]: ...

    def shutdown(self) -> None: ...


class LocalBackend:
    """Plain objects in this process (see the module docstring). ``batch``: calls run per `poll` (all if None)."""

    def __init__(self, *, batch: int | None = None):
        self._specs: dict[ActorKey, ActorSpec] = {}
        self.actors: dict[ActorKey, Any] = {}
        self._queue: deque[tuple[int, ActorKey, str, tuple]] = deque()
        self._next = 0
        self._restarts: dict[ActorKey, int] = {}
        self._dead: list[Outcome] = []
        self.batch = batch

    def start(self, specs: list[ActorSpec]) -> None:
        for spec in specs:
            self._specs[spec.key] = spec
            self.actors[spec.key] = spec.cls(*spec.args, **spec.kwargs)

    def submit(self, key: ActorKey, method: str, *args: Any) -> int:
        if key not in self.actors:
            raise KeyError(f"no actor {key!r}")
        self._next += 1
        self._queue.append((self._next, key, method, args))
        return self._next

    def poll(self, timeout: float = 0.0) -> list[Outcome]:
        out, self._dead = self._dead, []
        n = len(self._queue) if self.batch is None else min(self.batch, len(self._queue))
        for _ in range(n):
            ticket, key, method, args = self._queue.popleft()
            try:
                out.append(Outcome(ticket, key, method, value=getattr(self.actors[key], method)(*args)))
            except Exception as exc:  # the actor's own code raised: reported, not swallowed
                out.append(Outcome(ticket, key, method, error=exc))
        return out

    def kill(self, key: ActorKey) -> None:
        """Simulate a crash and restart: pending calls to ``key`` die; the actor is rebuilt from its spec."""
        keep: deque = deque()
        for item in self._queue:
            if item[1] == key:
                self._dead.append(Outcome(item[0], key, item[2], died=True))
            else:
                keep.append(item)
        self._queue = keep
        old = self.actors[key]
        if hasattr(old, "close"):
            try:
                old.close()
            except Exception:  # a crashed actor's resources are simply dropped
                pass
        spec = self._specs[key]
        self.actors[key] = spec.cls(*spec.args, **spec.kwargs)
        self._restarts[key] = self._restarts.get(key, 0) + 1

    def pending(self) -> int:
        return len(self._queue) + len(self._dead)

    def restarts(self) -> dict[ActorKey, int]:
        return dict(self._restarts)

    def shutdown(self) -> None:
        for actor in self.actors.values():
            if hasattr(actor, "close"):
                actor.close()
        self.actors.clear()
