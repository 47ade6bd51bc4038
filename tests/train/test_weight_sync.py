"""Weight sync: the engine serves the learner's adapter after every update, and a stale adapter is caught."""

import random

import pytest

from bapsql.errors import WeightSyncError
from bapsql.train.learner import Sample
from bapsql.train.weight_sync import WeightSync, compare, make_probe

torch = pytest.importorskip("torch")


@pytest.fixture()
def hf_engine(tiny_model_dir):
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.engines.hf import HFEngine

    engine = HFEngine(EngineConfig(kind="hf", model=str(tiny_model_dir), dtype="float32", device="cpu",
                                   num_threads=1, max_model_len=2048))
    yield engine
    engine.close()


@pytest.fixture()
def probe(tiny_model_dir):
    from bapsql.models.chat_template import ChatTemplate

    return make_probe(ChatTemplate.from_dir(tiny_model_dir))


def train_a_bit(learner, steps=3, seed=0):
    rng = random.Random(seed)
    batch = [Sample(tuple(rng.randrange(100, 8000) for _ in range(24)), tuple([0] * 12 + [1] * 12))
             for _ in range(4)]
    for _ in range(steps):
        learner.sft_update(batch)


def test_sync_checks_and_catches_stale_adapters(make_learner, hf_engine, probe, tmp_path):
    learner = make_learner(lr=5e-2)
    sync = WeightSync(hf_engine, learner, probe, tmp_path / "adapters", tolerance=1e-3, max_tolerance=1e-2)
    first = sync.sync(0)
    assert first.mean_abs < 1e-4 and first.version == 0 and len(probe.completion_ids) > 5

    train_a_bit(learner)
    report = sync.sync(1)  # fresh adapter: engine == learner
    assert report.mean_abs < 1e-4 and report.discriminative and report.learner_delta > 1e-3
    assert report.seconds > 0 and set(report.metrics()) >= {"sync/seconds", "sync/logprob_mismatch_mean"}
    served = sync.adapter

    train_a_bit(learner, seed=1)
    with pytest.raises(WeightSyncError, match="stale"):
        sync.check(served, 2)  # the engine still serves version 1: caught
    stale_dir = tmp_path / "adapters" / "v000001"
    stale = hf_engine.load_adapter(str(stale_dir), "policy", 2)  # a new version number over old weights
    with pytest.raises(WeightSyncError):
        sync.check(stale, 2)
    with pytest.raises(WeightSyncError):
        sync.check(None, 2)  # silently sampling from the base weights
    assert sync.sync(2).mean_abs < 1e-4  # a real sync recovers


def test_compare_validates_lengths():
    assert compare([0.0, -1.0], [0.0, -1.5]) == (0.25, 0.5)
    with pytest.raises(WeightSyncError):
        compare([0.0], [0.0, 1.0])
    with pytest.raises(WeightSyncError):
        compare([float("nan")], [0.0])


def test_a_stale_adapter_is_caught_after_a_real_update_at_the_papers_learning_rate(make_learner, hf_engine, probe,
                                                                                  tmp_path):
    """lr 1e-6 moves the probe ~1e-6 per token, far below the level tolerance; the change since the last sync
    (engine vs learner) still tells a fresh adapter from a stale one."""
    from bapsql.train.grpo import LossConfig

    learner = make_learner(lr=1e-6)
    sync = WeightSync(hf_engine, learner, probe, tmp_path / "adapters")  # the default tolerances
    sync.sync(0)
    rng = random.Random(0)
    batch = [Sample(tuple(rng.randrange(100, 8000) for _ in range(24)), tuple([0] * 12 + [1] * 12))
             for _ in range(4)]

    def update():
        lps = learner.token_logprobs(batch)
        learner.grpo_update([Sample(s.input_ids, s.loss_mask, tuple(lp), 1.0 if i % 2 else -1.0)
                             for i, (s, lp) in enumerate(zip(batch, lps))], LossConfig())

    update()
    fresh = sync.sync(1)
    assert fresh.discriminative and abs(fresh.delta_slope - 1) < 0.5
    assert 0 < fresh.learner_delta < 1e-4  # a tiny move: the level check alone cannot see it
    served = sync.adapter
    update()
    with pytest.raises(WeightSyncError, match="stale"):
        sync.check(served, 2)  # the engine still serves version 1
    stale = hf_engine.load_adapter(str(tmp_path / "adapters" / "v000001"), "policy", 2)
    with pytest.raises(WeightSyncError, match="did not move"):
        sync.check(stale, 2)  # a new version number over old weights
    again = sync.sync(2)  # a real sync passes
    assert again.discriminative and abs(again.delta_slope - 1) < 0.5


def test_the_probe_uses_the_runs_chat_template_options(tmp_path):
    import shutil

    from bapsql.models.chat_template import ChatTemplate
    from bapsql.tokens import DEFAULT_TOKENIZER_DIR
    from tests.policies.test_sft_export import QWEN3_STYLE

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEFAULT_TOKENIZER_DIR / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text(QWEN3_STYLE)
    template = ChatTemplate.from_dir(tmp_path)
    off = make_probe(template, enable_thinking=False)
    assert template.decode(off.prompt_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not template.decode(make_probe(template).prompt_ids).endswith("</think>\n\n")
