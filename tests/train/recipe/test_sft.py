"""SFT: pairs from `bapsql sft-data` Parquet, completion-only loss, data-parallel split, Ray Train TorchTrainer."""

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bapsql.errors import ConfigError
from bapsql.train.recipe.sft import load_pairs, sft_epochs, steps_per_epoch

torch = pytest.importorskip("torch")


def write_pairs(path, n=12, long_every=0):
    rows = []
    for i in range(n):
        prompt = [200 + (i * 7 + k) % 500 for k in range(14)]
        completion = [900 + (i + k) % 50 for k in range(6)]
        if long_every and i % long_every == 0:
            prompt = prompt * 10
        rows.append({"input_ids": prompt + completion, "loss_mask": [0] * len(prompt) + [1] * len(completion)})
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_load_pairs_drops_too_long_and_keeps_masks(tmp_path):
    samples, dropped = load_pairs(write_pairs(tmp_path / "p.parquet", n=12, long_every=4), max_length=64)
    assert dropped == 3 and len(samples) == 9
    assert all(sum(s.loss_mask) == 6 and s.loss_mask[-6:] == (1,) * 6 for s in samples)
    with pytest.raises(ConfigError, match="sft-data"):
        load_pairs(tmp_path / "missing.parquet", 64)


def test_sft_epoch_learns_the_completions(make_learner, tmp_path):
    samples, _ = load_pairs(write_pairs(tmp_path / "p.parquet", n=8), 8192)
    learner = make_learner(lr=1e-2)
    metrics = sft_epochs(learner, samples, effective_batch=4, epochs=12, seed=0)
    assert len(metrics) == 12 * steps_per_epoch(8, 4) == 24
    # a random tiny model's frozen LM head and norms cap how far LoRA alone can move its logits
    assert metrics[-1].loss < metrics[0].loss - 0.5


def test_ranks_split_each_effective_batch(make_learner, tmp_path):
    samples, _ = load_pairs(write_pairs(tmp_path / "p.parquet", n=8), 8192)

    class Recorder:
        def __init__(self):
            self.batches = []

        def sft_update(self, batch):
            self.batches.append([s.input_ids for s in batch])
            return None

    recs = [Recorder(), Recorder()]
    for rank, rec in enumerate(recs):
        sft_epochs(rec, samples, effective_batch=4, seed=3, rank=rank, world=2)
    for a, b in zip(*[r.batches for r in recs]):
        assert len(a) == len(b) == 2 and not set(a) & set(b)
    seen = [ids for r in recs for batch in r.batches for ids in batch]
    assert sorted(seen) == sorted(s.input_ids for s in samples)  # one epoch: every pair exactly once


@pytest.mark.slow
def test_ray_train_torchtrainer_one_cpu_worker(tiny_model_dir, tmp_path, capfd):
    pytest.importorskip("ray")
    from bapsql.rollout.ray_shell import local_ray
    from bapsql.train.config import LearnerConfig, LoraSpec, OptimConfig
    from bapsql.train.learner.core import Learner
    from bapsql.train.recipe.sft import run_sft

    data = write_pairs(tmp_path / "p.parquet", n=16)
    cfg = LearnerConfig(model_path=str(tiny_model_dir), lora=LoraSpec(rank=8, alpha=16), optim=OptimConfig(lr=1e-2),
                        dtype="float32", device="cpu")
    with local_ray(num_cpus=2):
        result = run_sft(data, cfg, tmp_path / "sft", effective_batch=4, epochs=1)
    assert result.steps == 4 and result.pairs == 16 and len(result.losses) == 4
    assert (result.adapter_dir / "adapter_model.safetensors").is_file()
    assert (result.merged_dir / "config.json").is_file() and (result.merged_dir / "tokenizer.json").is_file()
    # rank 0's progress reaches the driver's console although Ray keeps worker output away from it
    assert "SFT step 4/4 (100%)" in capfd.readouterr().err
    assert "SFT step 4/4" in (tmp_path / "sft" / "progress.log").read_text()
    # the merged model is the trained policy: its completion NLL is below the base model's
    samples, _ = load_pairs(data, 8192)
    base = Learner(cfg)
    merged = Learner(dataclasses.replace(cfg, model_path=str(result.merged_dir)))

    def nll(learner):
        return -sum(float((lp * s.loss_mask).sum()) for lp, s in zip(learner.token_logprobs(samples), samples))

    assert nll(merged) < nll(base)


def test_the_progress_line_says_step_share_loss_and_time_left():
    from bapsql.train.recipe.sft import progress_line

    assert progress_line(20, 80, 0.4567, 120.0) == "SFT step 20/80 (25%)  loss 0.457  elapsed 2.0 min  eta 6.0 min"
