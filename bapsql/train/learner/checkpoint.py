"""Training checkpoints that resume exactly (DESIGN §5).

A checkpoint is a folder ``<root>/update-<NNNNNN>/`` holding

- ``adapter/``: the LoRA adapter as peft saves it (``adapter_config.json``, ``adapter_model.safetensors``) — also
  what an engine loads to serve this policy;
- ``trainer.pt``: optimizer and scheduler state and the learner's step counter (tensors on the CPU);
- ``rng.pt``: the RNG states of the learner's process: python ``random``, numpy's global generator, torch (CPU and
  every CUDA device); ``driver_rng.pt``: the same of the driver's process (the same process unless the learner is a
  remote actor);
- ``state.json``: the update counter, the (task, budget) sampler's state (data order), the difficulty filter's
  state, and any extra JSON the loop keeps (e.g. the policy version and the metrics of the last update);
- any extra files the loop hands over (``files``: name → bytes), e.g. ``pending.pkl``, the pipelined loop's
  rollouts already generated for later updates (`bapsql.train.loop.overlap`).

Folders appear atomically (written under a hidden temporary name, then renamed), so a crash mid-write never leaves a
checkpoint that `latest_checkpoint` would pick; `prune` keeps the newest ``keep``. `load_checkpoint` restores the
learner (adapter tensors, optimizer, scheduler, step) and the RNG states, and returns the `TrainState` for the loop
to restore its sampler and filter from.

The learner writes and reads its own part (`Learner.save_state` / `Learner.load_state`: ``adapter/``, ``trainer.pt``,
``rng.pt``), so with the learner in a Ray actor on a GPU node (`bapsql.rollout.ray_shell.learner`) its tensors go
from that node to the (shared) checkpoint folder and back, loaded with ``map_location`` onto the learner's device; a
CPU-only driver never deserialises a GPU tensor. The checkpoint root must be on storage the learner's node and the
driver share (cluster/README.md).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bapsql.errors import ConfigError

_NAME = re.compile(r"^update-(\d{6})$")


@dataclass(frozen=True)
class TrainState:
    """What the loop needs besides the learner to continue: the update counter and plain-JSON component states."""

    update: int
    sampler: dict = field(default_factory=dict)
    filter: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def capture_rng() -> dict[str, Any]:
    """The RNG states of python, numpy (global) and torch (CPU + CUDA when available)."""
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_path(root: str | Path, update: int) -> Path:
    return Path(root) / f"update-{update:06d}"


def save_checkpoint(root: str | Path, learner: Any, state: TrainState, files: dict[str, bytes] | None = None) -> Path:
    """Write the checkpoint of ``state.update`` (and ``files``, name → bytes) under ``root`` atomically; returns its
    folder."""
    import torch

    final = checkpoint_path(root, state.update)
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    learner.save_state(tmp)
    torch.save(capture_rng(), tmp / "driver_rng.pt")
    (tmp / "state.json").write_text(json.dumps({
        "update": state.update, "sampler": state.sampler, "filter": state.filter, "extra": state.extra,
    }, indent=1, sort_keys=True))
    for name, data in (files or {}).items():
        (tmp / name).write_bytes(data)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoint folders under ``root``, oldest first."""
    r = Path(root)
    if not r.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in r.iterdir() if p.is_dir() and (m := _NAME.match(p.name))
             and (p / "state.json").is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def checkpoint_update(path: str | Path) -> int:
    """The update a checkpoint folder was saved at (its name, ``update-NNNNNN``); `ConfigError` for another name."""
    m = _NAME.match(Path(path).name)
    if m is None:
        raise ConfigError(f"{path} is not a checkpoint folder (expected a name like update-000001)")
    return int(m.group(1))


def prune(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns the deleted folders."""
    found = list_checkpoints(root)
    doomed = found[:-keep] if keep > 0 else found
    for p in doomed:
        shutil.rmtree(p)
    return doomed


def read_state(path: str | Path) -> TrainState:
    """The `TrainState` of a checkpoint folder, without touching a learner."""
    p = Path(path)
    if not (p / "state.json").is_file():
        raise ConfigError(f"{p} is not a checkpoint (no state.json)")
    raw = json.loads((p / "state.json").read_text())
    return TrainState(update=int(raw["update"]), sampler=raw["sampler"], filter=raw["filter"], extra=raw["extra"])


def load_checkpoint(path: str | Path, learner: Any, *, rng: bool = True) -> TrainState:
    """Restore ``learner`` (adapter tensors, optimizer, scheduler, step) and, with ``rng``, the RNG states of the
    driver's and the learner's processes."""
    import torch

    p = Path(path)
    state = read_state(p)
    if not (p / "adapter" / "adapter_model.safetensors").is_file():
        raise ConfigError(f"{p}: checkpoint has no adapter/adapter_model.safetensors")
    if rng and (p / "driver_rng.pt").is_file():
        restore_rng(torch.load(p / "driver_rng.pt", map_location="cpu", weights_only=False))
    learner.load_state(p, rng=rng)  # after the driver's: in one process the learner's states are the ones kept
    return state
