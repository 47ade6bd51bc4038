"""Calibration of the estimator: multiplicative p50/p95 factors per quantity and shape class, fitted offline.

The estimator produces a `RawEstimate`: point estimates of rows (with a hard upper bound ``ub`` and an ``exact``
flag), of the header and per-row result tokens, and of VM steps. `Calibration.quantiles` turns it into p50/p95:
- rows: ``p50 = min(f50 · r, ub)``, ``p95 = min(f95 · max(r, 1), ub)``; an exact count is returned as is;
- VM steps: ``p50 = f50 · v``, ``p95 = f95 · max(v, 1)``;
- result tokens: ``p50 = f50 · (header · min(r, 1) + r · t)`` and ``p95 = header + g · rows_p95 · t`` with t the
  estimated tokens per row: the token p95 inherits the row p95 (so LIMIT, aggregates and unique keys keep it
  tight) and ``g`` (stored as the result tokens' ``p95`` factor) covers the row-width error; 0 when rows_p95 is 0.
Factors are looked up by shape class (`SHAPES`), falling back to the quantity's default.

`bapsql.db.calibration_samples.collect_samples` keeps a query the collection cap stopped as a *stopped* sample (it cost more than the cap: VM steps
= the cap, rows and result tokens unknown). `coverage` counts it, for VM steps only, as a miss when the p50/p95 was
below the cap and leaves it out when above (unknown); `fit_calibration` never fits on it.

`fit_calibration(samples, target_coverage)` is pure. ``target_coverage`` is one share for every quantity or a mapping
with one per quantity (`coverage_targets`). Per quantity and class, `fit_factor` picks f95 as the smallest
factor reaching its target coverage on the fit set (an order statistic of actual / base), never below
``min_factor``, and f50 as the median ratio clipped to [0.5, 2]. The rows factors are fitted first; the token
factor ``g`` is then fitted on (rows_p95 · t, actual − header) pairs. Capping by a valid upper bound never lowers
coverage, so factors fitted on uncapped ratios keep it.

`load_calibration(path=None)` reads the strict JSON format (unknown keys raise `ConfigError` naming the key);
``None`` loads the packaged default ``bapsql/resources/calibration.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from bapsql.config import from_mapping
from bapsql.errors import ConfigError


QUANTITIES: tuple[str, ...] = ("rows", "result_tokens", "vm_steps")
SHAPES: tuple[str, ...] = ("exact", "grouped", "join", "filter", "other")
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "resources" / "calibration.json"


@dataclass(frozen=True)
class Factors:
    """p50 and p95 multipliers of a raw estimate."""

    p50: float = 1.0
    p95: float = 1.0

    def __post_init__(self) -> None:
        for name in ("p50", "p95"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"calibration factor {name} must be a positive finite number, got {v!r}")


@dataclass(frozen=True)
class QuantityCalibration:
    """Factors of one quantity: ``default`` plus optional per-shape overrides."""

    default: Factors = Factors()
    by_shape: dict[str, Factors] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.by_shape) - set(SHAPES))
        if unknown:
            raise ConfigError(f"calibration by_shape: unknown shape(s) {unknown}; known shapes are {list(SHAPES)}")

    def factors(self, shape: str) -> Factors:
        return self.by_shape.get(shape, self.default)


@dataclass(frozen=True)
class RawEstimate:
    """Uncalibrated point estimates of one statement plus what calibration needs."""

    rows: float
    rows_ub: float
    rows_exact: bool
    header_tokens: float
    row_tokens: float  # estimated tokens of one rendered row
    vm_steps: float
    shape: str
    features: dict = field(default_factory=dict, compare=False)

    @property
    def result_tokens(self) -> float:
        """Expected result tokens: header (only charged when a row exists) + rows × tokens per row."""
        return self.header_tokens * min(1.0, self.rows) + self.rows * self.row_tokens


@dataclass(frozen=True)
class Calibration:
    """Per-quantity factors (see the module docstring for how each is applied). ``source`` / ``comment`` document
    how they were fitted."""

    rows: QuantityCalibration = QuantityCalibration()
    result_tokens: QuantityCalibration = QuantityCalibration()
    vm_steps: QuantityCalibration = QuantityCalibration()
    target_coverage: float | dict[str, float] = 0.95  # one share for every quantity, or one per quantity
    source: str = ""
    comment: str = ""

    def factors(self, quantity: str, shape: str) -> Factors:
        if quantity not in QUANTITIES:
            raise KeyError(f"unknown quantity {quantity!r}; known: {QUANTITIES}")
        return getattr(self, quantity).factors(shape)

    def rows_quantiles(self, raw: RawEstimate) -> tuple[float, float]:
        if raw.rows_exact:
            return raw.rows, raw.rows
        f = self.rows.factors(raw.shape)
        p50 = min(f.p50 * raw.rows, raw.rows_ub)
        return p50, min(max(f.p95 * max(raw.rows, 1.0), p50), raw.rows_ub)

    def quantiles(self, raw: RawEstimate) -> dict[str, tuple[float, float]]:
        """{quantity: (p50, p95)} of a raw estimate."""
        r50, r95 = self.rows_quantiles(raw)
        ft, fv = self.result_tokens.factors(raw.shape), self.vm_steps.factors(raw.shape)
        t50 = ft.p50 * raw.result_tokens
        t95 = raw.header_tokens + ft.p95 * r95 * raw.row_tokens if r95 > 0 else 0.0
        v50 = fv.p50 * raw.vm_steps
        v95 = fv.p95 * max(raw.vm_steps, 1.0)
        return {"rows": (r50, r95), "result_tokens": (t50, max(t50, t95)), "vm_steps": (v50, max(v50, v95))}

    @classmethod
    def identity(cls) -> "Calibration":
        """All factors 1: p50 = the raw estimate (used to collect fitting samples)."""
        return cls(source="identity", comment="all factors 1; raw estimates")

    def to_json(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


def load_calibration(path: str | Path | None = None) -> Calibration:
    """Load a calibration JSON file (``None``: the packaged default). Raises `ConfigError` on unknown keys, bad
    values or a missing file."""
    p = Path(path) if path is not None else DEFAULT_PATH
    if not p.is_file():
        raise ConfigError(f"calibration file not found: {p}")
    try:
        raw = json.loads(p.read_text())
    except ValueError as exc:
        raise ConfigError(f"{p}: not valid JSON: {exc}") from exc
    return from_mapping(Calibration, raw, where=str(p.name))


# ----------------------------------------------------------------------------------------------------------------------
# fitting


@dataclass(frozen=True)
class Sample:
    """One (raw estimate, actual) observation; actuals are the full result (rows, result tokens, VM steps). A
    ``stopped`` sample was stopped by the VM-step cap: ``vm_steps`` is that cap (the true cost is above it), rows
    and result tokens are NaN."""

    raw: RawEstimate
    rows: float
    result_tokens: float
    vm_steps: float
    db: str = ""
    sql: str = ""
    stopped: bool = False


def fit_factor(raw: np.ndarray, actual: np.ndarray, *, target_coverage: float = 0.99,
               floor: float | np.ndarray = 1.0, min_factor: float = 1.0) -> Factors:
    """Factors for one quantity from ``raw`` (n,) bases and ``actual`` (n,) values; ``floor`` is a scalar or (n,)
    per-sample lower bound of the base.

    f95 is the smallest factor f >= ``min_factor`` with mean(actual <= f · max(raw, floor)) >= ``target_coverage``
    (the ceil(target·n)-th smallest ratio); f50 is the median of actual / max(raw, floor) clipped to [0.5, 2].
    Empty input → Factors()."""
    raw = np.asarray(raw, dtype=float).reshape(-1)
    actual = np.asarray(actual, dtype=float).reshape(-1)
    if raw.shape != actual.shape:
        raise ValueError(f"raw and actual must have the same shape, got {raw.shape} and {actual.shape}")
    if raw.size == 0:
        return Factors()
    ratios = np.sort(actual / np.maximum(np.maximum(raw, floor), 1e-12))
    k = max(int(math.ceil(target_coverage * ratios.size)) - 1, 0)
    f95 = max(float(ratios[min(k, ratios.size - 1)]), min_factor)
    f50 = float(np.clip(np.median(ratios), 0.5, 2.0))
    return Factors(p50=f50, p95=max(f95, f50))


def _by_shape(samples: Sequence[Sample], min_shape_samples: int, fit) -> QuantityCalibration:
    shapes = np.array([s.raw.shape for s in samples])
    idx = np.arange(len(samples))
    by = {sh: fit(idx[shapes == sh]) for sh in SHAPES if int((shapes == sh).sum()) >= min_shape_samples}
    return QuantityCalibration(fit(idx), by)


def coverage_targets(target_coverage: float | Mapping[str, float]) -> dict[str, float]:
    """{quantity: target share} from one share (every quantity) or a mapping naming each of `QUANTITIES` once;
    ValueError naming the bad key or value otherwise."""
    if isinstance(target_coverage, Mapping):
        unknown = sorted(set(target_coverage) - set(QUANTITIES))
        missing = [q for q in QUANTITIES if q not in target_coverage]
        if unknown or missing:
            raise ValueError(f"target_coverage: unknown quantities {unknown}, missing {missing}; give one share for "
                             f"each of {list(QUANTITIES)} or a single number")
        targets = {q: target_coverage[q] for q in QUANTITIES}
    else:
        targets = {q: target_coverage for q in QUANTITIES}
    for q, v in targets.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.5 <= v < 1.0:
            raise ValueError(f"target_coverage {q} must be in [0.5, 1), got {v!r}")
    return {q: float(v) for q, v in targets.items()}


def fit_calibration(samples: Sequence[Sample], *, target_coverage: float | Mapping[str, float] = 0.99,
                    min_shape_samples: int = 40, min_factor: float = 1.0, source: str = "",
                    comment: str = "") -> Calibration:
    """Fit a `Calibration` on ``samples`` (module docstring): per quantity a default (all samples) and, for every
    shape class with at least ``min_shape_samples`` samples, its own factors, each to its quantity's target."""
    targets = coverage_targets(target_coverage)
    samples = [s for s in samples if not s.stopped]  # their actuals are unknown
    raw_rows = np.array([s.raw.rows for s in samples], dtype=float)
    act_rows = np.array([s.rows for s in samples], dtype=float)
    exact = np.array([s.raw.rows_exact for s in samples], dtype=bool)

    def fit_rows(i):
        i = i[~exact[i]]  # exact counts are never scaled
        return fit_factor(raw_rows[i], act_rows[i], target_coverage=targets["rows"], min_factor=min_factor)

    rows = _by_shape(samples, min_shape_samples, fit_rows)
    partial = Calibration(rows=rows)
    r95 = np.array([partial.rows_quantiles(s.raw)[1] for s in samples], dtype=float)
    tpr = np.array([max(s.raw.row_tokens, 1e-9) for s in samples], dtype=float)
    over_header = np.array([max(s.result_tokens - s.raw.header_tokens, 0.0) for s in samples], dtype=float)
    raw_tok = np.array([s.raw.result_tokens for s in samples], dtype=float)
    act_tok = np.array([s.result_tokens for s in samples], dtype=float)

    def fit_tokens(i):
        g = fit_factor(r95[i] * tpr[i], over_header[i], floor=tpr[i], target_coverage=targets["result_tokens"],
                       min_factor=min_factor)
        f50 = fit_factor(raw_tok[i], act_tok[i], floor=1.0, min_factor=min_factor).p50
        return Factors(p50=f50, p95=max(g.p95, 1.0))

    raw_vm = np.array([s.raw.vm_steps for s in samples], dtype=float)
    act_vm = np.array([s.vm_steps for s in samples], dtype=float)
    return Calibration(
        rows=rows,
        result_tokens=_by_shape(samples, min_shape_samples, fit_tokens),
        vm_steps=_by_shape(samples, min_shape_samples, lambda i: fit_factor(
            raw_vm[i], act_vm[i], target_coverage=targets["vm_steps"], min_factor=min_factor)),
        target_coverage=dict(targets) if isinstance(target_coverage, Mapping) else targets["rows"], source=source,
        comment=comment)


