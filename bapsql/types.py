"""Small value types shared by every layer: typed answers and tasks.

They sit at the bottom of the dependency graph (DESIGN §8), so `db`, `env`, `data`, `policies` and `logs` can all
speak them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

AnswerKind = Literal["scalar", "list", "ordered_list"]
ANSWER_KINDS: tuple[str, ...] = ("scalar", "list", "ordered_list")

# A cell of an answer: SQLite's value domain minus blobs (answers are never binary).
Cell = Union[int, float, str, None]


@dataclass(frozen=True)
class Answer:
    """A typed answer.

    ``kind`` is ``scalar`` (exactly one value), ``list`` (a multiset: order ignored) or ``ordered_list`` (order is
    part of the answer). ``values`` holds the cells; a multi-column row is one tuple cell-group flattened as a tuple.
    Normalization and comparison live in `bapsql.env.scoring`; this type only carries data.
    """

    kind: AnswerKind
    values: tuple

    def __post_init__(self) -> None:
        if self.kind not in ANSWER_KINDS:
            raise ValueError(f"answer kind must be one of {ANSWER_KINDS}, got {self.kind!r}")
        if not isinstance(self.values, tuple):
            object.__setattr__(self, "values", tuple(self.values))
        if self.kind == "scalar" and len(self.values) != 1:
            raise ValueError(f"a scalar answer has exactly one value, got {len(self.values)}")

    def to_json(self) -> dict:
        return {"kind": self.kind, "values": [list(v) if isinstance(v, tuple) else v for v in self.values]}

    @classmethod
    def from_json(cls, obj: dict) -> "Answer":
        return cls(obj["kind"], tuple(tuple(v) if isinstance(v, list) else v for v in obj["values"]))


@dataclass(frozen=True)
class Task:
    """One benchmark question over one SQLite database.

    ``gold_sql`` is visible only to scoring and to the documented workflow oracle (`bapsql.policies.oracle`), never
    to a policy's prompt. ``evidence`` is the benchmark's hint text ('' when it has none). ``tags`` carry generator or
    loader annotations such as ``budget_sensitive`` or ``unanswerable_xs``.
    """

    task_id: str
    db_id: str
    db_path: str
    question: str
    gold_sql: str
    gold: Answer | None = None
    evidence: str = ""
    difficulty: str = ""
    source: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    # An obvious but possibly over-budget query for the question (e.g. listing raw rows instead of aggregating),
    # when the benchmark generator knows one. Like gold_sql, only scoring and the workflow oracle may read it.
    naive_sql: str = ""
