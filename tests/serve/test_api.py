"""The service over real HTTP (uvicorn on loopback) with a scripted OpenAI-compatible chat server as the engine:
the contract, every 4xx / 503 path, auth, hostile requests, and every request logged exactly once."""

from __future__ import annotations

import json
import urllib.request

import pytest

from bapsql.logs.reader import read_table
from tests.serve.conftest import COUNT_Q, INJECT_Q, N_ORDERS, LiveService, build_service, http, sha256


@pytest.fixture
def service(shop, chat_server, tmp_path):
    asker, engine, app = build_service([shop], chat_server.base_url, tmp_path / "logs")
    with LiveService(app) as live:
        yield live, asker
    asker.close()
    engine.close()


def test_ask_answers_the_contract_and_logs_the_episode_once(service, shop, tmp_path):
    live, asker = service
    status, out = http("POST", f"{live.url}/v1/ask", {"db": "shop", "question": COUNT_Q, "budget": "S"})
    assert status == 200, out
    assert out["status"] == "answered" and out["answer"] == {"kind": "scalar", "values": [N_ORDERS]}
    assert {k: out["ledger"][k] for k in ("queries", "result_tokens", "turns")} == \
        {"queries": 1, "result_tokens": out["turns"][1]["actual"]["result_tokens"], "turns": 3}
    assert out["ledger"]["vm_steps"] > 0 and isinstance(out["episode_id"], str)
    assert [t["action"] for t in out["turns"]] == ["estimate_query", "execute_query", "answer"]
    assert out["turns"][0]["estimate"]["rows"][0] >= 1 and out["turns"][1]["shield"]["status"] == "ok"
    assert out["evidence"][0]["rows"] == [[N_ORDERS]] and out["tokens"]["model_reported"]["source"] == "usage"
    lat = out["latency"]
    assert lat["total_s"] >= lat["model_s"] + lat["db_s"] - 1e-6 and lat["db_s"] > 0
    # streaming: the same episode shape, one event per turn then the answer
    req = urllib.request.Request(f"{live.url}/v1/ask/stream", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"db": "shop", "question": COUNT_Q}).encode())
    with urllib.request.urlopen(req, timeout=60) as resp:
        events = [c for c in resp.read().decode().split("\n\n") if c]
    kinds = [e.split("\n")[0] for e in events]
    assert kinds == ["event: turn"] * 3 + ["event: answer"]
    streamed = json.loads(events[-1].split("data: ", 1)[1])
    assert streamed["budget"] == "S" and streamed["episode_id"] != out["episode_id"]
    asker.flush()
    eps = read_table(tmp_path / "logs", "episodes").to_pandas()
    turns = read_table(tmp_path / "logs", "turns").to_pandas()
    assert sorted(eps.episode_id) == sorted([out["episode_id"], streamed["episode_id"]])
    assert len(turns) == 6 and turns.model_s.notna().all() and turns.harness_s.notna().all()
    assert (eps.method == "model.scripted@full").all() and (eps.db_id == "shop").all()


def test_databases_healthz_page_and_docs(service):
    live, _ = service
    status, dbs = http("GET", f"{live.url}/v1/databases")
    assert status == 200 and dbs["databases"] == [{"name": "shop", "tables": [
        {"name": "customers", "rows": 30}, {"name": "orders", "rows": N_ORDERS}]}]
    assert set(dbs["budgets"]) == {"XS", "S", "M", "L"}
    assert http("GET", f"{live.url}/healthz") [1]["status"] == "ok"
    status, page = http("GET", f"{live.url}/")
    assert status == 200 and "<title>bapsql" in page
    status, spec = http("GET", f"{live.url}/openapi.json")
    assert status == 200 and "/v1/ask" in spec["paths"]


BAD_REQUESTS = [
    (b"{not json", 400, "not a JSON object"),
    (b"[1, 2]", 400, "not a JSON object"),
    ({"question": COUNT_Q}, 422, "db"),
    ({"db": "shop", "question": 42}, 422, "question"),
    ({"db": ["shop"], "question": COUNT_Q}, 422, "db"),
    ({"db": "shop", "question": ""}, 422, "question"),
    ({"db": "shop", "question": "x" * 2001}, 422, "question"),
    ({"db": "shop", "question": COUNT_Q, "budget": "XXL"}, 422, "unknown budget"),
    ({"db": "shop", "question": COUNT_Q, "budget": 1}, 422, "budget"),
    ({"db": "shop", "question": COUNT_Q, "sql": "DELETE FROM orders"}, 422, "sql"),
    ({"db": "../shop", "question": COUNT_Q}, 422, "db"),
    ({"db": "/etc/passwd", "question": COUNT_Q}, 422, "db"),
    ({"db": "shop.db", "question": COUNT_Q}, 404, "unknown database"),
    ({"db": "other", "question": COUNT_Q}, 404, "unknown database"),
]


