"""`RayBackend`: the rollout driver's `bapsql.rollout.backend.Backend` over Ray actors.

Every actor is ``ray.remote(cls).options(max_restarts=..., max_task_retries=0, num_cpus=..., num_gpus=...,
resources=..., scheduling_strategy=...)``: Ray restarts a dead actor by rerunning its constructor (on any node that
has the resources its spec asks for), and no call is retried behind the driver's back — the driver decides what to
rerun (`bapsql.rollout.driver`). A call that fails because its actor died (`ray.exceptions.RayActorError`, a
crashed worker process or a lost node) comes back as ``Outcome.died``; an exception from the actor's own code as
``Outcome.error``. Placement (where actors go, the bounded wait for it at start): see
`bapsql.rollout.ray_shell.nodes`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ray
from ray import exceptions as rex

from bapsql.rollout.backend import ActorKey, ActorSpec, Outcome
from bapsql.rollout.placement import SWEEP_KEYS, ConfigKeys
from bapsql.rollout.ray_shell.nodes import (actor_node_ids, actor_options, actor_restarts, await_actors, node_offers,
                                            spec_asks, where_text)

_DIED = tuple(c for c in (getattr(rex, n, None) for n in (
    "RayActorError", "WorkerCrashedError", "NodeDiedError", "OwnerDiedError", "ActorUnavailableError"))
    if isinstance(c, type))


class RayBackend:
    """`Backend` over Ray actors (module docstring). ``max_restarts``: restarts Ray grants each actor;
    ``placement_timeout_s``: how long `start` waits for an actor to be placed before `PlacementError`;
    ``config_keys``: the config keys its error names (`bapsql.rollout.placement.SWEEP_KEYS` / ``TRAIN_KEYS``).

    While Ray restarts an actor, calls to it fail fast (``ActorUnavailableError``); so after a death the backend
    holds new calls to that actor back and probes ``__ray_ready__`` until the new incarnation answers, then sends
    them in order (an actor that stays dead — restarts exhausted — fails them as died)."""

    def __init__(self, *, max_restarts: int = 3, probe_s: float = 600.0, placement_timeout_s: float = 60.0,
                 config_keys: ConfigKeys = SWEEP_KEYS):
        self.max_restarts = max_restarts
        self.probe_s = probe_s
        self.placement_timeout_s = placement_timeout_s
        self.config_keys = config_keys
        self.handles: dict[ActorKey, Any] = {}
        self._refs: dict[Any, tuple[int, ActorKey, str]] = {}
        self._probes: dict[Any, tuple[ActorKey, float]] = {}  # __ray_ready__ ref -> (actor, first probe time)
        self._held: dict[ActorKey, list[tuple[int, str, tuple]]] = {}  # calls waiting for a restarting actor
        self._failed: list[Outcome] = []
        self._next = 0

    def start(self, specs: list[ActorSpec], *, timeout_s: float = 900.0, progress: Any = None) -> None:
        """Create every actor, then wait until each constructor has run: a broken one fails here, loudly, and so
        does an actor the cluster does not place within ``placement_timeout_s`` (`PlacementError` naming it, what
        it asked for, what each node offers and the config keys that change it; every actor is released first).
        Actors pinned to the driver's node are created and placed first, so they hold their share of that node
        before any env worker is placed; env workers stay off the head when `avoid_head` says so. ``progress``:
        a `bapsql.progress.Progress` over ``len(specs)`` actors, updated while they are being placed."""
        from bapsql.rollout.placement import avoid_head

        t0 = time.monotonic()
        nodes = node_offers()
        avoid = {s.key: avoid_head(spec_asks(s), nodes) if s.placement == "spread" else None for s in specs}
        asks = {s.key: spec_asks(s) for s in specs}
        where = {s.key: where_text(s, avoid[s.key]) for s in specs}
        bounds = dict(asks=asks, where=where, keys=self.config_keys, placement_timeout_s=self.placement_timeout_s,
                      started=t0)
        pinned = [s for s in specs if s.placement == "driver"]
        try:
            for group in (pinned, [s for s in specs if s.placement != "driver"]):
                for spec in group:
                    opts = actor_options(spec, max_restarts=self.max_restarts, avoid_node=avoid[spec.key])
                    self.handles[spec.key] = ray.remote(spec.cls).options(**opts).remote(*spec.args, **spec.kwargs)
                if group is pinned and pinned:  # they reserve their node's share before anything else is placed
                    await_actors({s.key: self.handles[s.key] for s in pinned}, ready=False, **bounds)
            await_actors(self.handles, timeout_s=timeout_s, progress=progress, **bounds)
        except BaseException:
            for h in self.handles.values():  # release them all: nothing half-started stays in the cluster
                with contextlib.suppress(Exception):
                    ray.kill(h, no_restart=True)
            self.handles.clear()
            raise

    def submit(self, key: ActorKey, method: str, *args: Any) -> int:
        self._next += 1
        if key in self._held:
            self._held[key].append((self._next, method, args))
        else:
            self._send(self._next, key, method, args)
        return self._next

    def _send(self, ticket: int, key: ActorKey, method: str, args: tuple) -> None:
        ref = getattr(self.handles[key], method).remote(*args)
        self._refs[ref] = (ticket, key, method)

    def _probe(self, key: ActorKey, since: float) -> None:
        self._probes[self.handles[key].__ray_ready__.remote()] = (key, since)

    def _probed(self, ref: Any) -> None:
        key, since = self._probes.pop(ref)
        try:
            ray.get(ref)
        except rex.ActorUnavailableError:  # still restarting
            if time.monotonic() - since < self.probe_s:
                self._probe(key, since)
                return
            held = self._held.pop(key, [])
            self._failed += [Outcome(t, key, m, died=True) for t, m, _ in held]
            return
        except _DIED:  # gone for good (restarts exhausted): its calls die
            held = self._held.pop(key, [])
            self._failed += [Outcome(t, key, m, died=True) for t, m, _ in held]
            return
        for ticket, method, args in self._held.pop(key, []):
            self._send(ticket, key, method, args)

    def poll(self, timeout: float) -> list[Outcome]:
        out, self._failed = self._failed, []
        if not self._refs and not self._probes:
            return out
        waiting = [*self._refs, *self._probes]
        ready, _ = ray.wait(waiting, num_returns=1, timeout=0 if out else timeout)
        if ready:
            more, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
            ready = list(dict.fromkeys([*ready, *more]))
        for ref in ready:
            if ref in self._probes:
                self._probed(ref)
                continue
            ticket, key, method = self._refs.pop(ref)
            try:
                out.append(Outcome(ticket, key, method, value=ray.get(ref)))
            except _DIED:
                out.append(Outcome(ticket, key, method, died=True))
                if key not in self._held:  # hold later calls until the new incarnation is up
                    self._held[key] = []
                    self._probe(key, time.monotonic())
            except rex.RayTaskError as exc:  # the actor's own code raised
                cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
                out.append(Outcome(ticket, key, method, error=cause))
        out += self._failed
        self._failed = []
        return out

    def pending(self) -> int:
        return len(self._refs) + sum(len(v) for v in self._held.values()) + len(self._failed)

    def restarts(self) -> dict[ActorKey, int]:
        """Actor key → how many times Ray restarted it (the GCS's count; only keys restarted at least once)."""
        return {k: n for k, n in actor_restarts(self.handles).items() if n}

    def nodes(self) -> dict[ActorKey, str]:
        """Actor key → the node id it runs on now."""
        return actor_node_ids(self.handles)

    def call(self, key: ActorKey, method: str, *args: Any, timeout: float | None = None) -> Any:
        """A blocking call (setup and teardown only: the driver uses submit/poll)."""
        return ray.get(getattr(self.handles[key], method).remote(*args), timeout=timeout)

    def kill(self, key: ActorKey, *, restart: bool = True) -> None:
        """Kill an actor's process; with ``restart`` Ray brings it back (fault tests, drills)."""
        ray.kill(self.handles[key], no_restart=not restart)

    def shutdown(self) -> None:
        """Close every actor (best effort) and release it; the cluster itself keeps running."""
        refs = [h.close.remote() for h in self.handles.values() if hasattr(h, "close")]
        with contextlib.suppress(Exception):
            ray.get(refs, timeout=60)
        for h in self.handles.values():
            with contextlib.suppress(Exception):
                ray.kill(h, no_restart=True)
        self.handles.clear()
        self._refs.clear()

