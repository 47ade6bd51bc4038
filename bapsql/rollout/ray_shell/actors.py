"""The thin Ray shell: the ONLY module of bapsql that imports ray.

- `local_ray(...)` / `join_ray(address)`: context managers that start a private local Ray (its own temp dir,
  ``num_cpus`` set explicitly, bound to 127.0.0.1, no dashboard unless asked, token auth off for this loopback-only
  single-user cluster)
  or connect to a running cluster — and on exit only disconnect (``ray.shutdown()``), never ``ray stop``.
- `RayBackend`: the driver's `bapsql.rollout.backend.Backend` over Ray actors. Every actor is
  ``ray.remote(cls).options(max_restarts=..., max_task_retries=0, num_cpus=..., num_gpus=...)``: Ray restarts a dead
  actor by rerunning its constructor, and no call is retried behind the driver's back — the driver decides what
  to rerun (`bapsql.rollout.driver`). A call that fails because its actor died (`ray.exceptions.RayActorError`,
  a crashed worker process or a lost node) comes back as ``Outcome.died``; an exception from the actor's own code
  as ``Outcome.error``.

- `submit_job(address, entrypoint, runtime_env=...)`: a job (any ``python -m jobs.X ...``) submitted with Ray's
  ``JobSubmissionClient`` to a cluster's dashboard address, optionally followed to its end with its logs;
  `load_runtime_env` reads cluster/runtime_env.yaml (working_dir = the repository, excludes).

The classes it wraps (`bapsql.rollout.workers`) are plain and importable without Ray.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import ray
from ray import exceptions as rex

from bapsql.rollout.backend import ActorKey, ActorSpec, Outcome

# Ray's unix socket paths (temp dir + ~63 bytes of session/socket names) must fit sun_path (107 bytes).
_MAX_TEMP_DIR = 44
_DIED = tuple(c for c in (getattr(rex, n, None) for n in (
    "RayActorError", "WorkerCrashedError", "NodeDiedError", "OwnerDiedError", "ActorUnavailableError"))
    if isinstance(c, type))


def short_temp_dir(preferred_parent: str | Path | None = None) -> str:
    """A fresh temp dir for a local Ray: under ``preferred_parent`` when that keeps socket paths short enough,
    else under the system temp dir."""
    if preferred_parent is not None:
        parent = Path(preferred_parent).resolve()
        if len(str(parent)) + len("/ray-XXXXXXXX") <= _MAX_TEMP_DIR:
            parent.mkdir(parents=True, exist_ok=True)
            return tempfile.mkdtemp(prefix="ray-", dir=parent)
    return tempfile.mkdtemp(prefix="bapsql-ray-")


@contextlib.contextmanager
def local_ray(*, num_cpus: int, temp_dir: str | Path | None = None, include_dashboard: bool = False,
              env_vars: dict[str, str] | None = None) -> Iterator[dict]:
    """Start a private local Ray for the duration of the block; yields ``ray.init``'s context info as a dict."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private loopback cluster: no token to manage
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    tmp = str(temp_dir) if temp_dir is not None else short_temp_dir()
    runtime_env = {"env_vars": dict(env_vars)} if env_vars else None
    ctx = ray.init(num_cpus=num_cpus, _temp_dir=tmp, include_dashboard=include_dashboard, log_to_driver=False,
                   configure_logging=False, runtime_env=runtime_env, _node_ip_address="127.0.0.1")
    try:
        yield {"address": ctx.address_info.get("address"), "temp_dir": tmp, "num_cpus": num_cpus}
    finally:
        ray.shutdown()


