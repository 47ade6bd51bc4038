"""The completion-cap check (`bapsql.rollout.completion_cap`): gold answer calls measured with a real tokenizer against
a slow reference, its properties, the warning's text, and the warning a real local sweep prints before it runs."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings, strategies as st

from bapsql.env.actions import AnswerAction, parse_action
from bapsql.rollout.completion_cap import (
    CapCheck,
    cap_warning,
    check_completion_cap,
    gold_answer_call,
    warn_completion_cap,
)
from bapsql.tokens import DEFAULT_TOKENIZER_DIR, load_token_counter
from bapsql.types import Answer, Task

COUNTER = load_token_counter("default")


def _task(i: int, gold: Answer | None) -> Task:
    return Task(task_id=f"t{i}", db_id="db", db_path="db.sqlite", question="q?", gold_sql="SELECT 1", gold=gold)


def _list(n: int) -> Answer:
    return Answer("list", tuple(f"label number {k}" for k in range(n)))


def _reference(tasks, cap):
    """The slow loop: render each gold answer as its call and count it."""
    over, longest, answered = [], 0, 0
    for t in tasks:
        if t.gold is None:
            continue
        answered += 1
        text = ('<tool_call>\n{"name": "answer", "arguments": {"kind": "' + t.gold.kind + '", "values": '
                + json.dumps(list(t.gold.values), ensure_ascii=False)
                + ', "citations": ["E1"]}}\n</tool_call>')
        n = COUNTER.count(text)
        longest = max(longest, n)
        if n > cap:
            over.append((n, t.task_id))
    return answered, {tid for _, tid in over}, longest


def test_the_gold_answer_call_parses_back_to_the_gold_answer():
    for gold in (Answer("scalar", (42,)), _list(5), Answer("ordered_list", (("a", 1.5), ("b", None)))):
        action = parse_action(gold_answer_call(_task(0, gold)))
        assert isinstance(action, AnswerAction) and action.to_answer() == gold and action.citations == ("E1",)
    assert gold_answer_call(_task(0, None)) is None


def test_long_lists_are_over_a_small_cap_and_match_the_reference():
    tasks = [_task(0, Answer("scalar", (7,))), _task(1, _list(3)), _task(2, _list(20)), _task(3, _list(40)),
             _task(4, None)]
    check = check_completion_cap(tasks, COUNTER, 64)
    answered, over, longest = _reference(tasks, 64)
    assert (check.answered, set(check.over), check.longest) == (answered, over, longest) == (4, {"t2", "t3"}, longest)
    assert check.over == ("t3", "t2")  # longest first
    assert not check.fits and check_completion_cap(tasks, COUNTER, longest).fits


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=0, max_size=8), st.integers(1, 300), st.integers(1, 300))
def test_a_larger_cap_never_adds_a_task_over_it(sizes, a, b):
    tasks = [_task(i, _list(n) if n else None) for i, n in enumerate(sizes)]
    lo, hi = sorted((a, b))
    small, large = check_completion_cap(tasks, COUNTER, lo), check_completion_cap(tasks, COUNTER, hi)
    assert set(large.over) <= set(small.over)
    assert small.longest == large.longest and small.answered == large.answered == sum(1 for n in sizes if n)
    assert large.fits == (large.longest <= hi)


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        check_completion_cap([], COUNTER, 0)


def test_the_warning_names_the_count_the_longest_and_the_key_to_raise():
    check = CapCheck(cap=96, answered=55, over=("a", "b", "c", "d"), longest=183)
    msg = cap_warning(check, where="`test`", key="eval.max_new_tokens")
    assert msg.startswith("4 of 55 `test` gold answers need more than 96 new tokens")
    assert "a, b, c, ..." in msg and "raise eval.max_new_tokens to at least 183" in msg
    assert cap_warning(CapCheck(96, 55, (), 80), where="`test`", key="k") is None


def test_warn_reads_the_model_folders_tokenizer_and_skips_a_folder_without_one(tmp_path, caplog):
    tasks = [_task(0, _list(30))]
    said = []
    with caplog.at_level(logging.WARNING, logger="bapsql.rollout.completion_cap"):
        check = warn_completion_cap(tasks, DEFAULT_TOKENIZER_DIR, 16, where="`dev`", key="grpo.max_new_tokens",
                                    say=said.append)
    assert check is not None and check.over == ("t0",)
    assert len(said) == 1 and "grpo.max_new_tokens" in said[0] and said[0] in caplog.text
    assert warn_completion_cap(tasks, tmp_path, 16, where="`dev`", key="k", say=said.append) is None
    assert len(said) == 1


@pytest.mark.slow
def test_a_local_sweep_warns_before_it_runs_when_answers_outgrow_the_cap(tmp_path_factory, tmp_path, caplog):
    pytest.importorskip("torch")
    from bapsql.experiment import ExperimentConfig, SamplingConfig, WorkersConfig, validate
    from bapsql.models.tiny import TinySpec, make_tiny_model
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.sweep import run_sweep
    from tests.rollout.rollout_bench import build_rollout_bench

    model = tmp_path_factory.mktemp("tiny") / "model"
    make_tiny_model(model, seed=0, spec=TinySpec(max_position_embeddings=4096))
    bench = build_rollout_bench(tmp_path_factory.mktemp("bench"))
    cfg = validate(ExperimentConfig(
        run="cap", methods=("model:tiny@full",), benchmark=str(bench), split="dev", budgets=("XS",), seeds=(0,),
        limit=2, engines={"tiny": EngineConfig(kind="hf", model=str(model), max_model_len=4096, num_threads=1)},
        sampling=SamplingConfig(max_tokens=2), workers=WorkersConfig(env_workers=1)))
    with caplog.at_level(logging.WARNING, logger="bapsql.rollout.completion_cap"):
        s = run_sweep(cfg, out_dir=tmp_path / "run", backend="local")
    assert "2 of 2 `dev` (engine tiny) gold answers need more than 2 new tokens" in caplog.text
    assert "raise sampling.max_tokens" in caplog.text
    assert s.result.episodes_run == 2  # a warning, not a refusal: the sweep still runs
