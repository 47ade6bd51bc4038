"""Bounded loopback load test of `bapsql serve` with a local model (issue 32; issue 15's harness check as ``--engine
chat --hostile``).

Everything runs on 127.0.0.1 over a small shop database (120 orders, 30 customers) in a temp folder: ``bapsql serve``
in its own process, the clients as threads of this one. It stops by itself: a fixed number of requests, every HTTP
call with a timeout, and a wall-clock budget (``--max-seconds``) past which clients send nothing new.

Engines (``--engine``):

- ``local`` (default): ``bapsql serve --model MODEL`` (``smollm2-135m-instruct``; ``--local-kind`` vllm | hf, default
  what ``bapsql serve`` picks): the model runs in the service's process behind its one batching scheduler thread;
- ``scripted``: a scripted vLLM-shaped engine (`tests.serve.local_engine.StepEngine`: one decoding step costs
  ``--step-ms`` whatever the batch) behind the same scheduler, for a fast check of the benchmark itself;
- ``chat``: a scripted OpenAI-compatible chat server in its own process (the issue-15 harness measurement).

Phases: ``--warmup`` untimed requests; 1 client x ``--requests`` requests (the baseline); ``--clients`` clients x
``--requests`` requests each (closed loop, questions rotating). Reported per phase: per turn, p50 / p95 of the turn's
time in the service (engine + database + harness) and of the engine's share; per request, the client's round trip;
requests and turns per second; errors (any non-200 answer or failed call). ``batching_gain`` is the load phase's
turns/s over the baseline's. ``logged``: after shutdown the episodes table holds each answered request's episode
exactly once, and only those (the 429 case is not an episode). Then a probe service (``--concurrency 1 --max-queue
0``; for ``local`` with vLLM its engine core runs in its own process) shows:

- ``case_429``: a second request while one runs → 429 with ``Retry-After``;
- ``case_503``: the engine killed (vLLM: SIGKILL to its ``EngineCore`` process; scripted: SIGUSR1 to the service,
  whose engine then behaves so) →
  a request answers 503 naming the cause, ``/healthz`` answers 503 with the reason, and once the service has rebuilt
  the engine ``/healthz`` is 200 again and a request is answered.

    python benchmarks/bench_serve.py                       # 32 clients x 20 requests, SmolLM2, budget XS
    python benchmarks/bench_serve.py --engine scripted --clients 2 --requests 2 --warmup 0
    python benchmarks/bench_serve.py --engine chat --clients 32 --requests 20 --concurrency 8 --hostile
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' scripted engines and fixtures

from bapsql.logs.reader import read_table  # noqa: E402
from tests.serve.conftest import COUNT_Q, INJECT_Q, free_port, make_shop, plans, sha256  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = (COUNT_Q, "How many customers live in Oslo?", "What is the largest order total?",
             "Which city has the most customers?", "How many orders has customer 7 placed?",
             "What is the average order total?", "List the names of customers in Lima.",
             "What is the total of all orders of customer 3?")
CHAT_SERVER = """
import sys
from tests.serve.chat_server import ScriptedChatServer
from tests.serve.conftest import plans
with ScriptedChatServer(plans()) as server:
    print(server.base_url, flush=True)
    sys.stdin.read()
"""
SCRIPTED_SERVICE = """
import json, signal, sys, time
import uvicorn
from tests.serve.conftest import build_local_service, plans
from tests.serve.local_engine import StepEngine
a = json.loads(sys.argv[1])
script = {q: plans()[a["count_q"]] for q in a["questions"]}
make = lambda: StepEngine(script, step_s=a["step_s"])
rebuild = lambda: time.sleep(2.0) or make()  # a restart takes a while, as loading a model does
asker, app = build_local_service([a["db"]], make(), a["log_dir"], concurrency=a["concurrency"],
                                 max_queue=a["max_queue"], request_timeout_s=a["timeout_s"], restart=rebuild)
signal.signal(signal.SIGUSR1, lambda *_: asker.engine.kill_core())  # as vLLM's engine core process dying
try:
    uvicorn.run(app, host="127.0.0.1", port=a["port"], log_level="warning")
finally:
    asker.close()
