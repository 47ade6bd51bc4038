"""The frozen joint budget ladder (DESIGN §3, paper Table 1), loaded from ``configs/budgets.yaml``.

A `Budget` has five channels. ``context_tokens`` is a *level*: it bounds the live prompt at every turn and regains
headroom when evidence is archived or compressed. ``queries``, ``result_tokens`` and ``vm_steps`` are *cumulative* and
never refunded. ``turns`` is the turn ceiling: every action, valid or not, consumes one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from bapsql.config import from_mapping, read_yaml
from bapsql.errors import ConfigError

LEVELS: tuple[str, ...] = ("XS", "S", "M", "L")
CHANNELS: tuple[str, ...] = ("context_tokens", "queries", "result_tokens", "vm_steps", "turns")
DEFAULT_BUDGETS_PATH = Path(__file__).resolve().parents[1] / "configs" / "budgets.yaml"


@dataclass(frozen=True)
class Budget:
    """One joint budget. ``level`` names it (XS/S/M/L for the ladder, anything else for custom probes)."""

    level: str
    context_tokens: int
    queries: int
    result_tokens: int
    vm_steps: int
    turns: int

    def __post_init__(self) -> None:
        for ch in CHANNELS:
            v = getattr(self, ch)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"budget {self.level}.{ch}: must be a non-negative integer, got {v!r}")
        if self.turns < 1:
            raise ConfigError(f"budget {self.level}.turns: must be at least 1, got {self.turns}")

    def as_dict(self) -> dict[str, int]:
        return {ch: getattr(self, ch) for ch in CHANNELS}

    def scaled(self, factor: float, level: str | None = None) -> "Budget":
        """A budget with every cumulative channel and the context scaled (turns kept), for sensitivity probes."""
        vals = {ch: max(0, round(getattr(self, ch) * factor)) for ch in CHANNELS if ch != "turns"}
        return dataclasses.replace(self, level=level or f"{self.level}x{factor:g}", **vals)


@dataclass(frozen=True)
class _LevelSpec:
    context_tokens: int
    queries: int
    result_tokens: int
    vm_steps: int
    turns: int


@dataclass(frozen=True)
class _LadderFile:
    version: int
    levels: dict[str, _LevelSpec]


@dataclass(frozen=True)
class BudgetLadder:
    """The ordered ladder of budgets, tightest first."""

    budgets: tuple[Budget, ...]

    def __getitem__(self, level: str) -> Budget:
        for b in self.budgets:
            if b.level == level:
                return b
        raise ConfigError(f"unknown budget level {level!r}; known levels are {[b.level for b in self.budgets]}")

    @property
    def levels(self) -> tuple[str, ...]:
        return tuple(b.level for b in self.budgets)

    def parse_levels(self, spec: str) -> tuple[Budget, ...]:
        """Parse a comma-separated list such as ``"XS,S"`` into budgets, rejecting unknown names."""
        names = [s.strip() for s in spec.split(",") if s.strip()]
        if not names:
            raise ConfigError("no budget levels given; use e.g. XS,S,M,L")
        return tuple(self[n] for n in names)


def load_ladder(path: str | Path = DEFAULT_BUDGETS_PATH) -> BudgetLadder:
    """Load and validate the ladder file. Unknown keys or bad values raise `ConfigError` naming the key."""
    raw = read_yaml(path)
    spec = from_mapping(_LadderFile, raw)
    if spec.version != 1:
        raise ConfigError(f"{path}: version: unsupported ladder version {spec.version}; expected 1")
    if not spec.levels:
        raise ConfigError(f"{path}: levels: at least one level is required")
    budgets = tuple(Budget(level=name, **dataclasses.asdict(ls)) for name, ls in spec.levels.items())
    for a, b in zip(budgets, budgets[1:]):
        for ch in CHANNELS:
            if getattr(b, ch) < getattr(a, ch):
                raise ConfigError(
                    f"{path}: levels.{b.level}.{ch}: ladder must be non-decreasing, but {b.level} < {a.level}"
                )
    return BudgetLadder(budgets)


def get_budget(level: str, path: str | Path = DEFAULT_BUDGETS_PATH) -> Budget:
    """Convenience: one level of the default ladder."""
    return load_ladder(path)[level]
