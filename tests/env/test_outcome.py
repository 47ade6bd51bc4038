"""Failure kinds and gold answers (bapsql/env/outcome.py)."""

from __future__ import annotations

from bapsql.env.evidence import EvidenceStore
from bapsql.env.outcome import classify_failure, gold_answer
from bapsql.types import Answer, Task

GOLD = Answer("scalar", (5,))


def kind(**kw):
    base = dict(success=False, correct=False, answer=None, gold=GOLD, abstained=False, history=[],
                store=EvidenceStore(), tags=(), level="XS")
    return classify_failure(**{**base, **kw})


def test_failure_kinds():
    assert kind(success=True, correct=True) == ""
    assert kind(abstained=True) == "unjustified_abstention"
    assert kind(abstained=True, tags=("unanswerable_xs",)) == "justified_abstention_wrong"
    assert kind(abstained=True, tags=("unanswerable_xs",), level="S") == "unjustified_abstention"
    assert kind(answer=Answer("list", (1, 2))) == "malformed_answer"
    assert kind(answer=Answer("scalar", (4,))) == "insufficient_evidence"
    store = EvidenceStore()
    store.add(sql="q", columns=("n",), rows=[(5,)], status="ok", truncated=False, truncated_by=None, rows_total=1,
              result_tokens=3, turn=1)
    assert kind(answer=Answer("scalar", (4,)), store=store) == "wrong_with_sufficient_evidence"
    store.apply("archive", "E1")  # support counts only visible rows
    assert kind(answer=Answer("scalar", (4,)), store=store) == "insufficient_evidence"
    assert kind(history=[("invalid", None), ("invalid", None)]) == "invalid_actions"
    assert kind(history=[("estimate_query", "ok"), ("execute_query", "rejected"), ("invalid", None)]) == \
        "terminal_rejection"
    assert kind(history=[("execute_query", "rejected"), ("inspect_schema", None)]) == "out_of_turns"


def test_gold_answer_from_sql(people_db, handles):
    sandbox = handles.get(people_db).sandbox
    t = Task("t", "people", str(people_db), "q", "SELECT name FROM city WHERE country = 'FR' ORDER BY name")
    assert gold_answer(t, sandbox, 10**7) == Answer("ordered_list", ("Lyon", "Paris"))
    assert gold_answer(Task("t", "p", str(people_db), "q", "SELECT nope"), sandbox, 10**7) is None
    assert gold_answer(Task("t", "p", str(people_db), "q", "SELECT count(*) FROM person"), sandbox, 10) is None
    typed = Task("t", "p", str(people_db), "q", "SELECT 1", gold=GOLD)
    assert gold_answer(typed, sandbox, 10**7) is GOLD


# ------------------------------------------------------------------------ issue 30, item 3: Official EX as BIRD
def test_official_ex_of_a_failed_prediction_is_wrong():
    from bapsql.env.outcome import official_ex

    assert official_ex([], []) and official_ex([(1,)], [(1.0,)])
    assert not official_ex(None, [])  # errored / over the cap: wrong, even against an empty gold result


def test_episode_official_ex_counts_failed_and_missing_sql_as_wrong(make_env, task):
    from bapsql.budgets import Budget
    from bapsql.env.actions import Abstain, AnswerAction, ExecuteQuery, render_action

    empty_gold = Task("e", "people", task.db_path, "Who is older than 1000?",
                      "SELECT name FROM person WHERE age > 1000")
    roomy = Budget("roomy", context_tokens=6000, queries=2, result_tokens=500, vm_steps=10**8, turns=5)
    env = make_env(gold_vm_step_cap=200_000)  # the gold query fits the official cap, the cross join does not
    env.reset(empty_gold, roomy)
    env.step(render_action(ExecuteQuery("SELECT count(*) FROM person a, person b WHERE a.age > 1000 + b.age")))
    assert env.turn_records[-1].status == "ok"
    env.step(render_action(AnswerAction("list", (), ("E1",))))
    assert env.summary().official_ex is False  # today: its failed official run became [] == the empty gold
    env.reset(empty_gold, roomy)
    env.step(render_action(Abstain("no")))
    assert env.summary().official_ex is False  # no SQL ran: wrong, not left out of the mean
    env.reset(empty_gold, roomy)
    env.step(render_action(ExecuteQuery("SELECT name FROM person WHERE age > 2000")))
    env.step(render_action(AnswerAction("list", (), ("E1",))))
    assert env.summary().official_ex is True
