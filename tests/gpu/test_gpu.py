"""The GPU tier (marker ``gpu``; skipped without CUDA): the prepared check end to end, and a GPU learner's
checkpoint that a CPU-only process can read.

Run on a machine with one NVIDIA GPU: ``python -m pytest -m gpu tests/gpu -q`` (or ``bash scripts/gpu_check.sh``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
REPO = Path(__file__).resolve().parents[2]
STEPS = ("model", "learner", "agreement", "stale", "sft", "grpo", "eval")


def test_the_gpu_check_passes_every_step(tmp_path):
    """scripts/gpu_check.sh on the GPU: Qwen3-0.6B's shape with random weights, every step (bf16 learner at L, engine
    vs learner agreement, the stale adapter caught, SFT, GRPO + sync, a 16-episode evaluation) within 8 minutes."""
    import json

    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "RAY_AUTH_MODE": "disabled"}
    run = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [k for k, v in report["steps"].items() if v["status"] == "ok"] == list(STEPS)
    assert report["steps"]["learner"]["data"]["dtype"] == ["bfloat16"]  # dtype auto on a GPU


def test_a_gpu_learners_checkpoint_loads_in_a_cpu_only_process(tmp_path):
    from bapsql.models.tiny import make_tiny_model
    from bapsql.train.learner.checkpoint import TrainState, save_checkpoint
    from bapsql.train.config import LearnerConfig
    from bapsql.train.learner.core import Learner, Sample

    model = make_tiny_model(tmp_path / "model").out_dir
    learner = Learner(LearnerConfig(model_path=str(model), dtype="bfloat16", device="cuda"))
    learner.sft_update([Sample(tuple(range(10, 40)), (0,) * 15 + (1,) * 15)])
    path = save_checkpoint(tmp_path / "ckpt", learner, TrainState(update=1))
    code = ("import torch, sys; s = torch.load(sys.argv[1], weights_only=False); "
            "ts = [t for st in s['optimizer']['state'].values() for t in st.values() if torch.is_tensor(t)]; "
            "assert ts and all(t.device.type == 'cpu' for t in ts); print('ok', len(ts))")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a driver without a GPU
    out = subprocess.run([sys.executable, "-c", code, str(path / "trainer.pt")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]
    fresh = Learner(LearnerConfig(model_path=str(model), dtype="bfloat16", device="cuda", seed=3))
    fresh.load_state(path)
    assert fresh.step == 1
    for k, v in learner.adapter_state().items():
        torch.testing.assert_close(fresh.adapter_state()[k], v)
