"""benchmarks/learner_memory.py: one SFT and one GRPO update timed and sized, with and without checkpointing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learner_memory  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from bapsql.models.tiny import TinySpec, make_tiny_model

    out = tmp_path_factory.mktemp("tiny")
    make_tiny_model(out, seed=0, spec=TinySpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                              intermediate_size=128, max_position_embeddings=2048))
    return str(out)


@pytest.mark.parametrize("stage", ["sft", "grpo"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_case_times_the_update_and_reads_the_peak(tiny, stage, checkpointing):
    r = learner_memory.one_case(tiny, 400, checkpointing, 1, stage=stage, batch=3, micro_batch_tokens=800,
                                repeats=2)
    assert (r["length"], r["checkpointing"]) == (400, checkpointing)
    assert r["peak_rss_gib"] >= r["rss_before_update_gib"] > 0 and r["update_s"] >= 0


def test_lengths_that_leave_no_prompt_are_refused(capsys):
    with pytest.raises(SystemExit):
        learner_memory.main(["--model", "m", "--lengths", "200"])
    assert "--lengths must exceed" in capsys.readouterr().err


def test_pairs_take_the_first_sequences_and_masks_of_an_sft_parquet(tiny, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [list(range(100, 100 + n)) for n in (50, 70, 90)]
    masks = [[0] * (n - 10) + [1] * 10 for n in (50, 70, 90)]
    pq.write_table(pa.table({"input_ids": ids, "loss_mask": masks}), tmp_path / "pairs.parquet")
    r = learner_memory.one_case(tiny, 400, False, 1, stage="sft", batch=2, pairs=str(tmp_path / "pairs.parquet"))
    assert r["length"] == 60  # the mean of the first two sequences, not --lengths
    g = learner_memory.one_case(tiny, 400, False, 1, stage="grpo", batch=3, pairs=str(tmp_path / "pairs.parquet"))
    assert g["length"] == 70 and g["update_s"] >= 0


def test_a_missing_pairs_file_is_refused(capsys, tmp_path):
    with pytest.raises(SystemExit):
        learner_memory.main(["--model", "m", "--pairs", str(tmp_path / "none.parquet")])
    assert "--pairs: no file" in capsys.readouterr().err
