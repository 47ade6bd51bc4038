"""GRPO's headroom (bapsql.train.experiments.headroom): unbiased pass@k against enumeration, the per-level summary, and
the job's wiring on a real (untrained) model."""

import io
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapsql.errors import ConfigError
from bapsql.train.experiments.headroom import level_headroom, pass_at_k, render_headroom, sql_difference


def _slow_pass_at_k(n: int, c: int, k: int) -> float:
    """Enumerate every k-subset of n samples of which the first c succeed."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_chance_that_k_of_n_samples_hold_a_success(nck):
    n, c, k = nck
    assert pass_at_k(np.array([n]), np.array([c]), k)[0] == pytest.approx(_slow_pass_at_k(n, c, k), abs=1e-12)


@given(st.lists(st.integers(0, 8), min_size=1, max_size=10))
def test_pass_at_1_is_the_success_rate_and_pass_at_n_is_any_success(cs):
    n, c = np.full(len(cs), 8), np.array(cs)
    assert np.allclose(pass_at_k(n, c, 1), c / 8)
    assert np.array_equal(pass_at_k(n, c, 8), (c > 0).astype(float))
    for k in range(1, 8):  # more samples never lower the chance
        assert np.all(pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k) - 1e-12)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(np.array([4]), np.array([5]), 2)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(np.array([4]), np.array([1]), 5)


def test_level_headroom_counts_what_only_sampling_solves():
    greedy = [False, False, True, True, False]
    samples = np.array([
        [0, 0, 0, 0],  # unsolved: no sample either
        [1, 0, 0, 0],  # sharpenable
        [1, 1, 1, 1],  # solid
        [1, 0, 0, 0],  # greedy solves, 1 of 4 samples: at risk
        [1, 1, 0, 1],  # sharpenable
    ], dtype=bool)
    fails = ["insufficient_evidence", "wrong_with_sufficient_evidence", "", "", "insufficient_evidence"]
    h = level_headroom("XS", greedy, samples, fails, band=(1, 3))
    assert (h.tasks, h.group_size) == (5, 4)
    assert h.greedy == pytest.approx(0.4) and h.sampled == pytest.approx(9 / 20)
    assert h.sharpenable == 2 and h.at_risk == 1 and h.in_band == 3
    assert h.ceiling == pytest.approx(0.8)
    assert h.histogram == (1, 2, 0, 1, 1)
    assert set(h.pass_at) == {1, 2, 4} and h.pass_at[4] == pytest.approx(0.8) and h.pass_at[1] == h.sampled
    assert h.failures == {"insufficient_evidence": 2, "success": 2, "wrong_with_sufficient_evidence": 1}
    text = render_headroom([h])
    assert "pass@4" in text and "0.800" in text and "insufficient_evidence 2" in text


@given(st.lists(st.tuples(st.booleans(), st.lists(st.booleans(), min_size=8, max_size=8)), min_size=1, max_size=20))
def test_the_sharpening_ceiling_lies_between_greedy_and_pass_at_the_group_size(rows):
    greedy = [g for g, _ in rows]
    samples = np.array([s for _, s in rows], dtype=bool)
    h = level_headroom("S", greedy, samples, [""] * len(rows), band=(1, 7))
    assert h.greedy - 1e-12 <= h.ceiling <= 1 + 1e-12
    # every task greedy solves or some sample solves counts once in the ceiling
    assert h.ceiling == pytest.approx(np.mean([g or any(s) for g, s in rows]))
    assert sum(h.histogram) == h.tasks and h.in_band == sum(h.histogram[1:8])
    assert math.isclose(h.pass_at[8], np.mean([any(s) for _, s in rows]))


@pytest.mark.parametrize("sql, kind", [
    ("SELECT category FROM products WHERE name = 'Vivid Leather Rug'", "same"),
    ("select category from products where name='Vivid Leather Rug'", "same"),
    ("SELECT category FROM products WHERE name = 'Vivid Silk Rug'", "literal"),
    ("SELECT category FROM products WHERE name = 'Vivid Leather Rug' AND price > 3", "structure"),
    ("SELECT name FROM products WHERE name = 'Vivid Leather Rug'", "structure"),
    ("SELEC category FRM products", "structure"),
    # SmolLM2 wrote this one (2026-12-05): sqlglot cannot even tokenize it (an unterminated string), which raised
    ("SELECT * FROM museums WHERE CONCAT(LAST_FAMILY_NAME, 'Science Museum'!') = '1'", "structure"),
    (None, "no_query"),
])
def test_sql_difference_tells_a_miscopied_value_from_a_wrong_query(sql, kind):
    assert sql_difference(sql, "SELECT category FROM products WHERE name = 'Vivid Leather Rug'") == kind


def test_sql_difference_blanks_numbers_too():
    gold = "SELECT id FROM orders WHERE status = 'returned' AND total_amount > 354.16"
    assert sql_difference("SELECT id FROM orders WHERE status = 'returned' AND total_amount > 3406.16", gold) == "literal"


def test_level_headroom_counts_the_failures_sql_differences_only():
    h = level_headroom("XS", [True, False, False], np.zeros((3, 2), dtype=bool), ["", "x", "y"], band=(1, 1),
                       sql_differences=["same", "literal", "same"])
    assert h.failed_sql == {"same": 1, "literal": 1}
    assert "SQL vs gold: same 1, literal 1" in render_headroom([h])


def test_level_headroom_names_disagreeing_shapes():
    with pytest.raises(ValueError, match=r"samples \[T, G\]"):
        level_headroom("XS", [True, False], np.ones((3, 4), dtype=bool), ["", ""], band=(1, 3))


def _cfg(tiny_model_dir, tmp_path):
    from bapsql.train.config import DataSection, GRPOSection
    from tests.train.tiny_stage import tiny_stage_config

    return tiny_stage_config(
        "hr", tiny_model_dir, tmp_path / "runs", DataSection(benchmark="demo", split="train", eval_split="test"),
        GRPOSection(max_new_tokens=4, top_p=1.0, sft_init="none", prompts="augmented", prompt_rounds=1,
                    validation_tasks=3))


def test_measure_headroom_plays_the_validation_questions_greedy_and_sampled(tiny_model_dir, tmp_path):
    """The untrained tiny model solves nothing: every count is on the failing side, one greedy episode and a group
    of ``filter.group_size`` samples per question, and the JSON holds what the table shows."""
    from bapsql.train.experiments.headroom import measure_headroom

    from rich.console import Console

    cfg = _cfg(tiny_model_dir, tmp_path)
    out = io.StringIO()
    rows, path = measure_headroom(cfg, 0, console=Console(file=out, width=120))
    assert "headroom at XS: 3 questions" in out.getvalue() and "headroom XS" in out.getvalue()
    assert "100%" in out.getvalue()  # the bar counted all 3 x (1 + 2) episodes of both runs
    (h,) = rows
    assert (h.level, h.tasks, h.group_size) == ("XS", 3, 2)
    assert h.greedy == h.sampled == h.ceiling == 0.0 and h.histogram == (3, 0, 0)
    assert sum(h.failures.values()) == 3 and "success" not in h.failures
    assert sum(h.failed_sql.values()) == 3
    saved = json.loads(path.read_text())
    assert path.name == "headroom.json" and saved["levels"][0]["histogram"] == [3, 0, 0]


def test_measure_headroom_names_a_bad_level_and_a_folder_that_is_not_an_adapter(tiny_model_dir, tmp_path):
    from bapsql.train.experiments.headroom import measure_headroom

    cfg = _cfg(tiny_model_dir, tmp_path)
    with pytest.raises(ConfigError, match=r"levels \['L'\] are not among budgets.levels"):
        measure_headroom(cfg, 0, levels=("L",))
    with pytest.raises(ConfigError, match="no adapter_config.json"):
        measure_headroom(cfg, 0, adapter=tmp_path)


def test_result_names_keep_two_runs_adapters_apart(tmp_path):
    from bapsql.train.experiments.headroom import result_name

    a, b = tmp_path / "run-a" / "grpo" / "adapter", tmp_path / "run-b" / "grpo" / "adapter"
    assert result_name(None) == "headroom"
    assert result_name(a).startswith("headroom-grpo-adapter-") and result_name(a) != result_name(b)
    assert result_name(a) == result_name(str(a))
