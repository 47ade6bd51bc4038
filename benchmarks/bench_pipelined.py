"""Pipelined GRPO (issue 14): the CPU learning recipe's GRPO phase at max_staleness 0 and 1, side by side.

    python benchmarks/bench_pipelined.py [--model builtin:tiny | DIR] [--updates 6] [--ray] [--out DIR]

Both runs use configs/train/cpu_learn_tiny.yaml's GRPO settings (terse prompt, reward, lr, temperature, drift logging)
on a small slice: XS and S budgets, ``--groups`` groups of ``--group-size`` per update, ``--max-new-tokens`` per
turn, the HF engine (float32, one thread) in-process — or, with ``--ray``, the engine and env worker in Ray actors
of a private local Ray — and the learner in the driver's process. ``--model`` is the policy's base (an SFT-merged
folder such as a recipe run's ``<run>/sft/merged``; default ``builtin:tiny``, which never succeeds, so the filter
band is opened with ``--filter off`` by default to keep every group and the learner busy).

The two trainers are built side by side and their updates are *interleaved* (update 1 of k=0, update 1 of k=1,
update 2 of k=0, ...), so the machine's load (shared, noisy) hits both alike. Per run: wall time of its updates
(the first pipelined update includes generating two batches), trajectories trained per second, updates per hour,
engine idle share (1 − rollout time / wall), learner idle share (1 − (learner + drift) / wall), mean staleness and
importance-weight statistics. Writes ``results.json`` and ``success.png`` (success per update of both) under
``--out`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build(cfg, base, run_dir: Path, backend_kind: str):
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.env.conditions import method_name
    from bapsql.env.records import EnvOptions
    from bapsql.logs.monitor import NullMonitor
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.rollout.agent import AgentConfig
    from bapsql.train.learner.core import Learner
    from bapsql.train.learner.weight_sync import make_probe
    from bapsql.train.loop.engine_setup import engine_config
    from bapsql.train.loop.overlap import make_trainer
    from bapsql.train.loop.rollouts import TrainingRollouts

    tasks = load_tasks(resolve_benchmark(cfg.data.benchmark), cfg.data.split, limit=cfg.data.limit)
    learner = Learner(cfg.learner_config(base, "grpo", seed=0, total_steps=cfg.grpo.updates))
    if backend_kind == "ray":
        from bapsql.rollout.ray_shell import RayBackend

        backend = RayBackend()
    else:
        from bapsql.rollout.backend import LocalBackend

        backend = LocalBackend()
    rollouts = TrainingRollouts(
        backend, run_name=run_dir.name, method=method_name(cfg.rollout.method, cfg.condition),
        agent=AgentConfig(model_dir=str(base), max_tokens=cfg.grpo.max_new_tokens, temperature=cfg.grpo.temperature,
                          top_p=cfg.grpo.top_p),
        engine=engine_config(cfg, base, lora=True), tasks=tasks, group_size=cfg.filter.group_size, env_workers=1,
        env_options=EnvOptions(prompt_style=cfg.prompt_style).under(cfg.condition), writer_dir=None,
        engine_threads=1)
    trainer = make_trainer(cfg, seed=0, learner=learner, rollouts=rollouts, tasks=tasks,
                           probe=make_probe(ChatTemplate.from_dir(base), cfg.sync.probe_completion_tokens),
                           run_dir=run_dir, monitor=NullMonitor())
    return trainer, rollouts


def summarize(records, walls, group_size: int) -> dict:
    wall = sum(walls)
    ms = [r.metrics for r in records]
    trajectories = sum(m["filter/drawn_groups"] for m in ms) * group_size
    rollout = sum(m["time/rollout_s"] for m in ms)
    learner = sum(m["time/learner_s"] + m.get("time/drift_s", 0.0) for m in ms)
    steady = walls[1:] or walls
    return {"updates": len(ms), "wall_s": wall, "trajectories": trajectories, "trajectories_per_s": trajectories / wall,
            "updates_per_hour": 3600 * len(ms) / wall, "steady_updates_per_hour": 3600 * len(steady) / sum(steady),
            "engine_idle_share": max(0.0, 1 - rollout / wall), "learner_idle_share": max(0.0, 1 - learner / wall),
            "rollout_s": rollout, "learner_s": learner,
            "staleness_mean": sum(m.get("staleness/mean", 0.0) for m in ms) / len(ms),
            "is_weight_mean": [m.get("learner/is_weight_mean") for m in ms],
            "is_weight_max": [m.get("learner/is_weight_max") for m in ms],
            "success": [m["success/all"] for m in ms], "update_walls": walls}


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for k, r in results.items():
        ax.plot(range(1, len(r["success"]) + 1), r["success"], marker="o",
                label=f"max_staleness {k}: {r['updates_per_hour']:.0f} updates/h")
    ax.set_xlabel("update")
    ax.set_ylabel("success (all trajectories drawn)")
    ax.set_title("GRPO success per update, synchronous vs pipelined")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--updates", type=int, default=6)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--filter", choices=("on", "off"), default="off")
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_pipelined_"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "offline")

    import torch

    from bapsql.models.resolve import resolve_model
    from bapsql.train.config import load_train_config

    torch.set_num_threads(1)
    base = Path(resolve_model(args.model))
    over = {"out_dir": str(out), "grpo.updates": args.updates, "grpo.sft_init": "none", "model.base": str(base),
            "pretrain.enabled": False, "grpo.max_new_tokens": args.max_new_tokens, "monitor.kind": "none",
            "rollout.use_ray": args.ray, "budgets.levels": ["XS", "S"], "checkpoint.every": 10_000,
            "rollout.engine": {"kind": "hf", "dtype": "float32", "device": "cpu", "num_threads": 1},
            "filter.group_size": args.group_size, "filter.groups_per_update": args.groups,
            "filter.max_groups_per_round": 2 * args.groups, "filter.enabled": args.filter == "on",
            "filter.min_success": 1, "filter.max_success": args.group_size - 1,
            "grpo.validate_every": 0, "grpo.keep": "last"}  # in-loop validation is for the synchronous loop only
    cfgs = {k: load_train_config(REPO / "configs/train/cpu_learn_tiny.yaml", {**over, "grpo.max_staleness": k})
            for k in (0, 1)}
    ray_ctx = None
    if args.ray:
        from bapsql.rollout.ray_shell import local_ray, short_temp_dir

        ray_ctx = local_ray(num_cpus=6, temp_dir=short_temp_dir(out / "ray"), env_vars={"PYTHONPATH": str(REPO)})
        ray_ctx.__enter__()
    try:
        runs = {k: build(cfg, base, out / f"k{k}", "ray" if args.ray else "local") for k, cfg in cfgs.items()}
        for trainer, _ in runs.values():
            trainer.start()
        records = {k: [] for k in runs}
        walls = {k: [] for k in runs}
        load_before = os.getloadavg()
        for _ in range(args.updates):
            for k, (trainer, _) in runs.items():
                t = time.perf_counter()
                records[k].append(trainer.step())
                walls[k].append(time.perf_counter() - t)
                m = records[k][-1].metrics
                print(f"k={k} update {len(walls[k])}: {walls[k][-1]:.1f} s (rollout {m['time/rollout_s']:.1f} s, "
                      f"learner {m['time/learner_s']:.1f} s), success {m['success/all']:.2f}", file=sys.stderr,
                      flush=True)
        load_after = os.getloadavg()
        for _, rollouts in runs.values():
            rollouts.close()
    finally:
        if ray_ctx is not None:
            ray_ctx.__exit__(None, None, None)
    results = {k: summarize(records[k], walls[k], args.group_size) for k in runs}
    speedup = results[1]["trajectories_per_s"] / results[0]["trajectories_per_s"]
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results, "speedup": speedup,
                                                  "loadavg_before": load_before, "loadavg_after": load_after},
                                                 indent=1))
    plot(results, out / "success.png")
    print(f"model {args.model}, {args.updates} updates x {args.groups} groups x {args.group_size}, "
          f"{'Ray actors' if args.ray else 'in-process'} HF engine; load average before {load_before[0]:.2f}, "
          f"after {load_after[0]:.2f} (1 min)")
    print("| max_staleness | wall s | trajectories/s | updates/h | steady updates/h | engine idle | learner idle | "
          "mean staleness | success per update |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k, r in results.items():
        print(f"| {k} | {r['wall_s']:.1f} | {r['trajectories_per_s']:.3f} | {r['updates_per_hour']:.0f} | "
              f"{r['steady_updates_per_hour']:.0f} | {r['engine_idle_share']:.0%} | {r['learner_idle_share']:.0%} | "
              f"{r['staleness_mean']:.2f} | {' '.join(f'{s:.2f}' for s in r['success'])} |")
    print(f"speed-up (trajectories/s, k=1 over k=0): {speedup:.2f}x; figures in {out}")


if __name__ == "__main__":
    main()
