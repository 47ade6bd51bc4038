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

Both passes count requests alike: every estimate/rewrite turn is a request (`is_request`), rejected ones
included (a request the environment refused — no VM steps left, a busy database — still takes its k), so the k-th
request means the same turn on both sides.

When the logged pass makes exactly the requests of the recording pass (always true up to the first estimate a
policy acts on, and for any policy that does not condition later requests on the numbers it is shown), the multiset
of shown payloads equals the multiset of true ones. A request the recording pass did not make (the policy reacted
to a placebo number) takes a payload of the same level *without replacement while the pool lasts*: the next one
of a seeded shuffle of the level's recorded payloads, a fresh shuffle only once every one was drawn (within one
pool: each env worker of a distributed sweep holds its own copy). `PlaceboPool.unmatched` counts requests without a
partner in the other pass — requests the recording pass never made (``extra``) plus recorded requests never made
here (``unused``) — so 0 means both passes made the same requests, and then the shown multiset is the true one; a
report (``sweep.json``, the analysis report) says how far from exact the permutation was. A level with no recorded
payload is refused (`ConfigError`): the placebo never falls back to the true estimates.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

Payload = tuple[tuple[float, float], tuple[float, float], tuple[float, float]]  # (rows, tokens, steps) × (p50, p95)
RequestKey = tuple[str, int, int]  # (task id, seed, k-th estimate request of the episode)
ESTIMATE_ACTIONS = ("estimate_query", "rewrite_query")


def is_request(turn) -> bool:
    """Whether a turn (`TurnRecord`, `TurnDraft` or logged turn row) is an estimate request: every estimate/rewrite
    turn, rejected or failed ones included. The one rule both passes count by."""
    return turn.action in ESTIMATE_ACTIONS


def payloads_from_turns(level: str, task_id: str, seed: int, turns: Iterable) -> list[tuple[str, RequestKey, Payload]]:
    """The true payloads of one recorded episode's estimate/rewrite turns (`TurnRecord` s, or logged turn rows
    where a missing estimate reads NaN) that showed one, keyed by (task id, seed, k) in request order."""
    out = []
    k = 0
    for t in turns:
        if not is_request(t):
            continue
        if t.est_rows_p50 is not None and t.est_rows_p50 == t.est_rows_p50:  # NaN: an estimate that failed
            payload = ((t.est_rows_p50, t.est_rows_p95), (t.est_result_tokens_p50, t.est_result_tokens_p95),
                       (t.est_vm_steps_p50, t.est_vm_steps_p95))
            out.append((level, (task_id, int(seed), k), payload))
        k += 1
    return out


def request_keys(level: str, task_id: str, seed: int, turns: Iterable) -> list[tuple[str, RequestKey]]:
    """(level, key) of every request of one episode (shown or not), counted as `payloads_from_turns` counts."""
    return [(level, (task_id, int(seed), k)) for k, _ in enumerate(t for t in turns if is_request(t))]


def _draw_seed(seed: int, *parts: object) -> list[int]:
    return [int(seed) & 0xFFFFFFFF, *(zlib.crc32(str(p).encode()) for p in parts)]


@dataclass
class PlaceboPool:
    """A seeded permutation of recorded payloads, per budget level (see the module docstring)."""

    recorded: Sequence[tuple[str, RequestKey, Payload]]
    seed: int = 0
    extra: int = 0  # requests the recording pass never made (shown a payload drawn without replacement)
    shown_count: int = 0
    _assigned: dict[str, dict[RequestKey, Payload]] = field(default_factory=dict, repr=False)
    _pool: dict[str, list[Payload]] = field(default_factory=dict, repr=False)
    _queue: dict[str, list[Payload]] = field(default_factory=dict, repr=False)  # the extra requests' draws
    _rounds: dict[str, int] = field(default_factory=dict, repr=False)
    _requested: set[tuple[str, RequestKey]] = field(default_factory=set, repr=False)

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
            self._queue[level], self._rounds[level] = [], 0

    def levels(self) -> tuple[str, ...]:
        return tuple(self._pool)

    def shown(self, level: str, key: RequestKey) -> Payload:
        """The payload to show for request ``key`` at ``level``; `ConfigError` when the level recorded none."""
        assigned = self._assigned.get(level)
        if not assigned:
            from bapsql.errors import ConfigError

            raise ConfigError(f"placebo: budget level {level!r} recorded no estimate payloads (its recording pass made "
                              f"no estimate request there; levels with payloads: {list(self._pool) or 'none'}), so "
                              "there is nothing to permute and the true estimates are never shown instead. Record "
                              "the source method at this level or leave the level out of the placebo run")
        self._requested.add((level, key))
        got = assigned.get(key)
        if got is None:  # never recorded: the next payload of a seeded shuffle of the level's pool
            self.extra += 1
            queue = self._queue[level]
            if not queue:  # a fresh round once every payload was drawn
                pool = self._pool[level]
                rng = np.random.default_rng(_draw_seed(self.seed, "extra", level, self._rounds[level]))
                queue[:] = [pool[int(i)] for i in rng.permutation(len(pool))]
                self._rounds[level] += 1
            got = queue.pop()
        self.shown_count += 1
        return got

    @property
    def unused(self) -> int:
        """Recorded requests this pass never made."""
        return sum(1 for level, key, _ in self.recorded if (level, key) not in self._requested)

    @property
    def unmatched(self) -> int:
        """Requests without a partner in the other pass: ``extra`` + ``unused`` (0: both passes made the same
        requests, so the shown multiset is the true one)."""
        return self.extra + self.unused

    def stats(self) -> dict[str, int]:
        """What a run record reports about the placebo (`placebo_stats` computes the same from logs)."""
        return {"recorded": len(self.recorded), "requests": len(self._requested), "shown": self.shown_count,
                "extra": self.extra, "unused": self.unused, "unmatched": self.unmatched}

    def assignment(self, level: str) -> Mapping[RequestKey, Payload]:
        """The permutation of one level: recorded key → shown payload."""
        return dict(self._assigned.get(level, {}))


def placebo_stats(recorded: Iterable[tuple[str, RequestKey, Payload]],
                  requests: Iterable[tuple[str, RequestKey]]) -> dict[str, int]:
    """`PlaceboPool.stats` from the two passes' keys alone (the recorded payloads and the placebo run's logged
    requests, `request_keys`): what a distributed sweep reports, whatever worker showed which request."""
    rec = {(lv, tuple(k)) for lv, k, _ in recorded}
    req = [(lv, tuple(k)) for lv, k in requests]
    seen = set(req)
    extra, unused = sum(1 for r in req if r not in rec), len(rec - seen)
    return {"recorded": len(rec), "requests": len(req), "shown": len(req), "extra": extra, "unused": unused,
            "unmatched": extra + unused}


def pool_to_json(pool: PlaceboPool) -> dict:
    """Plain data of a pool (what a sweep hands its env workers through the run folder)."""
    return {"seed": pool.seed, "recorded": [[lv, list(key), [list(q) for q in p]] for lv, key, p in pool.recorded]}


def pool_from_json(data: dict) -> PlaceboPool:
    """The pool `pool_to_json` wrote."""
    recorded = [(lv, (str(k[0]), int(k[1]), int(k[2])), tuple(tuple(float(x) for x in q) for q in p))
                for lv, k, p in data["recorded"]]
    return PlaceboPool(recorded, seed=int(data["seed"]))