"""


class Service:
    """One ``bapsql serve`` (or scripted service) process on a free loopback port."""

    def __init__(self, args, tmp: Path, db: Path, name: str, *, concurrency: int, max_queue: int,
                 separate_engine: bool = False):
        self.port, self.log_dir = free_port(), tmp / f"logs-{name}"
        self.helper: subprocess.Popen | None = None
        env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_LOGGING_LEVEL": "WARNING"}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
        common = ["--port", str(self.port), "--log-dir", str(self.log_dir), "--concurrency", str(concurrency),
                  "--max-queue", str(max_queue), "--request-timeout", str(args.request_timeout), "--budget",
                  args.budget, "--max-tokens", str(args.max_tokens)]
        if args.engine == "scripted":
            spec = {"db": str(db), "port": self.port, "log_dir": str(self.log_dir), "concurrency": concurrency,
                    "max_queue": max_queue, "timeout_s": args.request_timeout, "step_s": args.step_ms / 1000,
                    "questions": list(QUESTIONS), "count_q": COUNT_Q}
            cmd = [sys.executable, "-c", SCRIPTED_SERVICE, json.dumps(spec)]
        elif args.engine == "chat":
            self.helper = subprocess.Popen([sys.executable, "-c", CHAT_SERVER], cwd=REPO, env=env,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            url = self.helper.stdout.readline().strip()
            cmd = [sys.executable, "-m", "bapsql", "serve", "--db", str(db), "--engine", f"openai_chat:{url}",
                   "--model", "scripted", *common]
        else:
            engine = ["--model", args.model] + (["--engine", args.local_kind] if args.local_kind else [])
            if separate_engine:
                engine = ["--engine", str(_engine_yaml(args, tmp))]
            cmd = [sys.executable, "-m", "bapsql", "serve", "--db", str(db), *engine, *common]
        self.log = open(tmp / f"{name}.log", "w")
        self.proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_up(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while health(self.port)[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.flush()
                raise SystemExit(f"the service did not come up; see {self.log.name}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # uvicorn shuts down; the service flushes its log
        try:
            self.proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.helper is not None:
            self.helper.stdin.close()
            self.helper.wait(timeout=30)
        self.log.close()


def _engine_yaml(args, tmp: Path) -> Path:
    """An engine YAML for the local model with vLLM's engine core in its own process (so it can be killed)."""
    from bapsql.models.resolve import resolve_model

    folder = resolve_model(args.model)
    positions = json.loads((Path(folder) / "config.json").read_text())["max_position_embeddings"]
    path = tmp / "engine-separate.yaml"
    path.write_text(f"engine: {{kind: vllm, model: '{folder}', max_model_len: {min(positions, 16384)}, "
                    "engine_process: separate}\n")
    return path


def request(port: int, path: str, body: bytes, timeout_s: float) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw or b"{}"), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def health(port: int) -> tuple[int, dict]:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    except OSError:
        return -1, {}


def ask_body(i: int, budget: str) -> bytes:
    return json.dumps({"db": "shop", "question": QUESTIONS[i % len(QUESTIONS)], "budget": budget}).encode()


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return round(1000 * xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))], 1) if xs else None


def run_phase(port: int, clients: int, per_client: int, args, deadline: float, offset: int = 0) -> dict:
    """``clients`` closed-loop clients sending ``per_client`` requests each (none past ``deadline``)."""
    results: list[tuple[float, int, dict | str]] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for k in range(per_client):
            if time.monotonic() > deadline:
                return
            t0 = time.perf_counter()
            try:
                status, out, _ = request(port, "/v1/ask", ask_body(offset + c * per_client + k, args.budget),
                                         args.request_timeout + 30)
            except Exception as exc:  # noqa: BLE001 - counted as an error
                status, out = -1, repr(exc)
            with lock:
                results.append((time.perf_counter() - t0, status, out))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.perf_counter() - t0
    ok = [out for _, s, out in results if s == 200 and isinstance(out, dict)]
    turns = [t["latency"] for out in ok for t in out["turns"]]
    return {
        "clients": clients, "requests_sent": len(results), "requests_planned": clients * per_client,
        "answered": len(ok), "errors": len(results) - len(ok),
        "error_examples": sorted({f"{s}: {str(o)[:160]}" for _, s, o in results if s != 200})[:5],
        "wall_s": round(wall, 2), "requests_per_s": round(len(ok) / wall, 3) if wall else None,
        "turns": len(turns), "turns_per_s": round(len(turns) / wall, 3) if wall else None,
        "turn_ms": {"p50": pct([t["model_s"] + t["db_s"] + t["harness_s"] for t in turns], .5),
                    "p95": pct([t["model_s"] + t["db_s"] + t["harness_s"] for t in turns], .95)},
        "engine_per_turn_ms": {"p50": pct([t["model_s"] for t in turns], .5),
                               "p95": pct([t["model_s"] for t in turns], .95)},
        "harness_per_turn_ms": {"p50": pct([t["db_s"] + t["harness_s"] for t in turns], .5),
                                "p95": pct([t["db_s"] + t["harness_s"] for t in turns], .95)},
        "request_ms": {"p50": pct([dt for dt, s, _ in results if s == 200], .5),
                       "p95": pct([dt for dt, s, _ in results if s == 200], .95)},
        "queue_wait_ms": {"p50": pct([o["latency"]["queue_s"] for o in ok], .5),
                          "p95": pct([o["latency"]["queue_s"] for o in ok], .95)},
        "episode_ids": [o["episode_id"] for o in ok],
    }


