"""Weight sync after every update, and the check that the engine really serves the new weights (DESIGN §5).

`WeightSync.sync(version)`:

1. saves the learner's adapter to ``<dir>/v<version>`` (a new folder per version; older ones are removed after the
   engine has moved on, keeping the last two);
2. asks the engine to load it in place (`Engine.load_adapter(path, name, version)`: vLLM ``LoRARequest(...,
   load_inplace=True)``, the HF engine in memory) and gets the `AdapterRef` the next rollouts must pass;
3. checks the engine against the learner on a fixed probe completion after a fixed probe prompt
   (`Engine.logprobs_of(prompt, completion, adapter=ref)` vs the learner's own logprobs of the same tokens), two ways:

   - *level*: mean absolute difference ≤ ``tolerance`` and no token further apart than ``max_tolerance`` (catches
     base weights, a wrong adapter slot, or any stale adapter once the policy has moved far);
   - *change since the last sync*, on both sides: ``d_e = engine now − engine at the last sync`` and ``d_l =
     learner now − learner at the last sync`` (each side against itself, so the fixed numeric offset between two
     implementations cancels). The engine must have moved as the learner did: the slope ``<d_e, d_l> / <d_l,
     d_l>`` must lie within ``1 ± delta_tolerance``. A stale adapter has ``d_e = 0`` (slope 0) however small the
     update: at the paper's learning rate 1e-6 the probe moves ~1e-6 per token, far below any level tolerance,
     and this is what catches it. The slope is only tested when the learner's move stands out of the numeric
     noise (rms ``d_l`` ≥ 2 × rms of engine − learner at the last sync; ``discriminative``); a move lost in the noise (bf16
     engines at tiny learning rates, or an update that was skipped) is logged as not discriminative.

   Either failure raises `WeightSyncError` before the stale engine samples a batch.

``learner_delta`` in the report is how far the learner's probe logprobs moved since the previous sync (mean
absolute change); ``delta_slope`` the engine-vs-learner slope (nan when not tested).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bapsql.errors import WeightSyncError

ADAPTER_NAME = "policy"
PROBE_QUESTION = "How many orders were placed in 2023?"
PROBE_COMPLETION = ('<tool_call>\n{"name": "execute_query", "arguments": {"sql": "SELECT COUNT(*) FROM orders '
                    'WHERE year = 2023"}}\n</tool_call>')  # + the template's end of turn (`make_probe`)


@dataclass(frozen=True)
class Probe:
    """The fixed prompt and completion token ids the check scores."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


@dataclass(frozen=True)
class SyncReport:
    """One sync: versions, timings (seconds), and the engine-vs-learner probe comparison."""

    version: int
    adapter_path: str
    save_s: float
    load_s: float
    check_s: float
    mean_abs: float
    max_abs: float
    learner_delta: float  # mean |learner now − learner at the previous sync| on the probe (nan at the first)
    tolerance: float
    delta_slope: float = float("nan")  # <d_e, d_l> / <d_l, d_l> (nan when not tested)
    discriminative: bool = False  # the change-since-last-sync test ran: a stale adapter would have failed

    @property
    def seconds(self) -> float:
        return self.save_s + self.load_s + self.check_s

    def metrics(self, prefix: str = "sync/") -> dict[str, float]:
        out = {f"{prefix}seconds": self.seconds, f"{prefix}logprob_mismatch_mean": self.mean_abs,
               f"{prefix}logprob_mismatch_max": self.max_abs, f"{prefix}learner_delta": self.learner_delta,
               f"{prefix}discriminative": float(self.discriminative)}
        if self.discriminative:  # the slope exists only when the change-since-last-sync test ran
            out[f"{prefix}delta_slope"] = self.delta_slope
        return out


@dataclass(frozen=True)
class ProbeCheck:
    """One passed check: the worst level mismatch over the replicas, the probe logprobs of both sides, and the
    change-since-last-sync test (``slope`` is the worst replica's; nan when it did not run)."""

    mean_abs: float
    max_abs: float
    learner_lp: np.ndarray  # [C]
    engine_lp: tuple[np.ndarray, ...]  # one [C] per replica
    slope: float
    discriminative: bool


def delta_slope(engine_delta: np.ndarray, learner_delta: np.ndarray) -> float:
    """``<d_e, d_l> / <d_l, d_l>``: 1 when the engine moved as the learner did, 0 when it did not move."""
    denom = float(learner_delta @ learner_delta)
    return float(engine_delta @ learner_delta) / denom if denom > 0 else float("nan")


def make_probe(template: Any, max_completion_tokens: int = 24, **template_kwargs: Any) -> Probe:
    """The default probe rendered with a `bapsql.models.chat_template.ChatTemplate` and the run's chat-template options
    (``template_kwargs``, e.g. ``enable_thinking=False``): a short system + user prompt with the generation prompt,
    and a tool-call completion closed by the template's end-of-turn token, cut to ``max_completion_tokens``."""
    messages = [{"role": "system", "content": "You answer questions about a SQLite database with tool calls."},
                {"role": "user", "content": PROBE_QUESTION}]
    prompt = template.apply(messages, add_generation_prompt=True, **template_kwargs)
    end_of_turn = template.framing(**template_kwargs).end_of_turn_text
    completion = template.encode(PROBE_COMPLETION + end_of_turn)[:max_completion_tokens]
    return Probe(tuple(prompt), tuple(completion))


