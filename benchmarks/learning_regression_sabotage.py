"""The learning regression test's slice, run for real and with each sabotage it must catch.

    python benchmarks/learning_regression_sabotage.py [--only real,sign,mask_inverted,mask_ones,no_sync] [--seed 0]
        [--backbone tiny|smollm2]

Runs `tests.train.learning_slice.run_slice` (start policy → served success → real GRPO loop → served success)
once per variant and prints before / after success of the served policy and the sampled success per update:

- ``real``: as the test runs it;
- ``sign``: every sample's advantage negated (`build_samples` as the loop calls it);
- ``mask_inverted``: the loss mask flipped (loss on prompt and observation tokens, none on the policy's own);
- ``mask_ones``: the loss mask all ones (policy tokens plus prompt and observations; position 0 stays 0);
- ``no_sync``: weight sync after the first one saves the adapter but neither pushes it to the engine nor checks
  it (a sync whose check would have raised is silenced, to see what the served policy does). The loop's
  served-adapter check (`GRPOTrainer._check_served`) still sees that the engine served an older adapter than the
  trajectories' policy version and raises `WeightSyncError`, so the test errors; the line says so.

The test (`tests/train/loop/test_learning_regression.py`) asserts ``after − before ≥ MARGIN``; each line says
whether the variant would pass it. ``--backbone smollm2`` runs the SmolLM2 slice
(`tests.train.learning_slice.SMOLLM2`), which no test runs (see its comment); its lines use the same margin.
Monkeypatching here only; nothing of it is in the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("real", "sign", "mask_inverted", "mask_ones", "no_sync")


@contextmanager
def sabotage(kind: str):
    """Patch the training path for one variant; undone on exit."""
    import bapsql.train.loop.trainer as loop
    from bapsql.train.learner.weight_sync import SyncReport, WeightSync

    saved = (loop.build_samples, WeightSync.sync)

    def rewrite(fn):
        def build(*args, **kw):
            samples, info = saved[0](*args, **kw)
            return [fn(s) for s in samples], info
        return build

    def mask(s, ones: bool):
        m = [1] * len(s.loss_mask) if ones else [1 - x for x in s.loss_mask]
        m[0] = 0  # the first token has no logprob
        return dataclasses.replace(s, loss_mask=tuple(m))

    def stale_sync(self, version):
        if version == 0:
            return saved[1](self, version)
        path = self.learner.save_adapter(self.dir / f"v{version:06d}")
        return SyncReport(version, str(path), 0.0, 0.0, 0.0, 0.0, 0.0, float("nan"), self.tolerance)

    if kind == "sign":
        loop.build_samples = rewrite(lambda s: dataclasses.replace(s, advantage=-s.advantage))
    elif kind in ("mask_inverted", "mask_ones"):
        loop.build_samples = rewrite(lambda s: mask(s, kind == "mask_ones"))
    elif kind == "no_sync":
        WeightSync.sync = stale_sync
    elif kind != "real":
        raise SystemExit(f"unknown variant {kind}; use {', '.join(VARIANTS)}")
    try:
        yield
    finally:
        loop.build_samples, WeightSync.sync = saved


def main() -> None:
    from bapsql.errors import WeightSyncError
    from tests.train.learning_slice import SMOLLM2, SliceSettings, run_slice
    from tests.train.loop.test_learning_regression import MARGIN

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(VARIANTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backbone", choices=("tiny", "smollm2"), default="tiny",
                    help="the tiny slice, or SmolLM2-135M-Instruct's (fetched on first use)")
    a = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    s = SliceSettings(seed=a.seed) if a.backbone == "tiny" else dataclasses.replace(SMOLLM2, seed=a.seed)
    print(json.dumps({"settings": dataclasses.asdict(s), "margin": MARGIN}), flush=True)
    for kind in a.only.split(","):
        t = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix=f"lr-{kind}-") as tmp, sabotage(kind):
                r = run_slice(s, Path(tmp), log=lambda m: print(f"  [{kind}] {m}", flush=True))
        except WeightSyncError as exc:  # the loop's served-adapter check caught the sabotage: the test errors
            print(json.dumps({"variant": kind, "passes_test": False, "raised": f"WeightSyncError: {exc}",
                              "seconds": round(time.perf_counter() - t)}), flush=True)
            continue
        print(json.dumps({
            "variant": kind, "before": round(r.before, 3), "after": round(r.after, 3),
            "gain": round(r.after - r.before, 3), "passes_test": r.after - r.before >= MARGIN,
            "sampled_success": [round(h["success/all"], 2) for h in r.history],
            "kept_groups": [int(h["filter/kept_groups"]) for h in r.history],
            "sync_discriminative": [int(h.get("sync/discriminative", 0)) for h in r.history],
            "sync_mismatch": [round(h["sync/logprob_mismatch_mean"], 4) for h in r.history],
            "stage_seconds": {k: round(v) for k, v in r.seconds.items()},
            "seconds": round(time.perf_counter() - t)}), flush=True)


if __name__ == "__main__":
    main()
