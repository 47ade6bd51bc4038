"""Turn text in the logs: the cap, the share sampling, the config section, schema v4 (bapsql/logs/text.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapsql.config import from_mapping
from bapsql.errors import ConfigError
from bapsql.logs.schema import SCHEMA_VERSION, TURNS_SCHEMA
from bapsql.logs.text import (
    TEXT_CAP_CHARS,
    TextLogConfig,
    apply_text_policy,
    cap_text,
    keeps_text,
    text_fraction,
)
from bapsql.logs.writer import episode_id


def test_schema_v4_adds_nullable_text_columns_to_the_turns_table():
    assert SCHEMA_VERSION == 4
    for name in ("completion", "observation"):
        field = TURNS_SCHEMA.field(name)
        assert field.type == pa.string() and field.nullable


def test_cap_keeps_short_text_and_marks_what_it_cuts():
    assert cap_text(None) is None
    assert cap_text("SELECT 1") == "SELECT 1"
    exact = "x" * TEXT_CAP_CHARS
    assert cap_text(exact) is exact
    long = "a" * 3000 + "b" * 7000
    capped = cap_text(long)
    assert len(capped) == TEXT_CAP_CHARS and capped.startswith("a" * 3000)
    kept, marker = capped.split("…[+")
    assert marker == f"{len(long) - len(kept)} chars]"


@given(st.text(max_size=400), st.integers(min_value=64, max_value=300))
def test_cap_never_exceeds_the_limit_and_keeps_a_prefix(text, limit):
    out = cap_text(text, limit)
    assert len(out) <= limit
    if len(text) <= limit:
        assert out == text
    else:
        kept, _, rest = out.rpartition("…[+")
        assert text.startswith(kept) and rest == f"{len(text) - len(kept)} chars]"


def test_the_sample_is_deterministic_and_respects_the_share():
    ids = [episode_id("run", "m@full", lv, s, f"t{i}") for lv in ("XS", "S") for s in range(5) for i in range(2000)]
    assert [text_fraction(e) for e in ids[:50]] == [text_fraction(e) for e in ids[:50]]  # same id, same draw
    for share in (0.05, 0.1, 0.5):
        cfg = TextLogConfig(mode="sample", share=share)
        kept = [e for e in ids if keeps_text(e, cfg)]
        assert abs(len(kept) / len(ids) - share) < 0.01  # 20,000 ids: 4 standard errors at share 0.5
        assert kept == [e for e in ids if keeps_text(e, cfg)]  # a rerun keeps the same episodes
    small, large = TextLogConfig(mode="sample", share=0.1), TextLogConfig(mode="sample", share=0.5)
    assert all(keeps_text(e, large) for e in ids if keeps_text(e, small))  # a larger share keeps a superset
    assert all(keeps_text(e, TextLogConfig()) for e in ids[:100])
    assert not any(keeps_text(e, TextLogConfig(mode="none")) for e in ids[:100])
    assert keeps_text(ids[0], TextLogConfig(mode="sample", share=1.0))


def test_apply_text_policy_caps_or_nulls_a_copy():
    row = {"turn": 1, "completion": "c" * 500, "observation": "short"}
    assert apply_text_policy(row, True) is row  # nothing to change: no copy
    capped = apply_text_policy(row, True, 100)
    assert len(capped["completion"]) == 100 and capped["observation"] == "short"
    dropped = apply_text_policy(row, False)
    assert dropped == {"turn": 1, "completion": None, "observation": None}
    assert row["completion"] == "c" * 500  # the caller's row is never modified
    bare = {"turn": 2}
    assert apply_text_policy(bare, False) is bare


@pytest.mark.parametrize("raw, match", [
    ({"mode": "some"}, r"log_text.mode: 'some' is not one of"),
    ({"mode": "sample", "share": 0.0}, r"log_text.share: must be a number in \(0, 1\]"),
    ({"mode": "sample", "share": 1.5}, r"log_text.share"),
    ({"max_chars": 10}, r"log_text.max_chars"),
    ({"max_chars": TEXT_CAP_CHARS + 1}, r"log_text.max_chars"),
    ({"mode": "all", "shares": 0.2}, r"log_text: unknown key\(s\) \['shares'\]"),
])
def test_a_bad_log_text_section_is_named(raw, match):
    with pytest.raises(ConfigError, match=match):
        from_mapping(TextLogConfig, raw, "log_text")


def test_experiment_and_train_configs_take_a_strict_log_text_section():
    from bapsql.experiment import ExperimentConfig
    from bapsql.train.config import TrainConfig

    exp = from_mapping(ExperimentConfig, {"run": "r", "methods": ["scripted.drafter"],
                                          "log_text": {"mode": "sample", "share": 0.25}})
    assert exp.log_text == TextLogConfig(mode="sample", share=0.25)
    assert from_mapping(ExperimentConfig, {"run": "r", "methods": ["x"]}).log_text.mode == "all"  # sweeps: all
    with pytest.raises(ConfigError, match=r"log_text: unknown key\(s\) \['every'\]"):
        from_mapping(ExperimentConfig, {"run": "r", "methods": ["x"], "log_text": {"every": 3}})
    train = from_mapping(TrainConfig, {"name": "n", "model": {"base": "m"}})
    assert train.rollout.log_text == TextLogConfig(mode="sample", share=0.1) and train.eval.log_text.mode == "all"
    with pytest.raises(ConfigError, match=r"rollout.log_text: unknown key\(s\) \['rate'\]"):
        from_mapping(TrainConfig, {"name": "n", "model": {"base": "m"}, "rollout": {"log_text": {"rate": 0.5}}})
    with pytest.raises(ConfigError, match=r"eval.log_text.mode"):
        from_mapping(TrainConfig, {"name": "n", "model": {"base": "m"}, "eval": {"log_text": {"mode": "half"}}})
