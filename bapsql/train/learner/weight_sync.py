"""Weight sync after every update, and the checks that the engine really serves the new adapter (DESIGN §5).

`WeightSync.sync(version)`:

1. saves the learner's adapter to ``<dir>/v<version>`` (a new folder per version; older ones are removed after the
   engine has moved on, keeping the last two) and takes its `adapter_digest` (SHA-256 of the files written);
2. asks the engine to load it in place (`Engine.load_adapter(path, name, version)`: vLLM ``LoRARequest(...,
   load_inplace=True)`` or, with ``adapter_mode: merge``, the adapter folded into the weights; the HF engine in
   memory) and gets the reference the next rollouts must pass;
3. **identity** (`check_identity`), on every sync and every engine replica: the adapter the engine reports it serves
   (`Engine.served_adapter`: name, version and the digest of the files it read when it loaded them; a merge-mode
   vLLM engine reports the adapter it merged) must be the learner's — same name, this version, this digest. A skipped
   load (the engine still on an older version), a load of another folder, a replica that lost its adapter (the base
   weights) or files that changed between the two sides all fail here, however small the update: at the paper's
   learning rate 1e-6 a bf16 engine's numeric noise is far larger than the policy's move, so no logprob comparison
   can tell a stale engine from a fresh one, but the identity can;
4. **numeric agreement** (`check`): the engine's logprobs of a fixed probe completion after a fixed probe prompt
   (`Engine.logprobs_of`) against the learner's own, two ways:

   - *level*: mean absolute difference ≤ ``tolerance`` and no token further apart than ``max_tolerance``. Unless
     given, both are **measured at the first sync** (update 0, or the update a run resumes from), where the engine
     and the learner serve the same adapter by construction: ``tolerance = clip(tolerance_factor × mean gap,
     tolerance_floor, tolerance_ceiling)`` and ``max_tolerance = clip(tolerance_factor × max gap, tolerance,
     max_tolerance ceiling)``. That first sync fails only when its gap exceeds the ceilings (the two sides load
     different weights, dtypes or templates), so a bf16 engine against a bf16 learner is held to its own measured
     noise, not to a fixed 0.02 that may abort a run at update 0;
   - *change since the last sync*, on both sides: ``d_e = engine now − engine at the last sync`` and ``d_l = learner
     now − learner at the last sync``; when the learner's move stands out of the numeric noise (rms ``d_l`` ≥ 2 ×
     rms of engine − learner at the last sync; ``discriminative``), the slope ``<d_e, d_l> / <d_l, d_l>`` must lie
     within ``1 ± delta_tolerance``. This catches an engine that reports the right files but did not apply them
     (its weights did not move), once updates are large enough to see.

   Any failure raises `WeightSyncError` before the stale engine samples a batch.

``learner_delta`` in the report is how far the learner's probe logprobs moved since the previous sync (mean absolute
change); ``delta_slope`` the engine-vs-learner slope (nan when not tested); ``tolerance`` / ``max_tolerance`` the
level bounds in force (``measured``: set at this sync).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bapsql.errors import ConfigError, WeightSyncError
from bapsql.rollout.engines.base import adapter_digest

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
class SyncSection:
    """The ``sync:`` section of a training config (re-exported by `bapsql.train.config`): the adapter identity is
    checked on every sync (no setting); the probe's level bounds are ``tolerance`` (mean |engine − learner| logprob)
    and ``max_tolerance`` (worst token) when ``tolerance`` is set, else measured at the first sync (module
    docstring): ``tolerance_factor`` x the gaps seen there, the mean's within ``tolerance_floor`` ..
    ``tolerance_ceiling`` and the worst token's up to ``max_tolerance``. ``delta_tolerance``: the slope of the
    change-since-last-sync test must be 1 ± this. ``probe_completion_tokens``: the probe's length."""

    tolerance: float | None = None
    tolerance_factor: float = 4.0
    tolerance_floor: float = 1e-3
    tolerance_ceiling: float = 0.2
    max_tolerance: float = 2.0
    delta_tolerance: float = 0.5
    probe_completion_tokens: int = 24

    def __post_init__(self) -> None:
        if self.tolerance is not None and not 0 < self.tolerance <= self.max_tolerance:
            raise ConfigError(f"sync.tolerance: need 0 < tolerance <= max_tolerance (or null: measured at the first "
                              f"sync), got {self.tolerance} and {self.max_tolerance}")
        if self.tolerance is None and not 0 < self.tolerance_floor <= self.tolerance_ceiling <= self.max_tolerance:
            raise ConfigError(f"sync: need 0 < tolerance_floor <= tolerance_ceiling <= max_tolerance, got "
                              f"{self.tolerance_floor}, {self.tolerance_ceiling}, {self.max_tolerance}")
        if self.tolerance_factor < 1:
            raise ConfigError(f"sync.tolerance_factor: must be >= 1 (a multiple of the gap measured at the first "
                              f"sync), got {self.tolerance_factor}")
        if not 0 < self.delta_tolerance < 1:
            raise ConfigError(f"sync.delta_tolerance: must be in (0, 1), got {self.delta_tolerance}")
        if self.probe_completion_tokens < 1:
            raise ConfigError(f"sync.probe_completion_tokens: must be >= 1, got {self.probe_completion_tokens}")

    def measured(self, mean_gap: float, max_gap: float) -> tuple[float, float]:
        """(tolerance, max_tolerance) from the first sync's mean and max engine-vs-learner gap."""
        tol = min(self.tolerance_ceiling, max(self.tolerance_floor, self.tolerance_factor * mean_gap))
        return tol, min(self.max_tolerance, max(tol, self.tolerance_factor * max_gap))


