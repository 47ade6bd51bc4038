"""Question templates: every template yields drafts whose gold and naive SQL pass the sandbox and run, values come
from the data, and dirty / coded columns carry their evidence."""

from __future__ import annotations

import numpy as np
import pytest

from bapsql.data.synth_domains import CLINICS, RETAIL
from bapsql.data.synth_schema import build_database
from bapsql.data.synth_tasks import TEMPLATES, propose
from bapsql.data.synth_values import DbView, lit, nice
from bapsql.db.sandbox import Sandbox


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    out = {}
    for d in (RETAIL, CLINICS):
        build_database(d, root / f"{d.db_id}.sqlite", "small", seed=0)
        out[d.db_id] = (d, root / f"{d.db_id}.sqlite")
    return out


def test_every_template_proposes_runnable_sql(built):
    seen = set()
    for domain, path in built.values():
        view = DbView(path, domain)
        drafts = propose(view, np.random.default_rng(0), {name: 2 for name in TEMPLATES})
        view.close()
        with Sandbox(path) as sb:
            for d in drafts:
                seen.add(d.template)
                assert d.question.endswith((".", "?")) and d.gold_sql.startswith("SELECT")
                for sql in (d.gold_sql, d.naive_sql):
                    res = sb.query(sql, vm_step_cap=50_000_000, max_rows=1)
                    assert not res.interrupted
    assert seen == set(TEMPLATES)


def test_same_rng_same_drafts(built):
    domain, path = built["retail_orders"]
    runs = []
    for _ in range(2):
        view = DbView(path, domain)
        runs.append(propose(view, np.random.default_rng(7), {name: 1 for name in TEMPLATES}))
        view.close()
    assert runs[0] == runs[1]


def test_dirty_and_coded_columns_carry_evidence(built):
    domain, path = built["retail_orders"]
    view = DbView(path, domain)
    drafts = propose(view, np.random.default_rng(1), {"count_filter": 12, "agg_filter": 12})
    view.close()
    dirty = [d for d in drafts if "dirty" in d.tags]
    coded = [d for d in drafts if "evidence" in d.tags]
    assert dirty and coded
    assert all("LOWER(TRIM(" in d.gold_sql and "LOWER(TRIM(" in d.evidence for d in dirty)
    assert all("refers to" in d.evidence and "'" in d.evidence for d in coded)
    customers = domain.table("customers")
    values = {v for v, _ in DbView(path, domain).values(customers, customers.col("city"))}
    assert values and all(v == v.strip().lower() for v in values)  # dirty variants folded


def test_literals_and_thresholds():
    assert lit("O'Brien") == "'O''Brien'" and lit(3) == "3" and lit(2.5) == "2.5"
    assert nice(1234.5) == 1200 and nice(0.04567) == 0.046 and nice(7) == 7 and nice(0) == 0
