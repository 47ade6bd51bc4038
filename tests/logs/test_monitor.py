"""Run monitors: null, in-memory and a real offline W&B run (bapsql/logs/monitor.py)."""

from __future__ import annotations

import json

import pytest

from bapsql.errors import ConfigError
from bapsql.logs.monitor import (
    MemoryMonitor,
    Monitor,
    NullMonitor,
    WandbMonitor,
    make_monitor,
    wandb_api_key_configured,
)


def test_monitors_satisfy_the_protocol():
    assert isinstance(NullMonitor(), Monitor) and isinstance(MemoryMonitor(), Monitor)
    assert isinstance(make_monitor("none"), NullMonitor)
    assert isinstance(make_monitor("memory"), MemoryMonitor)
    with pytest.raises(ConfigError, match="unknown kind 'tensorboard'"):
        make_monitor("tensorboard")


def test_memory_monitor_keeps_everything():
    m = MemoryMonitor()
    m.log({"loss": 1.0}, step=0)
    m.log({"loss": 0.5, "reward": 0.2}, step=1)
    m.log_table("success_histogram", [{"k": 2, "groups": 5}, {"k": 8, "groups": 1}])
    m.log_table("val/trajectories", [{"turn": 1}], step=1)
    m.log_table("val/trajectories", [{"turn": 2}], step=5)
    m.summary({"frontier": 37.9})
    m.close()
    assert m.history == [(0, {"loss": 1.0}), (1, {"loss": 0.5, "reward": 0.2})]
    assert m.tables["success_histogram"][1] == {"k": 8, "groups": 1}
    assert m.tables["val/trajectories"] == [{"turn": 2}]  # the last one logged
    assert [(n, s) for n, s, _ in m.table_log] == [("success_histogram", None), ("val/trajectories", 1),
                                                   ("val/trajectories", 5)]
    assert m.final == {"frontier": 37.9} and m.closed


def test_api_key_detection(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    assert not wandb_api_key_configured()
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_api_key_configured()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert not wandb_api_key_configured()
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_api_key_configured()


@pytest.mark.slow  # several seconds: the slow tier
def test_offline_wandb_run_writes_under_the_run_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    home, cwd, run_dir = tmp_path / "home", tmp_path / "cwd", tmp_path / "run"
    for d in (home, cwd):
        d.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    for var, sub in (("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DIR", "unused")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.chdir(cwd)

    m = make_monitor("wandb", project="bapsql-test", run_name="grpo-seed0", config={"lr": 1e-6}, dir=run_dir)
    assert isinstance(m, WandbMonitor) and m.mode == "offline"
    m.log({"loss": 1.0, "reward": 0.1}, step=0)
    m.log({"loss": 0.5, "reward": 0.3}, step=1)
    m.log_table("success_histogram", [{"k": 2, "groups": 5}, {"k": 8, "groups": 1, "note": "all solved"}])
    m.log_table("trajectories", [{"turn": 1, "completion": "SELECT 1"}, {"turn": 2, "completion": None}], step=4)
    m.summary({"frontier": 37.9})
    m.close()

    assert list(cwd.iterdir()) == []
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    records = list(runs[0].glob("run-*.wandb"))
    assert len(records) == 1 and records[0].stat().st_size > 0
    tables = list(runs[0].glob("files/media/table/success_histogram_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"] == ["k", "groups", "note"]
    assert table["data"] == [[2, 5, None], [8, 1, "all solved"]]
    (traj,) = runs[0].glob("files/media/table/trajectories_*.table.json")
    assert json.loads(traj.read_text())["data"] == [[1, "SELECT 1"], [2, None]]