def compare(engine_lp: Sequence[float], learner_lp: Sequence[float]) -> tuple[float, float]:
    """(mean, max) absolute difference of two logprob lists of the same length."""
    a = np.asarray(engine_lp, dtype=np.float64)
    b = np.asarray(learner_lp, dtype=np.float64)
    if a.shape != b.shape:
        raise WeightSyncError(f"the engine returned {a.shape[0]} probe logprobs, the learner {b.shape[0]}")
    if not np.all(np.isfinite(a)):
        raise WeightSyncError("the engine returned non-finite probe logprobs")
    d = np.abs(a - b)
    return float(d.mean()) if d.size else 0.0, float(d.max()) if d.size else 0.0


class WeightSync:
    """Pushes the learner's adapter to an engine after each update and verifies it (see the module docstring)."""

    def __init__(self, engine: Any, learner: Any, probe: Probe, out_dir: str | Path, *, tolerance: float = 0.02,
                 max_tolerance: float = 0.5, delta_tolerance: float = 0.5, name: str = ADAPTER_NAME, keep: int = 2):
        self.engine = engine
        self.learner = learner
        self.probe = probe
        self.dir = Path(out_dir)
        self.tolerance = tolerance
        self.max_tolerance = max_tolerance
        self.delta_tolerance = delta_tolerance
        self.name = name
        self.keep = keep
        self.adapter: Any = None
        self._last_learner: np.ndarray | None = None
        self._last_engine: tuple[np.ndarray, ...] | None = None
        self._paths: list[Path] = []

    def check(self, adapter: Any, version: int = -1) -> ProbeCheck:
        """Compare the engine (serving ``adapter``) with the learner on the probe, by level and by change since the
        last sync; raise `WeightSyncError` when they disagree (see the module docstring)."""
        learner_lp = np.asarray(self.learner.logprobs_of(self.probe.prompt_ids, self.probe.completion_ids),
                                dtype=np.float64)
        prompt, completion = list(self.probe.prompt_ids), list(self.probe.completion_ids)
        if hasattr(self.engine, "replica_logprobs"):  # several engine replicas: every one must serve the adapter
            replicas = self.engine.replica_logprobs(prompt, completion, adapter)
        else:
            replicas = [self.engine.logprobs_of(prompt, completion, adapter=adapter)]
        worst = (0.0, 0.0)
        slopes: list[float] = []
        discriminative = False
        for r, engine_lp in enumerate(replicas):
            mean, mx = compare(engine_lp, learner_lp)
            if mean > self.tolerance or mx > self.max_tolerance:
                raise WeightSyncError(
                    f"weight sync v{version}: engine replica {r}'s probe logprobs differ from the learner's "
                    f"(mean |Δ| = {mean:.4g}, tolerance {self.tolerance:g}; max |Δ| = {mx:.4g}, tolerance "
                    f"{self.max_tolerance:g}); the engine is serving stale or wrong weights")
            worst = max(worst, (mean, mx))
            if self._last_engine is None or self._last_learner is None or r >= len(self._last_engine):
                continue
            d_l = learner_lp - self._last_learner
            d_e = np.asarray(engine_lp, dtype=np.float64) - self._last_engine[r]
            # numeric noise between the two sides, measured at the last (passed) sync: now it may hold the very
            # move a stale engine missed
            noise = float(np.sqrt(np.mean((self._last_engine[r] - self._last_learner) ** 2)))
            if not np.sqrt(np.mean(d_l ** 2)) >= max(2 * noise, 1e-12):
                continue
            discriminative = True
            slope = delta_slope(d_e, d_l)
            slopes.append(slope)
            if abs(slope - 1.0) > self.delta_tolerance:
                raise WeightSyncError(
                    f"weight sync v{version}: engine replica {r} did not move with the learner since the last sync "
                    f"(slope of its probe change on the learner's = {slope:.3g}, want 1 ± {self.delta_tolerance:g}; "
                    f"learner moved {np.abs(d_l).mean():.3g} per token); the engine is serving a stale adapter")
        slope = max(slopes, key=lambda x: abs(x - 1.0)) if slopes else float("nan")  # the worst replica
        return ProbeCheck(worst[0], worst[1], learner_lp, tuple(np.asarray(e, dtype=np.float64) for e in replicas),
                          slope, discriminative)

    def sync(self, version: int) -> SyncReport:
        """Save, load in place, check (see the module docstring). Raises `WeightSyncError` on a mismatch."""
        t0 = time.perf_counter()
        path = self.learner.save_adapter(self.dir / f"v{version:06d}")
        t1 = time.perf_counter()
        self.adapter = self.engine.load_adapter(str(path), self.name, version)
        t2 = time.perf_counter()
        result = self.check(self.adapter, version)
        t3 = time.perf_counter()
        delta = float(np.abs(result.learner_lp - self._last_learner).mean()) if self._last_learner is not None \
            else float("nan")
        self._last_learner, self._last_engine = result.learner_lp, result.engine_lp
        self._paths.append(Path(path))
        while len(self._paths) > self.keep:
            shutil.rmtree(self._paths.pop(0), ignore_errors=True)
        return SyncReport(version=version, adapter_path=str(path), save_s=t1 - t0, load_s=t2 - t1, check_s=t3 - t2,
                          mean_abs=result.mean_abs, max_abs=result.max_abs, learner_delta=delta,
                          tolerance=self.tolerance, delta_slope=result.slope, discriminative=result.discriminative)
