"""Bounded loopback load test of `bapsql serve`, and its hostile-request check (issue 15).

Starts a scripted OpenAI-compatible chat server (the engine; it answers at once, so the model's share is only an
HTTP round trip to it) in one process and ``bapsql serve`` (uvicorn) in another, both on 127.0.0.1, over a small
shop database (120 orders, 30 customers); the clients are threads of this process. ``--clients`` threads then send ``--requests`` questions in all (fixed count; each a 3-turn episode:
estimate, execute, answer) to ``POST /v1/ask``; ``--warmup`` requests go first and are not timed. Reports:

- per turn, the harness time = everything but the engine call (``db_s + harness_s`` of each turn, measured inside
  the episode), p50 / p95 — the issue's target is p95 <= 50 ms — and the CPU time the episode thread spent on it
  (``harness_cpu_s``: what the harness costs, whatever else the machine runs);
- per request, the client's round trip, the time waiting for an episode thread (``queue_s``) and the non-model time
  per turn as the client sees it ((round trip - model_s) / turns: queueing, HTTP and JSON included), p50 / p95;
- errors (any non-200 answer or exception) and the logging check: after shutdown the episodes table holds every
  answered request's episode id exactly once and nothing else;
- hostile requests: oversized bodies (announced and chunked), wrong types, path-like database names, unknown names
  and budgets, extra keys, and prompt-injected SQL asking to write, ATTACH, drop or change pragmas — each must be
  refused (4xx) or, for the injected SQL, rejected by the shield — with the database file's SHA-256 unchanged.

    python benchmarks/bench_serve.py [--clients 32] [--requests 640] [--warmup 32] [--concurrency 8]
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
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' scripted chat server and fixtures

from bapsql.logs.reader import read_table  # noqa: E402
from tests.serve.conftest import COUNT_Q, INJECT_Q, free_port, make_shop, sha256  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHAT_SERVER = """
import sys, time
from tests.serve.chat_server import ScriptedChatServer
from tests.serve.conftest import plans
with ScriptedChatServer(plans()) as server:
    print(server.base_url, flush=True)
    sys.stdin.read()
