"""Job submission: any ``python -m jobs.X ...`` sent to a cluster's dashboard with Ray's ``JobSubmissionClient``.

`submit_job(address, entrypoint, runtime_env=...)` submits and, optionally, follows the job to its end with its
logs; `load_runtime_env` reads cluster/runtime_env.yaml (working_dir = the repository, excludes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
