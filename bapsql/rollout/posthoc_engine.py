"""A model-backed post-hoc controller (`bapsql.env.posthoc.Controller`): an engine prompted with the result's shape.

`EngineController(engine, template, template_kwargs=...)` renders a short chat — the result's row count, columns, the
tokens of the whole result and of its profile, and the result-token allowance — with the chat-template options the
engine serves under (``chat_template_kwargs``, e.g. Qwen3's ``enable_thinking: false``: the prompt ends in the empty
think block, so the model answers instead of opening one) and asks for one word: ``pass``, ``truncate``,
``limit`` or ``profile``. It decodes greedily (``max_tokens`` small). The prompt and completion token counts are
returned with the choice, so the environment charges them as controller tokens. An answer that names no control
falls back to ``fallback`` (``truncate`` by default: it never costs more than what fits), counted in
``unparsed``. `EngineController.from_config` builds one from an engine config (what ``bapsql eval --posthoc-engine
YAML`` uses): its engine, the chat template of its tokenizer folder and its chat-template options.
"""

from __future__ import annotations

import re
from typing import Any

from bapsql.env.posthoc import CONTROLS, ControllerChoice, ResultShape

SYSTEM = ("You control how a SQL query result enters an agent's context under a token budget. Reply with one word: "
          "pass (show the rows that fit), truncate (the first rows that fit), limit (a fixed first few rows) or "
          "profile (a per-column summary of the whole result: row count, min, max, mean, most frequent values).")
_WORD = re.compile(r"\b(" + "|".join(CONTROLS) + r")\b", re.IGNORECASE)


def shape_prompt(shape: ResultShape) -> str:
    """The user message describing one result's shape (column names are untrusted: control-token strings in them
    are escaped, `bapsql.models.untrusted`)."""
    from bapsql.models.untrusted import DEFAULT as neutralize

    rows = "unknown (stopped by the VM-step cap)" if shape.rows_total is None else f"{shape.rows_total}"
    full = "unknown" if shape.full_result_tokens is None else f"{shape.full_result_tokens}"
    prof = "unavailable" if shape.profile_tokens is None else f"{shape.profile_tokens}"
    return (f"Result: {rows} rows x {len(shape.columns)} columns ({neutralize(', '.join(shape.columns))}). "
            f"Whole result: {full} tokens; rows that fit: {shape.rows_fit}; profile: {prof} tokens; "
            f"allowance: {shape.allowance} result tokens. Which control?")


class EngineController:
    """See the module docstring. ``engine``: any `bapsql.rollout.engines` engine; ``template``: its chat template."""

    def __init__(self, engine: Any, template: Any, *, max_tokens: int = 8, fallback: str = "truncate",
                 template_kwargs: dict[str, Any] | None = None) -> None:
        if fallback not in CONTROLS:
            raise ValueError(f"fallback must be one of {CONTROLS}, got {fallback!r}")
        self.engine, self.template = engine, template
        self.template_kwargs = dict(template_kwargs or {})
        self.max_tokens, self.fallback = max_tokens, fallback
        self.calls = self.unparsed = 0

    @classmethod
    def from_config(cls, config: Any, **kw: Any) -> "EngineController":
        """The controller of engine config ``config`` (`bapsql.rollout.engines.base.EngineConfig`): the engine it
        makes, the chat template of its tokenizer folder and its ``chat_template_kwargs``. The caller closes
        ``controller.engine``."""
        from bapsql.models.chat_template import ChatTemplate
        from bapsql.rollout.engines.factory import make_engine

        template = ChatTemplate.from_dir(config.tokenizer_dir or config.model)
        return cls(make_engine(config), template, template_kwargs=dict(config.chat_template_kwargs), **kw)

    def choose(self, shape: ResultShape) -> ControllerChoice:
        from bapsql.rollout.engines.base import SamplingParams

        prompt = self.template.render([{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": shape_prompt(shape)}], add_generation_prompt=True,
                                      **self.template_kwargs)
        ids = self.template.encode(prompt)
        gen = self.engine.generate([ids], [SamplingParams(max_tokens=self.max_tokens, temperature=0.0,
                                                          logprobs=False)])[0]
        self.calls += 1
        m = _WORD.search(gen.text)
        if m is None:
            self.unparsed += 1
            control, note = self.fallback, f"[post-hoc controller: no control named; {self.fallback}]"
        else:
            control, note = m.group(1).lower(), ""
        return ControllerChoice(control, len(ids), len(gen.completion_ids), note)