def test_bad_requests_get_4xx_with_what_to_send(service):
    live, asker = service  # one service for every case (a service per case cost ~0.8 s of start and stop each)
    for body, code, words in BAD_REQUESTS:
        status, out = http("POST", f"{live.url}/v1/ask", body)
        assert status == code and words in out["error"], (body, out)
    assert asker.logged == 0


def test_oversized_bodies_are_refused(service):
    live, asker = service
    status, out = http("POST", f"{live.url}/v1/ask", {"db": "shop", "question": "x" * 20_000})
    assert status == 413 and "16384 bytes" in out["error"]
    # a chunked body announces no length: it is counted as it streams in
    import http.client as client

    conn = client.HTTPConnection("127.0.0.1", live.port, timeout=30)
    conn.putrequest("POST", "/v1/ask")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    chunk = b'{"db": "shop", "question": "' + b"y" * 8000
    for _ in range(4):
        conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()
    assert asker.logged == 0


def test_prompt_injected_writes_are_refused_and_the_file_is_untouched(service, shop, tmp_path):
    live, asker = service
    before = sha256(shop)
    status, out = http("POST", f"{live.url}/v1/ask", {"db": "shop", "question": INJECT_Q, "budget": "L"})
    assert status == 200 and out["status"] == "abstained"
    rejections = [t["shield"]["rejection"] for t in out["turns"] if t["action"] == "execute_query"]
    assert rejections == ["write", "attach", "ddl", "pragma", "write"]
    assert out["ledger"]["queries"] == 0 and not out["breach"]
    assert sha256(shop) == before
    assert not (tmp_path / "evil.db").exists()


def test_api_key_is_required_when_configured(shop, chat_server, tmp_path):
    asker, engine, app = build_service([shop], chat_server.base_url, tmp_path / "logs", api_key="s3cret")
    try:
        with LiveService(app) as live:
            body = {"db": "shop", "question": COUNT_Q}
            assert http("POST", f"{live.url}/v1/ask", body)[0] == 401
            status, out = http("POST", f"{live.url}/v1/ask", body, {"Authorization": "Bearer wrong"})
            assert status == 401 and "Authorization: Bearer" in out["error"]
            assert http("GET", f"{live.url}/v1/databases")[0] == 401
            assert http("GET", f"{live.url}/healthz")[0] == 200  # liveness stays open
            status, out = http("POST", f"{live.url}/v1/ask", body, {"Authorization": "Bearer s3cret"})
            assert status == 200 and out["status"] == "answered"
    finally:
        asker.close()
        engine.close()
    assert asker.logged == 1


def test_engine_down_is_503_and_the_server_stays_up(shop, chat_server, tmp_path):
    asker, engine, app = build_service([shop], chat_server.base_url, tmp_path / "logs", max_retries=1)
    try:
        with LiveService(app) as live:
            body = {"db": "shop", "question": COUNT_Q}
            chat_server.fail = [503, 503]
            status, out = http("POST", f"{live.url}/v1/ask", body)
            assert status == 503 and "engine is unavailable" in out["error"] and "try again" in out["error"]
            chat_server.stop()  # the engine is gone altogether
            status, out = http("POST", f"{live.url}/v1/ask", body)
            assert status == 503 and "cannot reach" in out["error"]
            req = urllib.request.Request(f"{live.url}/v1/ask/stream", method="POST", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                last = [c for c in resp.read().decode().split("\n\n") if c][-1]
            assert last.startswith("event: error") and '"status": 503' in last
            assert http("GET", f"{live.url}/healthz")[0] == 200
            assert http("GET", f"{live.url}/v1/databases")[0] == 200
    finally:
        asker.close()
        engine.close()
    assert asker.logged == 0  # unfinished episodes are not logged


def test_concurrent_requests_are_each_logged_exactly_once(shop, chat_server, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    asker, engine, app = build_service([shop], chat_server.base_url, tmp_path / "logs", concurrency=3)
    try:
        with LiveService(app) as live:
            with ThreadPoolExecutor(8) as pool:
                results = list(pool.map(lambda _: http("POST", f"{live.url}/v1/ask",
                                                       {"db": "shop", "question": COUNT_Q}), range(12)))
    finally:
        asker.close()
        engine.close()
    assert all(s == 200 and r["status"] == "answered" for s, r in results)
    ids = [r["episode_id"] for _, r in results]
    eps = read_table(tmp_path / "logs", "episodes").to_pandas()
    assert len(set(ids)) == 12 and sorted(eps.episode_id) == sorted(ids)
