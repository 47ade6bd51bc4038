"""The cost-matched placebo (paper Table 4, "shuffled estimate"; DESIGN §4 ``estimates: permuted``).

The policy is shown p50/p95 payloads that are a seeded permutation of the payloads *actually requested under the
same condition and budget*, while the shield, its preflight and every charge keep the true estimates. So the
placebo removes the information in the estimates but keeps their distribution (cost-matched).

Requests are only known once they are made, so the placebo is a two-pass procedure (the runner does it):

1. a recording pass plays the cell (policy, condition, budget, seeds, tasks) with true estimates shown and nothing
   logged; `payloads_from_turns` collects each estimate/rewrite turn's true payload under the key
   (task id, seed, k) — the k-th estimate request of that episode;
2. `PlaceboPool(recorded, seed)` permutes, per budget level, the recorded payloads among the recorded keys; the
   logged pass shows, for request (task, seed, k), the payload the permutation assigned to that key.

When the logged pass makes exactly the requests of the recording pass (always true up to the first estimate a
policy acts on, and for any policy that does not condition later requests on the numbers it is shown), the multiset
of shown payloads equals the multiset of true ones. A request the recording pass did not make (the policy reacted
to a placebo number) is shown a seeded draw from the same level's pool; `PlaceboPool.unmatched` counts those, so a
report can say how far from exact the permutation was.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

Payload = tuple[tuple[float, float], tuple[float, float], tuple[float, float]]  # (rows, tokens, steps) × (p50, p95)
RequestKey = tuple[str, int, int]  # (task id, seed, k-th estimate request of the episode)
ESTIMATE_ACTIONS = ("estimate_query", "rewrite_query")


def payloads_from_turns(level: str, task_id: str, seed: int, turns: Iterable) -> list[tuple[str, RequestKey, Payload]]:
    """The true payloads of one recorded episode's estimate/rewrite turns (`TurnRecord` s, or logged turn rows
    where a missing estimate reads NaN) that showed one, keyed by (task id, seed, k) in request order."""
    out = []
    k = 0
    for t in turns:
        if t.action not in ESTIMATE_ACTIONS:
            continue
        if t.est_rows_p50 is not None and t.est_rows_p50 == t.est_rows_p50:  # NaN: an estimate that failed
            payload = ((t.est_rows_p50, t.est_rows_p95), (t.est_result_tokens_p50, t.est_result_tokens_p95),
                       (t.est_vm_steps_p50, t.est_vm_steps_p95))
            out.append((level, (task_id, int(seed), k), payload))
        k += 1
    return out


def _draw_seed(seed: int, *parts: object) -> list[int]:
    return [int(seed) & 0xFFFFFFFF, *(zlib.crc32(str(p).encode()) for p in parts)]


@dataclass
class PlaceboPool:
    """A seeded permutation of recorded payloads, per budget level (see the module docstring)."""

    recorded: Sequence[tuple[str, RequestKey, Payload]]
    seed: int = 0
    unmatched: int = 0
    shown_count: int = 0
    _assigned: dict[str, dict[RequestKey, Payload]] = field(default_factory=dict, repr=False)
    _pool: dict[str, list[Payload]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        by_level: dict[str, list[tuple[RequestKey, Payload]]] = {}
        for level, key, payload in self.recorded:
            by_level.setdefault(level, []).append((key, payload))
        for level, items in by_level.items():
            items.sort(key=lambda kv: kv[0])  # the assignment never depends on the order episodes ran in
            keys = [k for k, _ in items]
            payloads = [p for _, p in items]
            perm = np.random.default_rng(_draw_seed(self.seed, "placebo", level)).permutation(len(items))
            self._assigned[level] = {keys[i]: payloads[int(perm[i])] for i in range(len(items))}
            self._pool[level] = payloads

    def levels(self) -> tuple[str, ...]:
        return tuple(self._pool)

    def shown(self, level: str, key: RequestKey) -> Payload | None:
        """The payload to show for request ``key`` at ``level`` (None when the level recorded no request)."""
        got = self._assigned.get(level, {}).get(key)
        if got is None:
            pool = self._pool.get(level)
            if not pool:
                return None
            self.unmatched += 1
            got = pool[int(np.random.default_rng(_draw_seed(self.seed, "extra", level, *key)).integers(len(pool)))]
        self.shown_count += 1
        return got

    def assignment(self, level: str) -> Mapping[RequestKey, Payload]:
        """The permutation of one level: recorded key → shown payload."""
        return dict(self._assigned.get(level, {}))


def pool_to_json(pool: PlaceboPool) -> dict:
    """Plain data of a pool (what a sweep hands its env workers through the run folder)."""
    return {"seed": pool.seed, "recorded": [[lv, list(key), [list(q) for q in p]] for lv, key, p in pool.recorded]}


def pool_from_json(data: dict) -> PlaceboPool:
    """The pool `pool_to_json` wrote."""
    recorded = [(lv, (str(k[0]), int(k[1]), int(k[2])), tuple(tuple(float(x) for x in q) for q in p))
                for lv, k, p in data["recorded"]]
    return PlaceboPool(recorded, seed=int(data["seed"]))
