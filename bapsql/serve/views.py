"""The JSON the service answers with: the one place a served episode becomes text (plain dicts, JSON-ready).

`turn_view` is one turn (action, SQL, the estimate shown or the shield's own, the shield outcome, the ledger after
it, the model's tokens and the turn's latency split); `ask_view` is a whole answer — the contract of ``POST /v1/ask``:
``status`` (answered | abstained | budget_exhausted), ``answer`` (null or ``{"kind", "values"}``), ``ledger``
(``queries``, ``result_tokens``, ``vm_steps``, ``turns``, ``context_tokens``, ``total_tokens``, with ``budget`` and
``remaining``), ``turns``, ``evidence`` (the cited blocks' rows, at most `EVIDENCE_ROWS` each), ``tokens``,
``latency`` and ``episode_id``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

EVIDENCE_ROWS = 50  # rows of a cited block shown in an answer
COMPLETION_CHARS = 4000  # of the model's text per turn


def _cell(v: Any) -> Any:
    """A JSON-safe cell (bytes and non-finite floats as text)."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return f"<{len(bytes(v))} bytes>"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _estimate(rec: Any) -> dict | None:
    if rec.est_rows_p50 is None and rec.est_vm_steps_p50 is None:
        return None
    return {"rows": [rec.est_rows_p50, rec.est_rows_p95],
            "result_tokens": [rec.est_result_tokens_p50, rec.est_result_tokens_p95],
            "vm_steps": [rec.est_vm_steps_p50, rec.est_vm_steps_p95]}


def turn_view(info: dict, record: Any, generation: Any, completion: str,
              timing: tuple[float, float, float]) -> dict:
    """One played turn: ``info`` of its env step, its `TurnRecord`, the engine's `Generation` and text, and its
    ``(model_s, db_s, harness_s)``."""
    shield = info.get("shield") or None
    usage = getattr(generation, "usage", None)
    return {
        "turn": record.turn, "action": record.action, "valid": record.valid, "sql": record.sql,
        "status": record.status, "message": info.get("message") or "", "warning": record.warning,
        "estimate": _estimate(record),
        "actual": {"rows": record.actual_rows, "result_tokens": record.actual_result_tokens,
                   "vm_steps": record.actual_vm_steps} if record.actual_vm_steps is not None else None,
        "shield": None if shield is None else {
            "status": shield.get("status"), "rows_total": shield.get("rows_total"),
            "truncated_by": shield.get("truncated_by"), "rejection": shield.get("rejection"),
            "message": shield.get("message")},
        "evidence_ref": info.get("evidence_ref"),
        "ledger": info.get("ledger"),
        "model_tokens": {"prompt": usage[0] if usage else len(generation.prompt_ids),
                         "completion": usage[1] if usage else len(generation.completion_ids),
                         "source": "usage" if usage else "tokenizer"},
        "completion": completion[:COMPLETION_CHARS],
        "latency": {"model_s": round(timing[0], 6), "db_s": round(timing[1], 6), "harness_s": round(timing[2], 6)},
    }


def _status(summary: Any) -> str:
    if summary.abstained:
        return "abstained"
    if summary.answer is not None and summary.terminated:
        return "answered"
    return "budget_exhausted"


def _evidence(store: Any, refs: Sequence[str]) -> list[dict]:
    out = []
    for ref in refs:
        block = store.get(ref)
        if block is None:
            continue
        out.append({"ref": block.ref, "sql": block.sql, "columns": list(block.columns),
                    "rows": [[_cell(v) for v in row] for row in block.rows[:EVIDENCE_ROWS]],
                    "rows_total": block.rows_total, "truncated": block.truncated or len(block.rows) > EVIDENCE_ROWS})
    return out


def ask_view(episode_id: str, db: str, level: str, condition: str, summary: Any, snapshot: Any, store: Any,
             turns: list[dict], timings: Sequence[tuple[float, float, float]], *, queue_s: float, log_s: float,
             total_s: float) -> dict:
    """A finished served episode (see the module docstring)."""
    answer = json.loads(summary.answer) if summary.answer is not None else None
    model_s = sum(t[0] for t in timings)
    db_s = sum(t[1] for t in timings)
    usage_known = all(t["model_tokens"]["source"] == "usage" for t in turns) and bool(turns)
    return {
        "episode_id": episode_id, "db": db, "budget": level, "condition": condition, "status": _status(summary),
        "answer": answer, "citations": list(summary.citations),
        "ledger": {**snapshot.spent.as_dict(), "total_tokens": snapshot.total_tokens,
                   "budget": snapshot.budget.as_dict(), "remaining": snapshot.remaining.as_dict()},
        "feasible": summary.feasible, "breach": summary.breach,
        "tokens": {"prompt": summary.prompt_tokens, "completion": summary.completion_tokens,
                   "total": summary.total_tokens,
                   "model_reported": {"prompt": sum(t["model_tokens"]["prompt"] for t in turns),
                                      "completion": sum(t["model_tokens"]["completion"] for t in turns),
                                      "source": "usage" if usage_known else "tokenizer"}},
        "turns": turns,
        "evidence": _evidence(store, summary.citations),
        "latency": {"total_s": round(total_s, 6), "queue_s": round(queue_s, 6), "model_s": round(model_s, 6),
                    "db_s": round(db_s, 6), "harness_s": round(max(0.0, total_s - model_s - db_s), 6),
                    "log_s": round(log_s, 6)},
    }
