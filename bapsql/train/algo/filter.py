"""The online difficulty filter (DESIGN §5, paper "Training"): keep rollout groups with 2–6 successes of 8.

A *group* is the ``G`` trajectories of one (task, budget) prompt; its key is ``(task_id, budget)``. A group is kept
when ``min_success <= successes <= max_success`` (all-fail and all-succeed groups carry no GRPO signal: their
advantages are all zero).

`DifficultyFilter` holds the filter's state across updates: the 0–G success histogram of every group it has judged
(this update and in total), the running keep rate, and per-key counts (seen, kept, last successes). `fill_update`
runs the refill loop of one update: it asks ``draw(k)`` for ``k`` fresh groups, keeps the good ones, and draws again
until ``groups_per_update`` are kept or ``max_rounds`` rounds have run. A starving pool never raises: the result says
``starved`` and carries what was kept (the training loop logs it and trains on fewer groups, or skips the update).
Surplus kept groups of the last round are dropped (the last drawn first; carrying them over would train on
rollouts of an older policy).
The number of groups drawn per round is ``ceil(missing / keep_rate)`` with the running keep rate (floored at
``min_keep_rate``), capped at ``max_groups_per_round``.

State is plain JSON (`state_dict` / `load_state_dict`) so checkpoints restore it exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Generic, Sequence, TypeVar

from bapsql.errors import ConfigError

G = TypeVar("G")


@dataclass(frozen=True)
class FilterConfig:
    """Filter knobs; the defaults are the paper's (8 samples, keep 2–6 successes, 16 kept groups per update)."""

    group_size: int = 8
    min_success: int = 2
    max_success: int = 6
    groups_per_update: int = 16
    max_rounds: int = 6
    min_keep_rate: float = 0.1
    max_groups_per_round: int = 128
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.group_size < 1 or self.groups_per_update < 1 or self.max_rounds < 1 or self.max_groups_per_round < 1:
            raise ConfigError("filter: group_size, groups_per_update, max_rounds and max_groups_per_round must be "
                              ">= 1")
        if not 0 <= self.min_success <= self.max_success <= self.group_size:
            raise ConfigError(f"filter: need 0 <= min_success <= max_success <= group_size, got "
                              f"{self.min_success}, {self.max_success}, {self.group_size}")
        if not 0 < self.min_keep_rate <= 1:
            raise ConfigError(f"filter.min_keep_rate: must be in (0, 1], got {self.min_keep_rate}")


@dataclass(frozen=True)
class Judged(Generic[G]):
    """One group as the filter judged it: its key, success count, and whether it was kept."""

    key: tuple[str, str]
    successes: int
    kept: bool
    group: G


@dataclass(frozen=True)
class FillResult(Generic[G]):
    """One update's refill: the kept groups (at most ``groups_per_update``), how many rounds and groups were drawn,
    the update's 0–G success histogram, and whether the pool starved (fewer kept than wanted)."""

    kept: list
    rounds: int
    drawn: int
    histogram: tuple[int, ...]
    starved: bool
    dropped_surplus: int = 0

    @property
    def kept_share(self) -> float:
        """Share of drawn groups that passed the filter."""
        return len(self.kept) / self.drawn if self.drawn else 0.0


@dataclass
class KeyStats:
    seen: int = 0
    kept: int = 0
    last_successes: int = -1


@dataclass
class DifficultyFilter:
    """Stateful judge of rollout groups (see the module docstring)."""

    cfg: FilterConfig
    total_histogram: list[int] = field(default_factory=list)
    judged: int = 0
    kept: int = 0
    keys: dict[tuple[str, str], KeyStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.total_histogram:
            self.total_histogram = [0] * (self.cfg.group_size + 1)

    def passes(self, successes: int, size: int | None = None) -> bool:
        """Whether a group with ``successes`` of ``size`` (default ``group_size``) is kept."""
        size = self.cfg.group_size if size is None else size
        if not 0 <= successes <= size:
            raise ValueError(f"successes {successes} outside [0, {size}]")
        if not self.cfg.enabled:
            return True
        return self.cfg.min_success <= successes <= self.cfg.max_success

    @property
    def keep_rate(self) -> float:
        """Running share of judged groups that were kept (1.0 before any group was judged)."""
        return self.kept / self.judged if self.judged else 1.0

    def judge(self, key: tuple[str, str], successes: int, group: G, size: int | None = None) -> Judged[G]:
        """Judge one group and record it in the state."""
        ok = self.passes(successes, size)
        self.judged += 1
        self.kept += int(ok)
        if 0 <= successes < len(self.total_histogram):
            self.total_histogram[successes] += 1
        st = self.keys.setdefault((str(key[0]), str(key[1])), KeyStats())
        st.seen += 1
        st.kept += int(ok)
        st.last_successes = successes
        return Judged((str(key[0]), str(key[1])), successes, ok, group)

    def round_size(self, missing: int) -> int:
        """Groups to draw when ``missing`` kept groups are still wanted."""
        rate = max(self.keep_rate, self.cfg.min_keep_rate)
        return max(1, min(self.cfg.max_groups_per_round, math.ceil(missing / rate)))

    def state_dict(self) -> dict:
        return {"total_histogram": list(self.total_histogram), "judged": self.judged, "kept": self.kept,
                "keys": [[k[0], k[1], s.seen, s.kept, s.last_successes] for k, s in sorted(self.keys.items())]}

    def load_state_dict(self, state: dict) -> None:
        hist = [int(x) for x in state["total_histogram"]]
        if len(hist) != self.cfg.group_size + 1:
            raise ConfigError(f"filter state has a {len(hist) - 1}-sample histogram, config says "
                              f"{self.cfg.group_size}")
        self.total_histogram = hist
        self.judged = int(state["judged"])
        self.kept = int(state["kept"])
        self.keys = {(t, b): KeyStats(int(s), int(k), int(last)) for t, b, s, k, last in state["keys"]}


def fill_update(filt: DifficultyFilter, draw: Callable[[int], Sequence[G]],
                outcome: Callable[[G], tuple[tuple[str, str], int, int]]) -> FillResult[G]:
    """Draw and judge groups until ``groups_per_update`` are kept or ``max_rounds`` rounds ran.

    ``draw(k)`` returns ``k`` fresh groups (it may return fewer when the task pool is exhausted: that also ends the
    refill). ``outcome(group)`` returns ``(key, successes, size)``."""
    cfg = filt.cfg
    want = cfg.groups_per_update
    kept: list[G] = []
    hist = [0] * (cfg.group_size + 1)
    rounds = drawn = 0
    while len(kept) < want and rounds < cfg.max_rounds:
        k = filt.round_size(want - len(kept))
        groups = list(draw(k))
        rounds += 1
        drawn += len(groups)
        for g in groups:
            key, successes, size = outcome(g)
            j = filt.judge(key, successes, g, size)
            if 0 <= successes < len(hist):
                hist[successes] += 1
            if j.kept:
                kept.append(g)
        if len(groups) < k:
            break
    surplus = max(0, len(kept) - want)
    kept = kept[:want]
    return FillResult(kept=kept, rounds=rounds, drawn=drawn, histogram=tuple(hist), starved=len(kept) < want,
                      dropped_surplus=surplus)


def histogram_metrics(hist: Sequence[int], prefix: str = "filter/successes_") -> dict[str, float]:
    """The 0–G histogram as monitor metrics ``{prefix}0 ... {prefix}G``."""
    return {f"{prefix}{i}": float(c) for i, c in enumerate(hist)}

