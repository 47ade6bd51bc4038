"""Calibration samples: each SQL of a database estimated raw (identity calibration) and executed, so that
`bapsql.db.calibration.fit_calibration` can fit factors and `coverage` can score them.

`collect_samples` keeps a query the collection cap stopped as a *stopped* sample (it cost more than the cap: VM
steps = the cap, rows and result tokens unknown), so the fit and coverage see the expensive tail instead of losing it.
It sits above the estimator and the shield (which read `Calibration`), so the calibration math imports neither.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable

from bapsql.db.calibration import Calibration, Sample
from bapsql.db.estimator import Estimator
from bapsql.db.shield import Caps

if TYPE_CHECKING:
    from bapsql.db.handle import DatabaseHandle


def collect_samples(handle: "DatabaseHandle", sqls: Iterable[str], *, vm_step_cap: int = 50_000_000) -> list[Sample]:
    """Estimate (raw: identity calibration) and execute each SQL on ``handle`` to pair estimates with actuals.

    Execution goes through the handle's `Shield` with no visible output (caps of 0 rows/tokens/bytes), so actual
    rows, the full result tokens (the shield's charging contract) and exact VM steps are measured without keeping
    rows. Statements that fail to estimate or execute are skipped; one the VM-step cap stops is kept as a
    ``stopped`` sample (VM steps = the cap; rows and result tokens NaN)."""
    est = Estimator(handle.sandbox, handle.catalog, Calibration.identity(), handle.estimator.token_counter)
    caps = Caps(vm_steps=vm_step_cap, result_tokens=0, rows=0, bytes=0)
    out: list[Sample] = []
    try:
        for sql in sqls:
            if est.estimate(sql, vm_step_cap=vm_step_cap).error is not None:
                continue
            res = handle.shield.execute(sql, caps)
            raw = est.raw_estimate_cached(sql)
            if res.status in ("rejected", "error") or raw is None:
                continue
            if res.truncated_by == "vm_steps":  # cost more than the cap: a miss for any VM-step quantile below it
                out.append(Sample(raw, math.nan, math.nan, float(vm_step_cap), db=str(handle.path), sql=sql,
                                  stopped=True))
                continue
            if res.rows_total is None or res.full_result_tokens is None:
                continue
            out.append(Sample(raw, float(res.rows_total), float(res.full_result_tokens), float(res.cost.vm_steps),
                              db=str(handle.path), sql=sql))
    finally:
        est.close()
    return out