@dataclass(frozen=True)
class SyncReport:
    """One sync: versions, timings (seconds), the identity checked and the engine-vs-learner probe comparison."""

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
    discriminative: bool = False  # the change-since-last-sync test ran
    max_tolerance: float = float("nan")
    measured: bool = False  # the level bounds were measured at this sync
    digest: str = ""  # the adapter's files, as the learner wrote and every replica reported serving them
    replicas: int = 1  # engine replicas whose identity and probe were checked

    @property
    def seconds(self) -> float:
        return self.save_s + self.load_s + self.check_s

    def metrics(self, prefix: str = "sync/") -> dict[str, float]:
        out = {f"{prefix}seconds": self.seconds, f"{prefix}logprob_mismatch_mean": self.mean_abs,
               f"{prefix}logprob_mismatch_max": self.max_abs, f"{prefix}learner_delta": self.learner_delta,
               f"{prefix}discriminative": float(self.discriminative), f"{prefix}tolerance": self.tolerance}
        if self.discriminative:  # the slope exists only when the change-since-last-sync test ran
            out[f"{prefix}delta_slope"] = self.delta_slope
        return out


@dataclass(frozen=True)
class ProbeCheck:
    """One passed numeric check: the worst level mismatch over the replicas, the probe logprobs of both sides, and the
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


def served_adapters(engine: Any, adapter: Any) -> list[Any]:
    """What each engine replica reports serving for ``adapter`` (`Engine.served_adapter`): one entry per replica of
    a `bapsql.train.loop.rollouts.TrainingRollouts` (``replica_served_adapters``), else the engine's own."""
    if hasattr(engine, "replica_served_adapters"):
        return list(engine.replica_served_adapters(adapter))
    if not hasattr(engine, "served_adapter"):
        raise WeightSyncError(f"{type(engine).__name__} cannot report which adapter it serves (no served_adapter); "
                              "weight sync needs an engine that does (vllm, hf)")
    return [engine.served_adapter(adapter)]


def check_identity(served: Sequence[Any], name: str, version: int, digest: str) -> None:
    """Raise `WeightSyncError` unless every replica's report in ``served`` (an `AdapterRef` or None) is the adapter
    ``name`` at ``version`` with files of ``digest``."""
    for r, ref in enumerate(served):
        where = f"weight sync v{version}: engine replica {r}"
        if ref is None:
            raise WeightSyncError(f"{where} serves the base weights, not adapter {name!r} v{version}: the engine "
                                  "lost or never loaded the learner's adapter")
        if ref.name != name or ref.version != version:
            raise WeightSyncError(f"{where} serves {ref.name!r} v{ref.version}, not {name!r} v{version}: the engine "
                                  "is serving a stale adapter (the load did not take)")
        if ref.digest != digest:
            got = ref.digest[:12] or "(none reported)"
            raise WeightSyncError(f"{where} serves v{version} from files with digest {got}, but the learner saved "
                                  f"{digest[:12]} ({ref.path}): the engine loaded other (stale) adapter files")


