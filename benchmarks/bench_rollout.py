"""Rollout throughput: the agent loop vs raw engine batches, env-worker scaling on Ray, Ray overhead.

    python benchmarks/bench_rollout.py [--engine vllm|hf] [--episodes 128] [--loop step|rounds] [--part all|agent|scale]

1. agent loop: ``--episodes`` tiny-model episodes (budget M, at most 64 tokens per completion) played together
   with the engine's continuous batching (`bapsql.rollout.agent.run_agents` over `Engine.step`: each episode's next
   request joins the running batch as soon as its observation is ready, as in the driver). Its generated tokens per
   second of wall time are compared with the same engine generating the same tokens as ONE raw batch (every request
   the loop made — same prompt ids, same seeded params — in one ``generate``). Target ratio >= 0.85. Also printed:
   the time spent outside ``step`` (env stepping, token accounting, token-in/token-out bookkeeping; the engine core
   keeps decoding meanwhile).
2. scaling: scripted episodes (estimate→rewrite and the raw agent at XS and L, seed 0) over every task of the
   embedded benchmark's train split (236 tasks on 6 databases) with 1, 2 and 4 env workers on a private local Ray.
3. overhead: the same scripted episodes through the in-process runner (`bapsql.rollout.runner.evaluate`), the driver
   on the in-process backend, and the driver on Ray with 1 env worker.
Prints one line per figure; a `__main__` guard because vLLM spawns processes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path


def _rounds(agents, timed) -> int:
    """The synchronous alternative, for comparison: one batched ``generate`` per round over every live episode, each
    round waiting for its longest completion (what the agent loop did before `Engine.step`)."""
    generated, live = 0, [a for a in agents if not a.done]
    while live:
        reqs = [a.request() for a in live]
        t0 = time.perf_counter()
        gens = timed.inner.generate([r.prompt_ids for r in reqs], [r.params for r in reqs])
        timed.seconds += time.perf_counter() - t0
        timed.calls.append(len(reqs))
        timed.requests += [(r.prompt_ids, r.params) for r in reqs]
        for a, g in zip(live, gens):
            a.advance(g)
            generated += len(g.completion_ids)
        live = [a for a in live if not a.done]
    return generated


def agent_vs_raw(engine_kind: str, n: int, loop: str = "step") -> None:
    from bapsql.budgets import load_ladder
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.handles import DatabaseHandles
    from bapsql.models.resolve import resolve_model
    from bapsql.rollout.agent import AgentConfig, ModelAgent, load_template
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.engines.factory import make_engine
    from bapsql.tokens import load_token_counter

    model = resolve_model("builtin:tiny")
    cfg = EngineConfig(kind=engine_kind, model=model, max_model_len=12288, num_threads=1, enforce_eager=True)
    t = time.perf_counter()
    engine = make_engine(cfg)
    print(f"engine {engine_kind} start: {time.perf_counter() - t:.1f} s")
    dev = load_tasks(resolve_benchmark("demo"), "dev")
    tasks = [dev[i % len(dev)] for i in range(n)]  # beyond the split's size: the same tasks again, new seeds
    template = load_template(model)
    handles = DatabaseHandles(load_token_counter(model))

    class Timed:  # the engine, timing each step call and recording the requests it admits
        def __init__(self, inner):
            self.inner, self.seconds, self.calls, self.requests = inner, 0.0, [], []

        def step(self, new, adapter=None):
            t0 = time.perf_counter()
            out = self.inner.step(new, adapter=adapter)
            self.seconds += time.perf_counter() - t0
            self.calls.append(self.inner.in_flight() + len(out))
            self.requests += [(p, sp) for _, p, sp in new]
            return out

        def in_flight(self):
            return self.inner.in_flight()

    timed = Timed(engine)
    agents = []
    for i, task in enumerate(tasks):
        env = BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles)
        a = ModelAgent(env, template, AgentConfig(model, max_tokens=64, temperature=1.0, max_model_len=12288),
                       episode_key=f"{task.task_id}#{i}", seed=i)
        a.reset(task, load_ladder()["M"])
        agents.append(a)
    from bapsql.rollout.agent import run_agents

    t0 = time.perf_counter()
    generated = run_agents(agents, timed) if loop == "step" else _rounds(agents, timed)
    wall = time.perf_counter() - t0
    # the same tokens as one raw batch: every request of the loop at once (same prompts, same seeded params), from a
    # cold prefix cache as the loop started (the loop's blocks would otherwise serve the replayed prompts)
    if hasattr(engine, "clear_cache"):
        engine.clear_cache()
    t0 = time.perf_counter()
    raw = engine.generate([p for p, _ in timed.requests], [sp for _, sp in timed.requests])
    raw_s = time.perf_counter() - t0
    raw_tokens = sum(len(g.completion_ids) for g in raw)
    agent_tps, raw_tps = generated / wall, raw_tokens / raw_s
    print(f"agent loop ({loop}): {len(agents)} episodes, {generated} tokens in {len(timed.calls)} {loop} calls "
          f"(≤ {max(timed.calls)} requests decoding), wall {wall:.1f} s = {agent_tps:.0f} tok/s, of which in step "
          f"{timed.seconds:.1f} s")
    print(f"raw batch: the loop's {len(timed.requests)} requests in one call, {raw_tokens} tokens, {raw_s:.1f} s "
          f"= {raw_tps:.0f} tok/s")
    print(f"ratio agent loop / raw batch: {agent_tps / raw_tps:.2f}; time outside step (env, bookkeeping): "
          f"{wall - timed.seconds:.1f} s of {wall:.1f} s")
    handles.close()
    engine.close()


LEVELS = ("XS", "L")


def _cfg(methods, workers, split="train"):
    from bapsql.experiment import ExperimentConfig, WorkersConfig, validate

    return validate(ExperimentConfig(run="bench", methods=tuple(methods), benchmark="demo", split=split,
                                     budgets=LEVELS, seeds=(0,),
                                     workers=WorkersConfig(env_workers=workers, env_worker_cpus=0.5, in_flight=64,
                                                           scripted_batch=4)))


def scaling_and_overhead() -> None:
    from bapsql.rollout.ray_shell import local_ray
    from bapsql.rollout.runner import evaluate
    from bapsql.rollout.sweep import run_sweep

    methods = ["workflow.estimate_rewrite", "scripted.drafter@raw"]
    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    def inprocess(tag: str) -> float:
        t0 = time.perf_counter()
        n = sum(evaluate("demo", "train", m, LEVELS, [0], work / f"inproc-{tag}", run_name="bench").episodes_run
                for m in methods)
        dt = time.perf_counter() - t0
        print(f"in-process runner ({tag}): {n} episodes in {dt:.1f} s = {n / dt:.1f} episodes/s")
        return dt

    inprocess("warm-up: opens databases, fills the catalog cache")
    inproc = inprocess("run 1")
    t0 = time.perf_counter()
    s = run_sweep(_cfg(methods, 1), out_dir=work / "local", backend="local")
    print(f"driver, in-process backend, 1 worker: {s.result.episodes_run} episodes, rollout {s.result.wall_s:.1f} s "
          f"= {s.result.episodes_per_s:.1f} episodes/s (total with setup {time.perf_counter() - t0:.1f} s)")
    with local_ray(num_cpus=4):
        for w in (1, 2, 4):
            s = run_sweep(_cfg(methods, w), out_dir=work / f"ray{w}")
            print(f"Ray, {w} env worker(s) ({s.env_workers} used): {s.result.episodes_run} episodes, rollout "
                  f"{s.result.wall_s:.1f} s = {s.result.episodes_per_s:.1f} episodes/s (actor setup {s.setup_s:.1f} s)")
            if w == 1:
                ray1 = s.result.wall_s
    inproc2 = inprocess("run 2")
    mean = (inproc + inproc2) / 2
    print(f"Ray overhead vs the in-process runner (1 env worker): {ray1 / mean - 1:+.0%} rollout time "
          f"({ray1:.1f} s vs {mean:.1f} s, mean of in-process runs 1-2)")
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    ap.add_argument("--episodes", type=int, default=128,
                    help="model episodes played at once (a GRPO rollout batch is groups x 8)")
    ap.add_argument("--part", choices=["all", "agent", "scale"], default="all")
    ap.add_argument("--loop", choices=["step", "rounds"], default="step",
                    help="agent loop: continuous batching (Engine.step) or synchronous rounds of generate")
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(f"bench_rollout: {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    if a.part in ("all", "agent"):
        agent_vs_raw(a.engine, a.episodes, a.loop)
    if a.part in ("all", "scale"):
        scaling_and_overhead()


if __name__ == "__main__":
    main()
