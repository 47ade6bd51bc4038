"""A scripted local engine for the serving tests and benchmark: vLLM's shape without vLLM.

`StepEngine(plans)` answers each prompt with its question's scripted turn (`tests.rollout.fakes.PlanEngine`, the
packaged tokenizer) and decodes like vLLM: ``step(new, max_steps=...)`` admits requests between decoding steps and
moves every request in flight ``tokens_per_step`` tokens per step (each step sleeps ``step_s``: the batch costs the
same whatever its size, as on an accelerator); ``abort(keys)`` drops requests. It records what the scheduler must
guarantee: ``threads`` (every thread that called it), ``batches`` (requests in flight at each step), ``aborted``.
``hold_from_turn`` parks requests whose prompt already holds that many assistant turns until ``release()``;
``kill(exc)`` makes the next step raise ``exc`` (e.g. `EngineDeadError`, vLLM's, which is not an ``EngineError``);
``kill_core()`` is vLLM's engine-core process dying: a ``step`` then blocks (as vLLM's ``get_output`` does) until
``dead_reason()`` — which reports the death — wakes it to raise `EngineDeadError`.
``generate`` (the old serving path: one call per episode thread) is not thread-safe, like ``vllm.LLM``: it counts
the calls that overlapped.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

from bapsql.rollout.engines.base import EngineConfig, Generation, SamplingParams
from bapsql.tokens import DEFAULT_TOKENIZER_DIR
from tests.rollout.fakes import PlanEngine


class EngineDeadError(RuntimeError):
    """Stand-in for ``vllm.v1.engine.exceptions.EngineDeadError`` (not a bapsql error)."""

    def __init__(self) -> None:
        super().__init__("EngineCore encountered an issue. See stack trace (above) for the root cause.")


class StepEngine:
    name = "step-fake"
    admits_between_steps = True

    def __init__(self, plans: dict[str, list[str]], *, step_s: float = 0.002, tokens_per_step: int = 8,
                 hold_from_turn: int | None = None):
        self._plan = PlanEngine(plans)
        self.config = EngineConfig(kind="vllm", model="step-fake", tokenizer=str(DEFAULT_TOKENIZER_DIR),
                                   max_model_len=32_768)
        self.step_s, self.tokens_per_step, self.hold_from_turn = step_s, tokens_per_step, hold_from_turn
        self.threads: set[int] = set()
        self.batches: list[int] = []
        self.aborted: list[str] = []
        self.overlapping_generates = 0
        self.closed = False
        self._running: dict[str, list] = {}  # key -> [generation, tokens left, held]
        self._released = threading.Event()
        self._dead: BaseException | None = None
        self._core_dead = False
        self._wake = threading.Event()
        self._busy = False

    # -- knobs --------------------------------------------------------------------------------------------------
    def release(self) -> None:
        self._released.set()

    def kill(self, exc: BaseException) -> None:
        self._dead = exc

    def kill_core(self) -> None:
        self._core_dead = True

    def dead_reason(self) -> str | None:
        if not self._core_dead:
            return None
        self._wake.set()
        return "EngineDeadError: the engine core process exited"

    # -- the engine protocol ----------------------------------------------------------------------------------------
    def _held(self, prompt: Sequence[int]) -> bool:
        if self.hold_from_turn is None:
            return False
        return self._plan.template.decode(list(prompt)).count("<|im_start|>assistant") - 1 >= self.hold_from_turn

    def step(self, new, *, adapter=None, max_steps: int | None = None) -> list[tuple[str, Generation]]:
        self.threads.add(threading.get_ident())
        if self._dead is not None:
            raise self._dead
        if self._core_dead:
            self._wake.wait()  # outputs that never come, until dead_reason() wakes us
            raise EngineDeadError()
        for key, prompt, sp in new:
            gen = self._plan.generate([prompt], [sp])[0]
            self._running[key] = [gen, len(gen.completion_ids), self._held(prompt)]
        if not self._running:
            return []
        self.batches.append(len(self._running))
        done, steps = [], 0
        while self._running and not done and (max_steps is None or steps < max_steps):
            steps += 1
            time.sleep(self.step_s)
            for key, entry in list(self._running.items()):
                if entry[2] and not self._released.is_set():
                    continue
                entry[1] -= self.tokens_per_step
                if entry[1] <= 0:
                    done.append((key, self._running.pop(key)[0]))
        return done

    def in_flight(self) -> int:
        return len(self._running)

    def abort(self, keys) -> None:
        for key in keys:
            if self._running.pop(key, None) is not None:
                self.aborted.append(key)

    def generate(self, prompts, params: Sequence[SamplingParams], *, adapter=None) -> list[Generation]:
        self.threads.add(threading.get_ident())
        if self._busy:
            self.overlapping_generates += 1
        self._busy = True
        try:
            time.sleep(self.step_s * 4)
            return self._plan.generate(prompts, params)
        finally:
            self._busy = False

    def close(self) -> None:
        self.closed = True