def coverage(samples: Iterable[Sample], calibration: Calibration) -> dict[str, dict[str, float]]:
    """Per quantity: share of actuals <= p50 and <= p95 (over ``n_p50`` / ``n`` samples), and the median p95 /
    actual ratio (actual > 0). A stopped sample (module docstring) counts for VM steps only: a miss where the
    quantile was below the cap, left out where it was not; ``stopped`` counts them."""
    samples = list(samples)
    le = {q: [0, 0] for q in QUANTITIES}
    n = {q: [0, 0] for q in QUANTITIES}
    ratios: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    for s in samples:
        qs = calibration.quantiles(s.raw)
        for q in QUANTITIES:
            if s.stopped and q != "vm_steps":
                continue
            act = getattr(s, q)
            for i, p in enumerate(qs[q]):
                if s.stopped and p >= act:
                    continue  # the cost is above the cap, which is not above the quantile: unknown
                n[q][i] += 1
                le[q][i] += (not s.stopped) and act <= p * (1 + 1e-9) + 1e-9
            if act > 0 and not s.stopped:
                ratios[q].append(qs[q][1] / act)
    return {q: {"p50": le[q][0] / max(n[q][0], 1), "p95": le[q][1] / max(n[q][1], 1), "n": n[q][1],
                "n_p50": n[q][0], "stopped": sum(s.stopped for s in samples) if q == "vm_steps" else 0,
                "median_p95_over_actual": float(np.median(ratios[q])) if ratios[q] else float("nan")}
            for q in QUANTITIES}
