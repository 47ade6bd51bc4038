"""Integration over the real Spider training data at ../shared/data/spider_train (skipped when absent): every
record loads, gold answers are typed, and the failure manifest shows the known data issues."""

from __future__ import annotations

import pytest

from bapsql.data.load import load_benchmark
from bapsql.data.stats import benchmark_stats

from .conftest import SPIDER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spider(tmp_path_factory):
    if not (SPIDER / "train_spider.json").is_file():
        pytest.skip(f"Spider training data not found at {SPIDER}")
    return load_benchmark(SPIDER, cache_dir=tmp_path_factory.mktemp("cache"))


def test_every_record_is_accounted_for(spider):
    m = spider.manifest
    assert m.layout == "spider" and m.records == 6904 and len(m.databases) == 138
    assert m.missing_databases == () and m.unreadable_files == ()
    assert len(m.failed_gold) == 3  # annotation errors in the original data
    assert len(spider.tasks) + len(m.failed_gold) + len(m.duplicates) == m.records
    empty = sum(code == "empty" for _, code, _ in m.flagged)
    assert 0.02 < empty / m.records < 0.06  # "about 4% of gold results are empty"


def test_answers_flags_and_splits(spider):
    kinds = {t.gold.kind for t in spider.tasks}
    assert kinds == {"scalar", "list", "ordered_list"}
    codes = {code for _, code, _ in spider.manifest.flagged}
    assert {"empty", "too_large", "ties_at_limit", "order_ties"} <= codes
    dbs = [set(v) for v in spider.splits.values()]
    assert sum(map(len, dbs)) == 138 and set().union(*dbs) == set(spider.manifest.databases)
    questions = {}
    for t in spider.tasks:
        questions.setdefault(" ".join(t.question.lower().split()), set()).add(spider.split_of(t.db_id))
    assert all(len(s) == 1 for s in questions.values())  # no exact question shared between splits
    st = benchmark_stats(spider)
    assert st.failed_gold == 3 and st.tasks == len(spider.tasks) and st.databases == 138
