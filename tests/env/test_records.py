"""Environment options and record types (bapsql/env/records.py)."""

from __future__ import annotations

import pytest

from bapsql.config import from_mapping
from bapsql.env.conditions import Condition
from bapsql.env.records import EnvOptions, TurnDraft
from bapsql.errors import ConfigError


def test_options_load_strictly_from_a_mapping():
    opts = from_mapping(EnvOptions, {"completion_reserve": 32,
                                     "condition": {"name": "mine", "actions": ["execute_query", "answer"],
                                                   "estimates": "none", "preflight": "words"}})
    assert opts.completion_reserve == 32 and opts.allowed_actions == ("execute_query", "answer")
    assert opts.condition.name == "mine" and opts.condition.preflight == "words"
    with pytest.raises(ConfigError, match="completion_reserv"):
        from_mapping(EnvOptions, {"completion_reserv": 3})
    with pytest.raises(ConfigError, match="unknown tool"):
        Condition(actions=("execute_query", "drop_table", "answer"))
    with pytest.raises(ConfigError, match="answer or abstain"):
        Condition(actions=("execute_query",))
    with pytest.raises(ConfigError, match="condition.posthoc"):
        from_mapping(EnvOptions, {"condition": {"posthoc": "magic"}})
    with pytest.raises(ConfigError, match="row_cap"):
        EnvOptions(row_cap=-1)


def test_turn_draft_without_estimate_or_shield_has_empty_actuals():
    from bapsql.budgets import get_budget
    from bapsql.env.ledger import Ledger

    led = Ledger(get_budget("XS"))
    before = led.snapshot()
    led.consume_turn()
    rec = TurnDraft("inspect_schema").record(before, led.snapshot(), ctx_before=10, ctx_after=20, prompt_tokens=7,
                                             completion_tokens=3)
    assert rec.turn == 1 and rec.est_rows_p50 is None and rec.actual_vm_steps is None and rec.prompt_tokens == 7
    info = TurnDraft("inspect_schema").info(led.snapshot(), max_completion_tokens=5, terminated=False, truncated=False)
    assert info["ledger"]["spent"]["turns"] == 1 and info["estimate"] is None and info["max_completion_tokens"] == 5


def test_prompt_style_is_checked_and_reaches_the_system_message(make_env, task):
    import pytest as _pytest

    from bapsql.budgets import load_ladder
    from bapsql.env.records import EnvOptions
    from bapsql.errors import ConfigError

    with _pytest.raises(ConfigError, match="prompt_style"):
        EnvOptions(prompt_style="short")
    env = make_env(prompt_style="terse")
    env.reset(task, load_ladder()["L"], seed=0)
    assert env.messages[0]["content"].startswith("SQLite questions. One tool call per turn.")
