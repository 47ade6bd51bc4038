"""Ray sessions: start a private local Ray, join a running cluster, or reuse the one this process is in.

`local_ray(...)` / `join_ray(address)` are context managers that start a private local Ray (its own temp dir,
``num_cpus`` set explicitly, bound to 127.0.0.1, no dashboard unless asked, token auth off for this loopback-only
single-user cluster) or connect to a running cluster — and on exit only disconnect (``ray.shutdown()``), never
``ray stop``. `ray_session` picks one of them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import ray

# Ray's unix socket paths (temp dir + ~63 bytes of session/socket names) must fit sun_path (107 bytes).
_MAX_TEMP_DIR = 44


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

    def start(where: str):
        return ray.init(num_cpus=num_cpus, _temp_dir=where, include_dashboard=include_dashboard, log_to_driver=False,
                        configure_logging=False, runtime_env=runtime_env, _node_ip_address="127.0.0.1")

    try:
        ctx = start(tmp)
    except RuntimeError as exc:
        if "Timed out waiting for file" not in str(exc):
            raise
        # the head's GCS process died before writing its port (seen once in 1,700 tests, a crash inside Ray's own
        # process): nothing of this private cluster is in use yet, so start it once more in a fresh temp dir
        print(f"local_ray: Ray's head did not come up ({exc}); starting it once more", file=sys.stderr)
        ray.shutdown()
        tmp = short_temp_dir(Path(tmp).parent) if temp_dir is not None else short_temp_dir()
        ctx = start(tmp)
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