@contextlib.contextmanager
def join_ray(address: str) -> Iterator[dict]:
    """Connect to a running cluster (``auto``, ``host:port`` or ``ray://…``); on exit only disconnect."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        yield {"address": address, "resources": ray.cluster_resources()}
    finally:
        ray.shutdown()


def ray_session(address: str | None, *, num_cpus: int, temp_dir: str | Path | None = None,
                include_dashboard: bool = False) -> contextlib.AbstractContextManager:
    """`join_ray` when ``address`` is given or ``RAY_ADDRESS`` is set (a submitted job's driver), reuse Ray when it
    is already initialized, else `local_ray`."""
    if ray.is_initialized():
        return contextlib.nullcontext({"address": "existing", "resources": ray.cluster_resources()})
    address = address or os.environ.get("RAY_ADDRESS")  # set for the driver of a submitted job
    if address:
        return join_ray(address)
    return local_ray(num_cpus=num_cpus, temp_dir=temp_dir, include_dashboard=include_dashboard)


class RayBackend:
    """`Backend` over Ray actors (module docstring). ``max_restarts``: restarts Ray grants each actor.

    While Ray restarts an actor, calls to it fail fast (``ActorUnavailableError``); so after a death the backend
    holds new calls to that actor back and probes ``__ray_ready__`` until the new incarnation answers, then sends
    them in order (an actor that stays dead — restarts exhausted — fails them as died)."""

    def __init__(self, *, max_restarts: int = 3, probe_s: float = 600.0):
        self.max_restarts = max_restarts
        self.probe_s = probe_s
        self.handles: dict[ActorKey, Any] = {}
        self._refs: dict[Any, tuple[int, ActorKey, str]] = {}
        self._probes: dict[Any, tuple[ActorKey, float]] = {}  # __ray_ready__ ref -> (actor, first probe time)
        self._held: dict[ActorKey, list[tuple[int, str, tuple]]] = {}  # calls waiting for a restarting actor
        self._failed: list[Outcome] = []
        self._next = 0

    def start(self, specs: list[ActorSpec], *, timeout_s: float = 900.0) -> None:
        """Create every actor, then wait until each constructor has run: a broken one fails here, loudly, and so
        does a set of actors the cluster cannot schedule (`RolloutError` naming what they need and what it has)."""
        from bapsql.errors import RolloutError

        for spec in specs:
            cls = ray.remote(spec.cls).options(
                num_cpus=spec.num_cpus, num_gpus=spec.num_gpus, max_restarts=self.max_restarts,
                max_task_retries=0, max_concurrency=1)
            self.handles[spec.key] = cls.remote(*spec.args, **spec.kwargs)
        refs = {h.__ray_ready__.remote(): key for key, h in self.handles.items()}
        ready, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        if waiting:
            for h in self.handles.values():  # release them all: nothing half-started stays in the cluster
                with contextlib.suppress(Exception):
                    ray.kill(h, no_restart=True)
            self.handles.clear()
            need_cpu = sum(s.num_cpus for s in specs)
            need_gpu = sum(s.num_gpus for s in specs)
            have = ray.cluster_resources()
            raise RolloutError(
                f"actors {[refs[r] for r in waiting]} did not start within {timeout_s:.0f} s; the sweep's actors "
                f"reserve {need_cpu:g} CPUs and {need_gpu:g} GPUs, the cluster has {have.get('CPU', 0):g} CPUs and "
                f"{have.get('GPU', 0):g} GPUs (lower workers.*_cpus / *_gpus or add nodes)")
        try:
            ray.get(ready)
        except _DIED as exc:  # a constructor raised: the actor never came up
            raise RolloutError(f"an actor failed to start: {exc}") from exc

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
        import time

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
        import time

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
        return {}

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


# ----------------------------------------------------------------------------------------------------- job submission
@dataclass(frozen=True)
class JobOutcome:
    """A submitted job: its id, its last known status (PENDING / RUNNING / SUCCEEDED / FAILED / STOPPED) and,
    when followed to the end, its logs."""

    job_id: str
    status: str
    logs: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "SUCCEEDED"


def load_runtime_env(path: str | Path | None, working_dir: str | Path) -> dict:
    """A runtime_env for a job: the YAML at ``path`` (see cluster/runtime_env.yaml), with a relative
    ``working_dir`` resolved against ``working_dir`` (the repository root), or just ``{"working_dir": ...}``."""
    from bapsql.config import read_yaml
    from bapsql.errors import ConfigError

    env: dict = {}
    if path is not None:
        raw = read_yaml(path)
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"{path}: a runtime_env is a mapping (working_dir, excludes, env_vars, pip, ...)")
        env = dict(raw or {})
    wd = Path(env.get("working_dir", "."))
    env["working_dir"] = str(wd if wd.is_absolute() else (Path(working_dir) / wd).resolve())
    return env


def submit_job(address: str, entrypoint: str, *, runtime_env: dict | None = None, job_id: str | None = None,
               follow: bool = False, echo: Any = None, on_submitted: Any = None, poll_s: float = 2.0,
               timeout_s: float | None = None) -> JobOutcome:
    """Submit ``entrypoint`` (a shell command, e.g. ``python -m jobs.sweep configs/...``) to the Ray cluster whose
    dashboard is at ``address`` (``http://HOST:8265``) with `ray.job_submission.JobSubmissionClient`;
    ``on_submitted(job_id)`` is called at once. With ``follow``, stream its logs to ``echo(line)`` and wait until
    it ends (or ``timeout_s``)."""
    import asyncio
    import time

    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    sid = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, submission_id=job_id)
    if on_submitted is not None:
        on_submitted(sid)
    if not follow:
        return JobOutcome(sid, str(client.get_job_status(sid).value))
    lines: list[str] = []

    async def tail() -> None:
        async for chunk in client.tail_job_logs(sid):
            lines.append(chunk)
            if echo is not None:
                echo(chunk.rstrip("\n"))

    start = time.monotonic()
    try:
        asyncio.run(asyncio.wait_for(tail(), timeout=timeout_s))
    except asyncio.TimeoutError:
        pass
    status = client.get_job_status(sid)
    while not status.is_terminal() and (timeout_s is None or time.monotonic() - start < timeout_s):
        time.sleep(poll_s)
        status = client.get_job_status(sid)
    if not lines:
        lines.append(client.get_job_logs(sid))
    return JobOutcome(sid, str(status.value), "".join(lines))
