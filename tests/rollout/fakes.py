"""A scripted fake engine for fast agent-loop tests (real engines are tested in the slow tier).

`PlanEngine` implements the engine protocol token-in/token-out with the packaged tokenizer: for a prompt it finds
the task by its question text, counts the assistant turns already in the prompt, and emits that turn of the task's
plan (a tool call) followed by ``<|im_end|>``. Plans come from the test (e.g. execute the gold SQL, then answer
with the gold values citing E1): the point is the plumbing — batching, token ids, masks, logprobs, reruns — not
the policy. Logprobs are a deterministic function of (seed, position), so reruns can be compared bit for bit.
"""

from __future__ import annotations

import math
import os
import zlib
from typing import Sequence

from bapsql.env.actions import AnswerAction, ExecuteQuery, render_action
from bapsql.rollout.engines.base import AdapterRef, Generation, SamplingParams, adapter_digest, check_step
from bapsql.tokens import DEFAULT_TOKENIZER_DIR
from bapsql.types import Task

FALLBACK = "I am not sure what to do."


def gold_plan(task: Task) -> list[str]:
    """Execute the gold SQL, then answer with the gold values citing the block."""
    answer = AnswerAction(task.gold.kind, task.gold.values, ("E1",))
    return [render_action(ExecuteQuery(task.gold_sql)), render_action(answer)]


class PlanEngine:
    """See the module docstring. ``plans``: question text → completions by turn; ``calls`` records batch sizes."""

    name = "plan"

    def __init__(self, plans: dict[str, list[str]] | None = None, tokenizer_dir: str = str(DEFAULT_TOKENIZER_DIR)):
        from bapsql.models.chat_template import ChatTemplate

        self.template = ChatTemplate.from_dir(tokenizer_dir)
        self.plans = dict(plans or {})
        self.calls: list[int] = []
        self.steps: list[tuple[int, int]] = []  # (requests admitted, requests decoding) per step() call
        self.adapters: list[tuple[str, int]] = []
        self._running: dict[str, list] = {}  # step() key -> [generation, tokens still to decode]
        self.pid = os.getpid()

    def _completion(self, prompt_ids: Sequence[int]) -> str:
        text = self.template.decode(list(prompt_ids))
        turn = text.count("<|im_start|>assistant") - 1
        for question, plan in self.plans.items():
            if question in text:
                return plan[turn] if turn < len(plan) else FALLBACK
        return FALLBACK

    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *,
                 adapter: AdapterRef | None = None) -> list[Generation]:
        self.calls.append(len(prompts))
        return self._generate(prompts, params)

    def step(self, new, *, adapter: AdapterRef | None = None) -> list[tuple[str, Generation]]:
        """Continuous batching simulated in tokens: admit ``new``, decode every running request until the shortest
        remaining one is done, return those that finished (the others keep their progress)."""
        check_step(new, self._running, 10**9)
        for key, p, sp in new:
            gen = self._generate([p], [sp])[0]
            self._running[key] = [gen, len(gen.completion_ids)]
        if not self._running:
            return []
        self.steps.append((len(new), len(self._running)))
        tick = min(left for _, left in self._running.values())
        done = []
        for key in list(self._running):
            self._running[key][1] -= tick
            if self._running[key][1] == 0:
                done.append((key, self._running.pop(key)[0]))
        return done

    def in_flight(self) -> int:
        return len(self._running)

    def _generate(self, prompts, params) -> list[Generation]:
        out = []
        for p, sp in zip(prompts, params):
            ids = self.template.encode(self._completion(p) + "<|im_end|>")
            finish = "stop"
            if len(ids) > sp.max_tokens:
                ids, finish = ids[:sp.max_tokens], "length"
            lps = tuple(-((zlib.crc32(f"{sp.seed}:{i}".encode()) % 1000) / 1000.0 + 1e-3) for i in range(len(ids)))
            out.append(Generation(tuple(p), tuple(ids), self.template.decode(ids), lps if sp.logprobs else None,
                                  finish))
        return out

    def load_adapter(self, path: str, name: str, version: int) -> AdapterRef:
        self.adapters.append((name, version))
        digest = adapter_digest(path) if os.path.isdir(path) else ""  # a hand-made spec may name no folder
        self.serving = AdapterRef(name, version, path, 1, digest)
        return self.serving

    def served_adapter(self, adapter: AdapterRef | None) -> AdapterRef | None:
        return None if adapter is None else self.serving

    def logprobs_of(self, prompt_ids, completion_ids, *, adapter=None) -> list[float]:
        return [math.log(0.5)] * len(completion_ids)

    def close(self) -> None:
        pass
