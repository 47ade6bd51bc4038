"""End-of-episode judgements: the gold answer of a task and the failure kind of an unsuccessful episode.

`summarize` assembles the `EpisodeSummary` (the episodes log row) from the final state. `gold_answer` uses the
task's typed gold when it has one; otherwise it executes the gold SQL once in the episode's
read-only sandbox (never charged, never shown) and types the result with `bapsql.env.scoring.answer_from_rows`
(ordered when the outermost SELECT has an ORDER BY). `classify_failure` maps an episode to one of
`bapsql.logs.schema.FAILURE_KINDS` by the rules in its docstring.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Iterable, Sequence

from bapsql.env.evidence import EvidenceStore
from bapsql.env.records import EpisodeSummary
from bapsql.env.evidence_score import evidence_breakdown, evidence_score
from bapsql.env.scoring import answer_from_rows, answer_shape_ok, is_ordered_sql
from bapsql.errors import BapsqlError
from bapsql.types import Answer, Task

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.db.sandbox import Sandbox
    from bapsql.env.ledger import Ledger

GOLD_MAX_ROWS = 100_000
OFFICIAL_MAX_ROWS = 100_000


def official_ex(pred_rows: Iterable[Sequence] | None, gold_rows: Iterable[Sequence]) -> bool:
    """BIRD's execution accuracy: ``set(predicted) == set(gold)`` over row tuples (order and duplicates ignored,
    1 == 1.0 as in Python). A separate, unbudgeted metric. ``pred_rows`` None — the predicted SQL errored, was
    refused, exceeded the cap, or no SQL ran at all — is wrong, as in BIRD's script (never an empty result that
    would match an empty gold result)."""
    if pred_rows is None:
        return False
    return set(map(tuple, pred_rows)) == set(map(tuple, gold_rows))


def official_rows(sandbox: "Sandbox", sql: str, vm_step_cap: int | None) -> frozenset | None:
    """The set of result rows of ``sql`` run unbudgeted (read-only, under ``vm_step_cap``) for official EX; None
    when it fails, is refused, hits the cap or returns more than `OFFICIAL_MAX_ROWS` rows."""
    try:
        res = sandbox.query(sql, vm_step_cap=vm_step_cap, max_rows=OFFICIAL_MAX_ROWS)
    except BapsqlError:
        return None
    if res.interrupted or res.rows_total > len(res.rows):
        return None
    return frozenset(map(tuple, res.rows))


def final_sql(citations: Sequence[str], store: EvidenceStore, executed: Sequence[str]) -> str | None:
    """The episode's final SQL for official EX: the query of the first cited block that exists, else the last
    query that ran; None when no query ran."""
    for ref in citations:
        block = store.get(ref)
        if block is not None:
            return block.sql
    return executed[-1] if executed else None


def gold_answer(task: Task, sandbox: "Sandbox", vm_step_cap: int | None) -> Answer | None:
    """The task's typed gold answer; None when it has none and its gold SQL fails, is refused or hits the cap."""
    if task.gold is not None:
        return task.gold
    if not task.gold_sql.strip():
        return None
    try:
        res = sandbox.query(task.gold_sql, vm_step_cap=vm_step_cap, max_rows=GOLD_MAX_ROWS)
    except BapsqlError:
        return None
    if res.interrupted or res.rows_total > len(res.rows):
        return None
    return answer_from_rows(res.rows, ordered=is_ordered_sql(task.gold_sql))


def classify_failure(
    *,
    success: bool,
    correct: bool,
    answer: Answer | None,
    gold: Answer | None,
    abstained: bool,
    history: Sequence[tuple[str, str | None]],
    store: EvidenceStore,
    tags: Sequence[str],
    level: str,
) -> str:
    """The failure kind ('' for a success):

    - abstained: ``justified_abstention_wrong`` when the task is tagged ``unanswerable_<level>`` (e.g.
      ``unanswerable_xs``: even the gold query exceeds this budget), else ``unjustified_abstention``;
    - answered: ``malformed_answer`` when its shape does not fit the gold's (value count of a scalar, row arity);
      ``out_of_turns`` when it was correct but a channel was breached (audit); ``wrong_with_sufficient_evidence``
      when the currently visible evidence supports every gold value; else ``insufficient_evidence``;
    - truncated: ``invalid_actions`` when every action was invalid; ``terminal_rejection`` when the last valid
      action was a rejected execution; else ``out_of_turns``.
    """
    if success:
        return ""
    if abstained:
        return "justified_abstention_wrong" if f"unanswerable_{level.lower()}" in tags else "unjustified_abstention"
    if answer is not None:
        if gold is not None and not answer_shape_ok(answer, gold):
            return "malformed_answer"
        if correct:
            return "out_of_turns"
        visible = [b.ref for b in store.blocks if b.state == "visible"]
        if gold is not None and visible and evidence_breakdown(gold, visible, store).support >= 0.25 - 1e-12:
            return "wrong_with_sufficient_evidence"
        return "insufficient_evidence"
    if history and all(action == "invalid" for action, _ in history):
        return "invalid_actions"
    valid = [(a, s) for a, s in history if a != "invalid"]
    if valid and valid[-1] == ("execute_query", "rejected"):
        return "terminal_rejection"
    return "out_of_turns"


def summarize(
    *,
    task: Task,
    level: str,
    ledger: "Ledger",
    store: EvidenceStore,
    answer: Answer | None,
    citations: Sequence[str],
    gold: Answer | None,
    correct: bool,
    abstained: bool,
    terminated: bool,
    truncated: bool,
    shield_breach: bool,
    history: Sequence[tuple[str, str | None]],
    wall_s: float,
    official_ex: bool | None = None,
) -> EpisodeSummary:
    """The episode's summary: budgeted success = terminated ∧ correct ∧ feasible (no ledger or shield breach)."""
    led = ledger
    feasible = led.feasible and not shield_breach
    success = terminated and correct and feasible
    return EpisodeSummary(
        task_id=task.task_id, db_id=task.db_id, budget=level,
        answer=json.dumps(answer.to_json()) if answer else None, gold=json.dumps(gold.to_json()) if gold else None,
        correct=correct, feasible=feasible, success=success, reward=1.0 if success else 0.0,
        evidence_score=evidence_score(answer, citations, store) if answer else 0.0,
        queries=led.queries, result_tokens=led.result_tokens, vm_steps=led.vm_steps, turns=led.turns,
        prompt_tokens=led.prompt_tokens, completion_tokens=led.completion_tokens,
        controller_tokens=led.controller_tokens, total_tokens=led.total_tokens, peak_context=led.peak_context,
        warnings=led.warnings, rewrites=led.rewrites, rejections=led.rejections, invalid_actions=led.invalid_actions,
        abstained=abstained, terminated=terminated, truncated=truncated, breach=not feasible, wall_s=round(wall_s, 6),
        official_ex=official_ex,
        failure=classify_failure(success=success, correct=correct, answer=answer, gold=gold, abstained=abstained,
                                 history=history, store=store, tags=task.tags, level=level),
        citations=tuple(citations), breaches=led.breaches + (("shield",) if shield_breach else ()),
    )