"""


def wait_up(port: int, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"bapsql serve did not come up: {proc.communicate()[1][-2000:]}")
        time.sleep(0.2)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


def post(port: int, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/ask", body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def chunked(port: int, n_bytes: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.putrequest("POST", "/v1/ask")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    chunk = b"z" * 4096
    for _ in range(n_bytes // len(chunk)):
        conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    conn.send(b"0\r\n\r\n")
    status = conn.getresponse().status
    conn.close()
    return status


def hostile(port: int) -> dict:
    """Every hostile request and what the service answered."""
    q = COUNT_Q
    cases = {
        "oversized body (1 MB, announced)": json.dumps({"db": "shop", "question": "x" * 1_000_000}).encode(),
        "malformed JSON": b'{"db": "shop", "question": ',
        "JSON array": b"[]",
        "question not a string": json.dumps({"db": "shop", "question": 7}).encode(),
        "db a list": json.dumps({"db": ["shop"], "question": q}).encode(),
        "path-like db ../shop": json.dumps({"db": "../shop", "question": q}).encode(),
        "absolute path db": json.dumps({"db": "/etc/passwd", "question": q}).encode(),
        "file name db shop.db": json.dumps({"db": "shop.db", "question": q}).encode(),
        "unknown db": json.dumps({"db": "main", "question": q}).encode(),
        "unknown budget": json.dumps({"db": "shop", "question": q, "budget": "XXL"}).encode(),
        "extra key sql": json.dumps({"db": "shop", "question": q, "sql": "DELETE FROM orders"}).encode(),
        "question too long": json.dumps({"db": "shop", "question": "q" * 5000}).encode(),
    }
    out = {name: post(port, body)[0] for name, body in cases.items()}
    out["oversized body (64 KB, chunked)"] = chunked(port, 65_536)
    status, ans = post(port, json.dumps({"db": "shop", "question": INJECT_Q, "budget": "L"}).encode())
    rejected = [t["shield"]["rejection"] for t in ans.get("turns", []) if t["action"] == "execute_query"]
    out["prompt-injected write / ATTACH / DROP / PRAGMA"] = f"{status} {ans.get('status')} shield: {rejected}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=640)
    ap.add_argument("--warmup", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8, help="the service's episode threads")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    db = make_shop(tmp / "shop.db")
    before = sha256(db)
    body = json.dumps({"db": "shop", "question": COUNT_Q, "budget": "S"}).encode()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    chat = subprocess.Popen([sys.executable, "-c", CHAT_SERVER], cwd=REPO, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    url = chat.stdout.readline().strip()
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "bapsql", "serve", "--db", str(db), "--engine",
                              f"openai_chat:{url}", "--model", "scripted", "--port", str(port), "--log-dir",
                              str(tmp / "logs"), "--concurrency", str(args.concurrency)], cwd=tmp, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_up(port, serve)
        with ThreadPoolExecutor(args.clients) as pool:
            warm = list(pool.map(lambda _: post(port, body), range(args.warmup)))

            def one(_: int) -> tuple[float, int, dict | str]:
                t0 = time.perf_counter()
                try:
                    status, out = post(port, body)
                except Exception as exc:  # noqa: BLE001 - counted as an error
                    return time.perf_counter() - t0, -1, repr(exc)
                return time.perf_counter() - t0, status, out

            load0 = os.getloadavg()
            t0 = time.perf_counter()
            results = list(pool.map(one, range(args.requests)))
            wall = time.perf_counter() - t0
            load1 = os.getloadavg()
        attacks = hostile(port)
    finally:
        serve.send_signal(signal.SIGINT)
        serve.communicate(timeout=120)
        chat.stdin.close()
        chat.wait(timeout=30)
    ok = [r for _, s, r in results if s == 200 and isinstance(r, dict) and r.get("status") == "answered"]
    errors = len(results) - len(ok)
    turn_harness = [t["latency"]["db_s"] + t["latency"]["harness_s"] for r in ok for t in r["turns"]]
    turn_db = [t["latency"]["db_s"] for r in ok for t in r["turns"]]
    turn_cpu = [t["latency"]["harness_cpu_s"] for r in ok for t in r["turns"]]
    turn_model = [t["latency"]["model_s"] for r in ok for t in r["turns"]]
    rtt = [dt for dt, s, r in results if s == 200]
    queue = [r["latency"]["queue_s"] for r in ok]
    client_turn = [(dt - r["latency"]["model_s"]) / len(r["turns"]) for dt, s, r in results
                   if s == 200 and isinstance(r, dict) and r.get("turns")]
    eps = read_table(tmp / "logs", "episodes").to_pandas()
    expected = [r["episode_id"] for _, r in warm if isinstance(r, dict) and "episode_id" in r]
    expected += [r["episode_id"] for r in ok] + [None]  # + the injected-SQL episode (its id is not kept here)
    logged_once = eps.episode_id.is_unique and len(eps) == len(expected) and \
        set(expected[:-1]) <= set(eps.episode_id)
    ms = lambda xs, q: round(1000 * pct(xs, q), 2)  # noqa: E731
    report = {
        "clients": args.clients, "requests": args.requests, "service_threads": args.concurrency,
        "wall_s": round(wall, 2), "requests_per_s": round(args.requests / wall, 1), "errors": errors,
        "turns": len(turn_harness),
        "harness_per_turn_ms": {"p50": ms(turn_harness, .5), "p95": ms(turn_harness, .95),
                                "max": ms(turn_harness, 1.0)},
        "harness_cpu_per_turn_ms": {"p50": ms(turn_cpu, .5), "p95": ms(turn_cpu, .95)},
        "db_per_turn_ms": {"p50": ms(turn_db, .5), "p95": ms(turn_db, .95)},
        "engine_call_per_turn_ms": {"p50": ms(turn_model, .5), "p95": ms(turn_model, .95)},
        "client_round_trip_ms": {"p50": ms(rtt, .5), "p95": ms(rtt, .95)},
        "queue_wait_ms": {"p50": ms(queue, .5), "p95": ms(queue, .95)},
        "client_non_model_per_turn_ms": {"p50": ms(client_turn, .5), "p95": ms(client_turn, .95)},
        "episodes_logged": len(eps), "every_request_logged_exactly_once": bool(logged_once),
        "loadavg_before": [round(x, 2) for x in load0], "loadavg_after": [round(x, 2) for x in load1],
        "hostile": attacks, "db_file_unchanged": sha256(db) == before,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
