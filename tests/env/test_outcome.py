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
