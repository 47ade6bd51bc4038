"""The service with a local engine (a scripted vLLM-shaped engine, `tests.serve.local_engine.StepEngine`) over real
HTTP: one scheduler thread batches every episode's turns; bounded work (429 with Retry-After when the queue is full,
504 past ``--request-timeout``, a closed event stream cancels its episode); honest health (engine death is 503 with
the reason and ``/healthz`` fails until the engine is rebuilt); each request logged exactly once, the stopped ones
marked ``timed_out`` / ``cancelled``."""

from __future__ import annotations

import http.client as client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bapsql.logs.reader import read_table
from tests.serve.conftest import COUNT_Q, N_ORDERS, LiveService, build_local_service, http, http_full, plans
from tests.serve.local_engine import EngineDeadError, StepEngine

ASK = {"db": "shop", "question": COUNT_Q}


def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def _episodes(log_dir):
    return read_table(log_dir, "episodes").to_pandas()


def test_concurrent_requests_share_one_batch_on_one_engine_thread(shop, tmp_path):
    engine = StepEngine(plans())
    asker, app = build_local_service([shop], engine, tmp_path / "logs", concurrency=6)
    try:
        with LiveService(app) as live:
            with ThreadPoolExecutor(6) as pool:
                results = list(pool.map(lambda _: http("POST", f"{live.url}/v1/ask", ASK), range(12)))
    finally:
        asker.close()
    assert all(s == 200 and r["status"] == "answered" and r["answer"]["values"] == [N_ORDERS] for s, r in results)
    assert len(engine.threads) == 1  # only the scheduler thread ever touched the engine...
    assert max(engine.batches) > 1  # ...and concurrent episodes' turns decoded in one batch
    assert engine.overlapping_generates == 0 and engine.closed  # the scheduler owns (and closed) the engine
    ids = [r["episode_id"] for _, r in results]
    assert len(set(ids)) == 12 and sorted(_episodes(tmp_path / "logs").episode_id) == sorted(ids)


def test_a_full_queue_answers_429_with_retry_after(shop, tmp_path):
    engine = StepEngine(plans(), hold_from_turn=0)  # every turn waits for release()
    asker, app = build_local_service([shop], engine, tmp_path / "logs", concurrency=1, max_queue=1)
    try:
        with LiveService(app) as live:
            with ThreadPoolExecutor(2) as pool:
                held = [pool.submit(http, "POST", f"{live.url}/v1/ask", ASK) for _ in range(2)]
                _wait(lambda: asker.admission.inside == 2)  # one running, one waiting: the queue is full
                status, out, headers = http_full("POST", f"{live.url}/v1/ask", ASK)
                assert status == 429 and "at capacity" in out["error"]
                assert int(headers["Retry-After"]) >= 1 and out["retry_after_s"] == int(headers["Retry-After"])
                assert http("GET", f"{live.url}/healthz")[1]["requests_in"] == 2
                engine.release()
                assert [f.result(timeout=30)[0] for f in held] == [200, 200]
    finally:
        engine.release()
        asker.close()
    assert asker.logged == 2 and asker.admission.refused == 1


def test_a_request_past_its_deadline_is_504_and_its_turns_are_logged_as_timed_out(shop, tmp_path):
    engine = StepEngine(plans(), hold_from_turn=1)  # the second turn never finishes
    asker, app = build_local_service([shop], engine, tmp_path / "logs", request_timeout_s=1.0)
    try:
        with LiveService(app) as live:
            t0 = time.monotonic()
            status, out = http("POST", f"{live.url}/v1/ask", ASK, timeout=30)
            took = time.monotonic() - t0
            assert status == 504 and "deadline" in out["error"] and 0.9 < took < 10
            _wait(lambda: asker.logged == 1)
            _wait(lambda: bool(engine.aborted))  # its engine request was withdrawn, not left decoding
            engine.release()
            assert http("POST", f"{live.url}/v1/ask/stream", ASK)[0] == 200  # the service goes on
    finally:
        engine.release()
        asker.close()
    eps = _episodes(tmp_path / "logs")
    stopped = eps[eps.failure == "timed_out"]
    assert len(stopped) == 1 and int(stopped.turns.iloc[0]) == 1
    turns = read_table(tmp_path / "logs", "turns").to_pandas()
    assert list(turns[turns.episode_id == stopped.episode_id.iloc[0]].action) == ["estimate_query"]


def test_a_closed_event_stream_cancels_its_episode_and_logs_it_as_cancelled(shop, tmp_path):
    engine = StepEngine(plans(), hold_from_turn=1)
    asker, app = build_local_service([shop], engine, tmp_path / "logs")
    try:
        with LiveService(app) as live:
            conn = client.HTTPConnection("127.0.0.1", live.port, timeout=30)
            conn.request("POST", "/v1/ask/stream", body=json.dumps(ASK), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            first = b""
            while b"\n\n" not in first:
                first += resp.read1(4096)
            assert first.startswith(b"event: turn")
            # the second turn's request must be in the engine (held there) before the client goes away: cancelled
            # while still queued, it would be withdrawn before the engine saw it, and there would be nothing to abort
            _wait(lambda: engine.in_flight() == 1)
            conn.sock.shutdown(socket.SHUT_RDWR)  # the client goes away while the second turn decodes
            resp.close()
            conn.close()
            _wait(lambda: asker.logged == 1)
            _wait(lambda: bool(engine.aborted))
    finally:
        engine.release()
        asker.close()
    eps = _episodes(tmp_path / "logs")
    assert list(eps.failure) == ["cancelled"] and list(eps.turns) == [1]


@pytest.mark.parametrize("restart", [False, True])
def test_engine_death_is_503_with_the_reason_and_healthz_fails_until_it_is_back(shop, tmp_path, restart):
    engine = StepEngine(plans())
    gate, rebuilt = threading.Event(), []

    def rebuild():
        gate.wait(30)
        rebuilt.append(StepEngine(plans()))
        return rebuilt[-1]

    asker, app = build_local_service([shop], engine, tmp_path / "logs", restart=rebuild if restart else None)
    try:
        with LiveService(app) as live:
            assert http("POST", f"{live.url}/v1/ask", ASK)[0] == 200
            engine.kill(EngineDeadError())
            status, out = http("POST", f"{live.url}/v1/ask", ASK)
            assert status == 503 and "EngineDeadError" in out["error"] and "EngineCore" in out["error"]
            status, health = http("GET", f"{live.url}/healthz")
            assert status == 503 and "EngineDeadError" in health["reason"]
            assert health["engine_state"] == ("restarting" if restart else "dead")
            status, out = http("POST", f"{live.url}/v1/ask", ASK)  # refused at once while the engine is down
            assert status == 503 and "EngineDeadError" in out["error"]
            assert engine.closed  # the dead engine was closed
            if restart:
                gate.set()
                _wait(lambda: http("GET", f"{live.url}/healthz")[0] == 200)
                status, health = http("GET", f"{live.url}/healthz")
                assert health["engine_restarts"] == 1 and health["engine_state"] == "ok"
                status, out = http("POST", f"{live.url}/v1/ask", ASK)
                assert status == 200 and out["status"] == "answered"
            else:
                assert http("GET", f"{live.url}/healthz")[0] == 503
    finally:
        gate.set()
        asker.close()
    assert asker.logged == (2 if restart else 1)  # the failed episodes are not logged
    assert len(rebuilt) == int(restart) and all(e.closed for e in rebuilt)
