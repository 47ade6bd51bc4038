"""The oracle is the only door to the reference SQL, and it never carries the gold answer's values."""

from __future__ import annotations

import dataclasses

import pytest

from bapsql.policies.oracle import infer_answer_kind, oracle_hint, policy_view, query_tables
from bapsql.policies.registry import WORKFLOW_NAMES
from bapsql.types import Answer


def test_hint_gives_sql_kind_and_tables_never_values(mini_tasks):
    task = mini_tasks["shop-02"]
    hint = oracle_hint(task)
    assert hint.gold_sql == task.gold_sql and hint.naive_sql == task.naive_sql and hint.has_naive
    assert hint.answer_kind == "ordered_list"
    assert hint.tables == ("orders", "customers")
    flat = repr(dataclasses.asdict(hint))
    assert not any(str(v) in flat for v in task.gold.values)


def test_policy_view_blanks_everything_but_the_question(mini_tasks):
    task = dataclasses.replace(mini_tasks["shop-00"], tags=("budget_sensitive",), evidence="hint text")
    view = policy_view(task)
    assert (view.gold, view.gold_sql, view.naive_sql, view.tags) == (None, "", "", ())
    assert (view.question, view.evidence, view.db_path, view.task_id) == (task.question, "hint text", task.db_path,
                                                                          task.task_id)


def test_kind_inferred_from_sql_shape_when_no_typed_gold(mini_tasks):
    assert infer_answer_kind("SELECT COUNT(*) FROM t WHERE a = 1") == "scalar"
    assert infer_answer_kind("SELECT a FROM t ORDER BY a") == "ordered_list"
    assert infer_answer_kind("SELECT a, COUNT(*) FROM t GROUP BY a") == "list"
    task = dataclasses.replace(mini_tasks["shop-00"], gold=None)
    assert oracle_hint(task).answer_kind == "scalar"
    assert query_tables("WITH c AS (SELECT * FROM t) SELECT * FROM c JOIN u ON 1") == ("t", "u")


def test_without_naive_query_the_draft_is_the_gold(mini_tasks):
    hint = oracle_hint(dataclasses.replace(mini_tasks["shop-00"], naive_sql=""))
    assert hint.naive_sql == hint.gold_sql and not hint.has_naive


@pytest.mark.parametrize("workflow", WORKFLOW_NAMES)
def test_workflows_never_read_gold_values(play, mini_tasks, workflow):
    """Replacing the gold answer's values changes no completion: only the scoring sees them."""
    task = mini_tasks["shop-01"]
    bogus = dataclasses.replace(task, gold=Answer(task.gold.kind, (-12345.5,)))
    real, fake = play(workflow, task, "L"), play(workflow, bogus, "L")
    assert real.completions == fake.completions
    assert real.summary.success and not fake.summary.success


def test_a_misnamed_column_is_a_question_word_sqlite_refuses(tmp_path):
    import sqlite3

    import numpy as np

    from bapsql.policies.oracle import misnamed_column_sql

    db = tmp_path / "clinic.sqlite"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE visits (id INTEGER, doctor_id INTEGER, visit_day TEXT);"
                      "CREATE TABLE doctors (doctor_id INTEGER, name TEXT); INSERT INTO doctors VALUES (1, 'Lee');")
    gold = "SELECT COUNT(*) FROM visits v JOIN doctors d ON v.doctor_id = d.doctor_id WHERE d.name = 'Lee'"
    con.execute(gold).fetchall()
    for seed in range(5):
        wrong = misnamed_column_sql(gold, "How many visits did doctor Lee have?", np.random.default_rng(seed))
        assert wrong is not None and "d.doctor =" in wrong  # the WHERE column, renamed to an unused question word
        with pytest.raises(sqlite3.OperationalError, match="no such column"):
            con.execute(wrong)
    rng = np.random.default_rng(0)
    assert misnamed_column_sql("SELECT 1", "How many visits?", rng) is None  # no column to rename
    assert misnamed_column_sql(gold, "How many name?", rng) is None  # every word is an identifier or SQL
    assert misnamed_column_sql("SELECT * FROM (", "How many visits?", rng) is None  # does not parse