def case_429(svc: Service, args) -> dict:
    """One request running on a service with one episode thread and no queue; a second one is refused."""
    first: dict = {}
    runner = threading.Thread(target=lambda: first.update(zip(("status", "out", "headers"), request(
        svc.port, "/v1/ask", ask_body(0, args.budget), args.request_timeout + 30))))
    runner.start()
    deadline = time.monotonic() + 60
    while health(svc.port)[1].get("requests_in", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    status, out, headers = request(svc.port, "/v1/ask", ask_body(1, args.budget), 60)
    runner.join(args.request_timeout + 60)
    return {"status": status, "retry_after": headers.get("retry-after"), "error": out.get("error"),
            "running_request_status": first.get("status"),
            "episode_ids": [first["out"]["episode_id"]] if first.get("status") == 200 else []}


def _engine_core_pids(root: int) -> list[int]:
    """Descendants of process ``root`` whose command line names vLLM's engine core."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            try:
                if b"EngineCore" in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                    out.append(pid)
            except OSError:
                continue
    return out


def case_503(svc: Service, args) -> dict:
    """Kill the service's engine; a request and /healthz answer 503 with the reason until it is rebuilt."""
    if args.engine == "scripted":
        svc.proc.send_signal(signal.SIGUSR1)
        killed = "SIGUSR1: the scripted engine's core dies (its step blocks until the watchdog sees it)"
    else:
        pids = _engine_core_pids(svc.proc.pid)
        if not pids:
            return {"skipped": "no EngineCore process to kill (only vLLM with its engine core in its own process)"}
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed = f"SIGKILL to EngineCore pid {pids}"
    t_kill = time.monotonic()
    status, out, _ = request(svc.port, "/v1/ask", ask_body(0, args.budget), args.request_timeout + 30)
    hstatus, hbody = health(svc.port)
    deadline = time.monotonic() + args.startup_s
    while health(svc.port)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    back = time.monotonic() - t_kill
    after, answer, _ = request(svc.port, "/v1/ask", ask_body(2, args.budget), args.request_timeout + 30)
    return {"killed": killed, "ask_status": status, "ask_error": out.get("error"), "healthz_status": hstatus,
            "healthz_reason": hbody.get("reason"), "healthz_state": hbody.get("engine_state"),
            "back_after_s": round(back, 1), "after_status": after,
            "episode_ids": [answer["episode_id"]] if after == 200 else []}


def logged_once(log_dir: Path, answered: list[str]) -> dict:
    try:
        ids = list(read_table(log_dir, "episodes").to_pandas().episode_id)
    except Exception as exc:  # noqa: BLE001 - no log at all is a failed check, reported
        return {"episodes": 0, "answered": len(answered), "exactly_once": False, "error": repr(exc)}
    return {"episodes": len(ids), "answered": len(answered),
            "exactly_once": len(ids) == len(set(ids)) and sorted(ids) == sorted(answered)}


def hostile(port: int) -> dict:
    """Issue 15's hostile requests and what the service answered (4xx, or the shield's rejections)."""
    q = COUNT_Q
    cases = {
        "oversized body (1 MB, announced)": json.dumps({"db": "shop", "question": "x" * 1_000_000}).encode(),
        "malformed JSON": b'{"db": "shop", "question": ', "JSON array": b"[]",
        "question not a string": json.dumps({"db": "shop", "question": 7}).encode(),
        "path-like db ../shop": json.dumps({"db": "../shop", "question": q}).encode(),
        "unknown db": json.dumps({"db": "main", "question": q}).encode(),
        "unknown budget": json.dumps({"db": "shop", "question": q, "budget": "XXL"}).encode(),
        "extra key sql": json.dumps({"db": "shop", "question": q, "sql": "DELETE FROM orders"}).encode(),
    }
    out = {name: request(port, "/v1/ask", body, 60)[0] for name, body in cases.items()}
    status, ans, _ = request(port, "/v1/ask", json.dumps({"db": "shop", "question": INJECT_Q, "budget": "L"}).encode(),
                             120)
    rejected = [t["shield"]["rejection"] for t in ans.get("turns", []) if t["action"] == "execute_query"]
    out["prompt-injected write / ATTACH / DROP / PRAGMA"] = f"{status} {ans.get('status')} shield: {rejected}"
    out["episode_ids"] = [ans["episode_id"]] if status == 200 else []
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=("local", "scripted", "chat"), default="local")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="local: registry name or model folder")
    ap.add_argument("--local-kind", choices=("vllm", "hf"), default=None, help="local: the engine (default: serve's)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=20, help="requests per client (and of the 1-client baseline)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=None, help="the service's episode threads (default: clients)")
    ap.add_argument("--budget", default="XS")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--step-ms", type=float, default=20.0, help="scripted: seconds per decoding step, in ms")
    ap.add_argument("--max-seconds", type=float, default=3600.0, help="wall-clock budget of the load phases")
    ap.add_argument("--startup-s", type=float, default=900.0)
    ap.add_argument("--no-probe", action="store_true", help="skip the 429 / 503 cases")
    ap.add_argument("--hostile", action="store_true", help="also send issue 15's hostile requests")
    args = ap.parse_args(argv)
    concurrency = args.concurrency or args.clients
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    db = make_shop(tmp / "shop.db")
    before = sha256(db)
    report: dict = {"engine": args.engine, "model": args.model if args.engine == "local" else args.engine,
                    "clients": args.clients, "requests_per_client": args.requests, "service_threads": concurrency,
                    "budget": args.budget, "max_tokens": args.max_tokens, "tmp": str(tmp)}
    svc = Service(args, tmp, db, "main", concurrency=concurrency, max_queue=max(64, args.clients))
    answered: list[str] = []
    try:
        svc.wait_up(args.startup_s)
        report["healthz"] = health(svc.port)[1]
        deadline = time.monotonic() + args.max_seconds
        warm = run_phase(svc.port, 1, args.warmup, args, deadline, offset=1000) if args.warmup else None
        single = run_phase(svc.port, 1, args.requests, args, deadline)
        load = run_phase(svc.port, args.clients, args.requests, args, deadline, offset=args.requests)
        for phase in (warm, single, load):
            if phase is not None:
                answered += phase.pop("episode_ids")
        report.update(single=single, load=load)
        if single["turns_per_s"] and load["turns_per_s"]:
            report["batching_gain"] = {"turns_per_s": round(load["turns_per_s"] / single["turns_per_s"], 2),
                                       "requests_per_s": round(load["requests_per_s"] / single["requests_per_s"], 2)}
        report["engine_batch_peak"] = health(svc.port)[1].get("engine_batch_peak")
        if args.hostile:
            report["hostile"] = hostile(svc.port)
            answered += report["hostile"].pop("episode_ids")
    finally:
        svc.stop()
    report["errors"] = single["errors"] + load["errors"] + (warm["errors"] if warm else 0)
    report["logged"] = logged_once(svc.log_dir, answered)
    if not args.no_probe:
        separate = args.engine == "local" and args.local_kind != "hf"
        probe = Service(args, tmp, db, "probe", concurrency=1, max_queue=0, separate_engine=separate)
        probe_ids: list[str] = []
        try:
            probe.wait_up(args.startup_s)
            report["case_429"] = case_429(probe, args)
            probe_ids += report["case_429"].pop("episode_ids")
            report["case_503"] = case_503(probe, args)
            probe_ids += report["case_503"].pop("episode_ids", [])
        finally:
            probe.stop()
        report["probe_logged"] = logged_once(probe.log_dir, probe_ids)
    report["db_file_unchanged"] = sha256(db) == before
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
