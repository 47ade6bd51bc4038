"""Weight sync after every update, and the check that the engine really serves the new weights (DESIGN §5).

`WeightSync.sync(version)`:

1. saves the learner's adapter to ``<dir>/v<version>`` (a new folder per version; older ones are removed after the
   engine has moved on, keeping the last two);
2. asks the engine to load it in place (`Engine.load_adapter(path, name, version)`: vLLM ``LoRARequest(...,
   load_inplace=True)``, the HF engine in memory) and gets the `AdapterRef` the next rollouts must pass;
3. checks: the engine's logprobs of a fixed probe completion after a fixed probe prompt
   (`Engine.logprobs_of(prompt, completion, adapter=ref)`) must match the learner's own logprobs of the same tokens:
   mean absolute difference ≤ ``tolerance`` and no token further apart than ``max_tolerance``. Otherwise it raises
   `WeightSyncError` — a stale adapter, base weights, or a wrong adapter slot is caught before it samples a batch.

The report also records ``learner_delta``, how far the learner's probe logprobs moved since the previous sync. The
check can only tell a stale adapter from a fresh one when that movement exceeds the tolerance (``discriminative``);
with the paper's small GRPO learning rate single updates often move less, which the loop logs rather than hides.
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
                    'WHERE year = 2023"}}\n</tool_call><|im_end|>')


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

    @property
    def seconds(self) -> float:
        return self.save_s + self.load_s + self.check_s

    @property
    def discriminative(self) -> bool:
        """True when the policy moved enough since the last sync that a stale adapter would have failed."""
        return bool(self.learner_delta > self.tolerance)

    def metrics(self, prefix: str = "sync/") -> dict[str, float]:
        return {f"{prefix}seconds": self.seconds, f"{prefix}logprob_mismatch_mean": self.mean_abs,
                f"{prefix}logprob_mismatch_max": self.max_abs, f"{prefix}learner_delta": self.learner_delta,
                f"{prefix}discriminative": float(self.discriminative)}


def make_probe(template: Any, max_completion_tokens: int = 24) -> Probe:
    """The default probe rendered with a `bapsql.policies.chat.ChatTemplate`: a short system + user prompt with the
    generation prompt, and a tool-call completion cut to ``max_completion_tokens``."""
    messages = [{"role": "system", "content": "You answer questions about a SQLite database with tool calls."},
                {"role": "user", "content": PROBE_QUESTION}]
    prompt = template.apply(messages, add_generation_prompt=True)
    completion = template.encode(PROBE_COMPLETION)[:max_completion_tokens]
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
                 max_tolerance: float = 0.5, name: str = ADAPTER_NAME, keep: int = 2):
        self.engine = engine
        self.learner = learner
        self.probe = probe
        self.dir = Path(out_dir)
        self.tolerance = tolerance
        self.max_tolerance = max_tolerance
        self.name = name
        self.keep = keep
        self.adapter: Any = None
        self._last_learner: np.ndarray | None = None
        self._paths: list[Path] = []

    def check(self, adapter: Any, version: int = -1) -> tuple[float, float, np.ndarray]:
        """Compare the engine (serving ``adapter``) with the learner on the probe; raise `WeightSyncError` when
        they disagree. Returns (mean, max, learner logprobs)."""
        learner_lp = np.asarray(self.learner.logprobs_of(self.probe.prompt_ids, self.probe.completion_ids))
        prompt, completion = list(self.probe.prompt_ids), list(self.probe.completion_ids)
        if hasattr(self.engine, "replica_logprobs"):  # several engine replicas: every one must serve the adapter
            replicas = self.engine.replica_logprobs(prompt, completion, adapter)
        else:
            replicas = [self.engine.logprobs_of(prompt, completion, adapter=adapter)]
        worst = (0.0, 0.0)
        for r, engine_lp in enumerate(replicas):
            mean, mx = compare(engine_lp, learner_lp)
            if mean > self.tolerance or mx > self.max_tolerance:
                raise WeightSyncError(
                    f"weight sync v{version}: engine replica {r}'s probe logprobs differ from the learner's "
                    f"(mean |Δ| = {mean:.4g}, tolerance {self.tolerance:g}; max |Δ| = {mx:.4g}, tolerance "
                    f"{self.max_tolerance:g}); the engine is serving stale or wrong weights")
            worst = max(worst, (mean, mx))
        return worst[0], worst[1], learner_lp

    def sync(self, version: int) -> SyncReport:
        """Save, load in place, check (see the module docstring). Raises `WeightSyncError` on a mismatch."""
        t0 = time.perf_counter()
        path = self.learner.save_adapter(self.dir / f"v{version:06d}")
        t1 = time.perf_counter()
        self.adapter = self.engine.load_adapter(str(path), self.name, version)
        t2 = time.perf_counter()
        mean, mx, learner_lp = self.check(self.adapter, version)
        t3 = time.perf_counter()
        delta = float(np.abs(learner_lp - self._last_learner).mean()) if self._last_learner is not None else float(
            "nan")
        self._last_learner = learner_lp
        self._paths.append(Path(path))
        while len(self._paths) > self.keep:
            shutil.rmtree(self._paths.pop(0), ignore_errors=True)
        return SyncReport(version=version, adapter_path=str(path), save_s=t1 - t0, load_s=t2 - t1, check_s=t3 - t2,
                          mean_abs=mean, max_abs=mx, learner_delta=delta, tolerance=self.tolerance)
