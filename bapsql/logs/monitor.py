"""Run monitors: where training and sweep metrics go while a run is live (the Parquet logs are the record).

Contract: a `Monitor` has ``log(metrics, step)``, ``log_table(name, rows, step=None)``, ``summary(values)`` and
``close()``. A table logged with a ``step`` goes to that step (give it when metrics are logged at explicit steps:
W&B drops anything logged at a step below its current one); without one, to the monitor's current step.
`NullMonitor` drops everything; `MemoryMonitor` keeps everything in lists (for tests and notebooks);
`WandbMonitor` sends to Weights & Biases, importing ``wandb`` only when constructed, writing its files under the
run directory (``WANDB_DIR``), and running offline when no API key is configured (so runs never block on a login;
sync later with ``wandb sync DIR/wandb/offline-run-*``). `make_monitor` builds one from a config string.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable
from urllib.parse import urlparse

from bapsql.errors import ConfigError

MONITOR_KINDS: tuple[str, ...] = ("wandb", "none", "memory")


@runtime_checkable
class Monitor(Protocol):
    """Where live metrics go. ``step`` is the training update (or sweep progress) index, non-decreasing."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_table(self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None) -> None: ...

    def summary(self, values: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class NullMonitor:
    """A monitor that drops everything."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_table(self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None) -> None:
        pass

    def summary(self, values: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryMonitor:
    """A monitor that keeps everything: ``history`` [(step, metrics)], ``tables`` {name: rows} (the last logged),
    ``table_log`` [(name, step, rows)] (every table logged), ``final`` summary."""

    def __init__(self) -> None:
        self.history: list[tuple[int, dict[str, float]]] = []
        self.tables: dict[str, list[dict[str, Any]]] = {}
        self.table_log: list[tuple[str, int | None, list[dict[str, Any]]]] = []
        self.final: dict[str, Any] = {}
        self.closed = False

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.history.append((int(step), dict(metrics)))

    def log_table(self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None) -> None:
        self.tables[name] = [dict(r) for r in rows]
        self.table_log.append((name, step, self.tables[name]))

    def summary(self, values: Mapping[str, Any]) -> None:
        self.final.update(values)

    def close(self) -> None:
        self.closed = True


def wandb_api_key_configured() -> bool:
    """True when ``WANDB_API_KEY`` is set or ``~/.netrc`` holds a login for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


class WandbMonitor:
    """Weights & Biases monitor; files go to ``dir/wandb``. ``mode`` None → ``$WANDB_MODE`` if set, else online
    with an API key and offline without one."""

    def __init__(self, project: str, run_name: str, config: Mapping[str, Any] | None, dir: str | Path, *,
                 mode: str | None = None, group: str | None = None, tags: Sequence[str] = ()):
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError("monitor 'wandb' needs the wandb package: pip install 'bapsql[wandb]'") from exc
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        if mode is None:
            mode = os.environ.get("WANDB_MODE") or ("online" if wandb_api_key_configured() else "offline")
        self.mode = mode
        os.environ["WANDB_DIR"] = str(self.dir)  # nothing lands in the working directory
        self._wandb = wandb
        self.run = wandb.init(project=project, name=run_name, config=dict(config or {}), dir=str(self.dir),
                              mode=mode, group=group, tags=list(tags) or None, reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off", save_code=False,
                                                      disable_git=True))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=int(step))

    def log_table(self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None) -> None:
        columns: list[str] = []
        for r in rows:
            columns.extend(k for k in r if k not in columns)
        table = self._wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
        self.run.log({name: table}, **({} if step is None else {"step": int(step)}))

    def summary(self, values: Mapping[str, Any]) -> None:
        self.run.summary.update(dict(values))

    def close(self) -> None:
        self.run.finish()


def make_monitor(kind: str, *, project: str = "bapsql", run_name: str = "run",
                 config: Mapping[str, Any] | None = None, dir: str | Path = ".") -> Monitor:
    """``"wandb"`` → `WandbMonitor`; ``"none"`` → `NullMonitor`; ``"memory"`` → `MemoryMonitor`."""
    if kind == "none":
        return NullMonitor()
    if kind == "memory":
        return MemoryMonitor()
    if kind == "wandb":
        return WandbMonitor(project, run_name, config, dir)
    raise ConfigError(f"monitor: unknown kind {kind!r}; use one of {list(MONITOR_KINDS)}")
