"""Tests of bapsql.db.shield: admission under caps, accounting after truncation, preflight, typed outcomes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bapsql.db.shield as shield_mod
from bapsql.db.estimator import Estimate, Quantiles
from bapsql.db.rows import render_header, render_row, result_bytes, result_tokens
from bapsql.db.sandbox import Sandbox
from bapsql.db.shield import Caps, Cost, Shield, ShieldResult
from bapsql.tokens import RegexTokenCounter

N_ROWS = 4_000
BIG = Caps(vm_steps=10_000_000, result_tokens=10**9, rows=10**9, bytes=10**9)
COUNTER = RegexTokenCounter()


def build_db(path: Path) -> Path:
    conn = apsw.Connection(str(path))
    conn.execute(
        f"""
        CREATE TABLE sales(id INTEGER PRIMARY KEY, region TEXT, amount REAL, note TEXT);
        BEGIN;
        WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < {N_ROWS})
        INSERT INTO sales SELECT x, 'region' || (x % 5), x * 1.25, 'note number ' || x FROM r;
        COMMIT;
        """
    )
    conn.close()
    return path


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return build_db(tmp_path_factory.mktemp("shield") / "sales.db")


@pytest.fixture()
def shield(db):
    with Sandbox(db) as sb:
        yield Shield(sb, COUNTER)


def estimate(vm_p50: float, *, error: str | None = None) -> Estimate:
    q = Quantiles(vm_p50, vm_p50 * 2)
    return Estimate(Quantiles(1, 2), Quantiles(10, 20), q, ("x",), 7, ("SCAN sales",), {}, error)


# -- ok results --------------------------------------------------------------------------------------------------------
def test_ok_result_charges_exactly_what_is_shown(shield):
    r = shield.execute("SELECT region, count(*) AS n FROM sales GROUP BY region ORDER BY region", BIG)
    assert isinstance(r, ShieldResult)
    assert r.status == "ok" and r.truncated_by is None and r.rejection is None and not r.breach
    assert r.columns == ("region", "n")
    assert r.rows == tuple((f"region{i}", N_ROWS // 5) for i in range(5))
    assert r.cost.rows == 5 == r.rows_total
    assert r.cost.result_tokens == result_tokens(r.columns, r.rows, COUNTER) == r.full_result_tokens
    assert r.cost.bytes == result_bytes(r.columns, r.rows)
    assert r.cost.vm_steps == shield.sandbox.query("SELECT region, count(*) AS n FROM sales GROUP BY region "
                                                   "ORDER BY region").vm_steps
    assert r.message == ""


def test_empty_result_costs_no_tokens(shield):
    r = shield.execute("SELECT id FROM sales WHERE id < 0", BIG)
    assert r.status == "ok" and r.rows == () and r.rows_total == 0
    assert r.cost.result_tokens == 0 and r.cost.bytes == 0 and r.full_result_tokens == 0 and r.cost.vm_steps > 0


# -- truncation by each cap --------------------------------------------------------------------------------------------
BROAD = "SELECT id, region, amount, note FROM sales ORDER BY id"


@pytest.mark.parametrize(
    "caps, by",
    [
        (Caps(vm_steps=10_000_000, result_tokens=10**9, rows=7, bytes=10**9), "rows"),
        (Caps(vm_steps=10_000_000, result_tokens=10**9, rows=10**9, bytes=300), "bytes"),
        (Caps(vm_steps=10_000_000, result_tokens=100, rows=10**9, bytes=10**9), "result_tokens"),
        (Caps(vm_steps=3_000, result_tokens=10**9, rows=10**9, bytes=10**9), "vm_steps"),
    ],
)
def test_truncation_by_each_cap(shield, caps, by):
    full = shield.execute(BROAD, BIG)
    r = shield.execute(BROAD, caps)
    assert r.status == "truncated" and r.truncated_by == by and not r.breach
    assert r.cost.vm_steps <= caps.vm_steps and r.cost.result_tokens <= caps.result_tokens
    assert r.cost.rows <= caps.rows and r.cost.bytes <= caps.bytes
    assert 0 < len(r.rows) < N_ROWS and r.rows == full.rows[: len(r.rows)]
    assert r.message
    if by == "vm_steps":
        assert r.rows_total is None and r.full_result_tokens is None
    else:
        # the next row would have crossed the cap
        one_more = full.rows[: len(r.rows) + 1]
        crossed = (len(one_more) > caps.rows or result_bytes(r.columns, one_more) > caps.bytes
                   or result_tokens(r.columns, one_more, COUNTER) > caps.result_tokens)
        assert crossed
        assert r.rows_total == N_ROWS and r.full_result_tokens == full.cost.result_tokens


def test_header_is_charged_with_the_first_row(shield):
    cols = ("id", "region", "amount", "note")
    first = (1, "region1", 1.25, "note number 1")
    need = COUNTER.count(render_header(cols)) + COUNTER.count(render_row(first))
    r = shield.execute(BROAD, Caps(10_000_000, need - 1))
    assert r.rows == () and r.cost.result_tokens == 0 and r.truncated_by == "result_tokens"
    r = shield.execute(BROAD, Caps(10_000_000, need))
    assert r.rows == (first,) and r.cost.result_tokens == need


def test_truncation_never_refunds_the_scan(shield):
    truncated = shield.execute("SELECT note FROM sales WHERE amount > 10", Caps(10_000_000, 10**6, rows=10))
    limited = shield.execute("SELECT note FROM sales WHERE amount > 10 LIMIT 10", BIG)
    assert truncated.rows == limited.rows
    assert truncated.cost.vm_steps >= 10 * limited.cost.vm_steps
    assert truncated.cost.result_tokens == limited.cost.result_tokens
    assert truncated.rows_total == N_ROWS - 8


def test_full_result_tokens_extrapolate_past_the_exact_bound(shield, monkeypatch):
    exact = shield.execute(BROAD, BIG).cost.result_tokens
    monkeypatch.setattr(shield_mod, "EXACT_TOKEN_ROWS", 300)
    r = shield.execute(BROAD, Caps(10_000_000, 10**9, rows=10))
    assert r.rows_total == N_ROWS
    assert abs(r.full_result_tokens - exact) / exact < 0.05


def test_vm_cap_with_visible_truncation_reports_both(shield):
    r = shield.execute(BROAD, Caps(vm_steps=20_000, result_tokens=50))
    assert r.truncated_by == "vm_steps" and r.rows_total is None
    assert "result tokens" in r.message and "VM-step cap" in r.message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sql=st.sampled_from([BROAD, "SELECT region, sum(amount) FROM sales GROUP BY region",
                         "SELECT a.id FROM sales a JOIN sales b ON b.id = a.id + 1 WHERE a.id < 500",
                         "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"]),
    vm=st.integers(0, 60_000), tok=st.integers(0, 400), rows=st.integers(0, 50), nbytes=st.integers(0, 2_000),
)
def test_costs_never_exceed_caps(shield, sql, vm, tok, rows, nbytes):
    caps = Caps(vm, tok, rows, nbytes)
    r = shield.execute(sql, caps)
    assert not r.breach and not r.cost.exceeds(caps)
    assert r.status in ("ok", "truncated", "rejected")
    assert r.cost.rows == len(r.rows)
    assert r.cost.result_tokens == result_tokens(r.columns, r.rows, COUNTER)
    assert r.cost.bytes == result_bytes(r.columns, r.rows)


# -- rejected / error --------------------------------------------------------------------------------------------------
def test_rejections_are_typed_and_free(shield):
    r = shield.execute("DELETE FROM sales", BIG)
    assert r.status == "rejected" and r.rejection == "write" and r.cost == Cost(0, 0, 0, 0) and not r.breach
    r = shield.execute("SELECT randomblob(5)", BIG)
    assert r.rejection == "function:randomblob"
    r = shield.execute("SELECT 1", Caps(0, 100))
    assert r.rejection == "no_vm_steps"


def test_errors_are_typed_and_charge_steps_spent(db):
    from bapsql.db.sandbox import SandboxLimits

    with Sandbox(db, SandboxLimits(max_length=2_000)) as sb:
        sh = Shield(sb, COUNTER)
        r = sh.execute("SELECT nope FROM sales", BIG)
        assert r.status == "error" and "no such column" in r.message and r.cost.vm_steps == 0
        r = sh.execute("SELECT group_concat(note) FROM sales", BIG)
        assert r.status == "error" and "too big" in r.message and r.cost.vm_steps > 0 and not r.breach
        assert sh.execute("SELECT 1", BIG).rows == ((1,),)


def test_caps_validate():
    with pytest.raises(ValueError):
        Caps(vm_steps=-1, result_tokens=0)
    with pytest.raises(ValueError):
        Caps(vm_steps=10, result_tokens=1.5)


# -- preflight ---------------------------------------------------------------------------------------------------------
def test_preflight(shield):
    caps = Caps(vm_steps=1_000, result_tokens=100)
    assert shield.preflight(estimate(500), caps) is None
    r = shield.preflight(estimate(5_000), caps)
    assert r.status == "rejected" and r.rejection == "preflight_vm_steps" and r.cost == Cost(0, 0, 0, 0)
    assert "5,000" in r.message
    r = shield.preflight(estimate(0, error="no such table: x"), caps)
    assert r.rejection == "estimate_error" and "no such table" in r.message
    r = shield.preflight(estimate(1), Caps(vm_steps=0, result_tokens=100))
    assert r.rejection == "no_vm_steps"


SPIDER = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spider_train"


def test_spider_gold_sql_is_never_rejected():
    if not (SPIDER / "train_spider.json").is_file():
        pytest.skip(f"Spider data not present at {SPIDER}")
    tasks = json.loads((SPIDER / "train_spider.json").read_text())[::40]
    shields: dict[str, Shield] = {}
    digests: dict[Path, str] = {}
    caps = Caps(vm_steps=4_000_000, result_tokens=10**6, rows=10**6, bytes=10**8)
    try:
        for task in tasks:
            path = SPIDER / "database" / task["db_id"] / f"{task['db_id']}.sqlite"
            if task["db_id"] not in shields:
                digests[path] = hashlib.sha256(path.read_bytes()).hexdigest()
                shields[task["db_id"]] = Shield(Sandbox(path), COUNTER)
            r = shields[task["db_id"]].execute(task["query"], caps)
            assert r.status != "rejected", (task["query"], r.message)
            assert not r.breach
    finally:
        for sh in shields.values():
            sh.sandbox.close()
    assert len(shields) > 20
    for path, digest in digests.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