class WeightSync:
    """Pushes the learner's adapter to an engine after each update and verifies it (see the module docstring).
    ``settings``: the checks' bounds (`SyncSection`; default: measured at the first sync)."""

    def __init__(self, engine: Any, learner: Any, probe: Probe, out_dir: str | Path, *,
                 settings: SyncSection = SyncSection(), name: str = ADAPTER_NAME, keep: int = 2):
        self.engine = engine
        self.learner = learner
        self.probe = probe
        self.dir = Path(out_dir)
        self.settings = settings
        self.tolerance: float | None = settings.tolerance  # None until measured
        self.max_tolerance = settings.max_tolerance
        self.delta_tolerance = settings.delta_tolerance
        self.name = name
        self.keep = keep
        self.adapter: Any = None
        self._last_learner: np.ndarray | None = None
        self._last_engine: tuple[np.ndarray, ...] | None = None
        self._paths: list[Path] = []

    def check(self, adapter: Any, version: int = -1) -> ProbeCheck:
        """Compare the engine (serving ``adapter``) with the learner on the probe, by level and by change since the
        last sync; raise `WeightSyncError` when they disagree (module docstring). Before the bounds are measured
        (the first sync), the level is held to the ceilings only."""
        learner_lp = np.asarray(self.learner.logprobs_of(self.probe.prompt_ids, self.probe.completion_ids),
                                dtype=np.float64)
        prompt, completion = list(self.probe.prompt_ids), list(self.probe.completion_ids)
        if hasattr(self.engine, "replica_logprobs"):  # several engine replicas: every one must serve the adapter
            replicas = self.engine.replica_logprobs(prompt, completion, adapter)
        else:
            replicas = [self.engine.logprobs_of(prompt, completion, adapter=adapter)]
        tol = self.tolerance if self.tolerance is not None else self.settings.tolerance_ceiling
        max_tol = self.max_tolerance
        worst = (0.0, 0.0)
        slopes: list[float] = []
        discriminative = False
        for r, engine_lp in enumerate(replicas):
            mean, mx = compare(engine_lp, learner_lp)
            if mean > tol or mx > max_tol:
                raise WeightSyncError(
                    f"weight sync v{version}: engine replica {r}'s probe logprobs differ from the learner's "
                    f"(mean |Δ| = {mean:.4g}, tolerance {tol:.4g}; max |Δ| = {mx:.4g}, tolerance {max_tol:.4g}; "
                    f"{self._bounds_origin()}); the engine is serving stale or wrong weights, or another dtype or "
                    "chat template than the learner")
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

    def _bounds_origin(self) -> str:
        if self.tolerance is None:
            return ("first sync: held to sync.tolerance_ceiling and sync.max_tolerance; raise them if this gap is the "
                    "two implementations' numeric noise")
        if self.settings.tolerance is None:
            return f"bounds = {self.settings.tolerance_factor:g} x the gap measured at the first sync"
        return "bounds set by sync.tolerance"

    def sync(self, version: int) -> SyncReport:
        """Save, load in place, check identity, check the probe (module docstring). Raises `WeightSyncError` on a
        mismatch."""
        t0 = time.perf_counter()
        path = Path(self.learner.save_adapter(self.dir / f"v{version:06d}"))
        digest = adapter_digest(path)
        t1 = time.perf_counter()
        self.adapter = self.engine.load_adapter(str(path), self.name, version)
        t2 = time.perf_counter()
        served = served_adapters(self.engine, self.adapter)
        check_identity(served, self.name, version, digest)
        result = self.check(self.adapter, version)
        measured = self.tolerance is None
        if measured:
            self.tolerance, self.max_tolerance = self.settings.measured(result.mean_abs, result.max_abs)
        t3 = time.perf_counter()
        delta = float(np.abs(result.learner_lp - self._last_learner).mean()) if self._last_learner is not None \
            else float("nan")
        self._last_learner, self._last_engine = result.learner_lp, result.engine_lp
        self._paths.append(path)
        while len(self._paths) > self.keep:
            shutil.rmtree(self._paths.pop(0), ignore_errors=True)
        return SyncReport(version=version, adapter_path=str(path), save_s=t1 - t0, load_s=t2 - t1, check_s=t3 - t2,
                          mean_abs=result.mean_abs, max_abs=result.max_abs, learner_delta=delta,
                          tolerance=float(self.tolerance), delta_slope=result.slope,
                          discriminative=result.discriminative, max_tolerance=self.max_tolerance, measured=measured,
                          digest=digest, replicas=len(served))
