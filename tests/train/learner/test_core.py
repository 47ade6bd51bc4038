"""The LoRA learner on the tiny model: masked NLL, accumulation equivalence, identity init, merge, GRPO step."""

import random

import numpy as np
import pytest

from bapsql.train.algo.grpo import LossConfig
from bapsql.train.learner.core import Sample

torch = pytest.importorskip("torch")


def samples(n=6, length=24, prompt=12, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ln = length + rng.randrange(-4, 5)
        ids = tuple(rng.randrange(100, 8000) for _ in range(ln))
        out.append(Sample(ids, tuple([0] * prompt + [1] * (ln - prompt))))
    return out


def test_fresh_adapter_is_the_base_model(make_learner):
    learner = make_learner()
    s = samples(2)
    with_adapter = learner.token_logprobs(s)
    base = learner.token_logprobs(s, reference=True)
    for a, b in zip(with_adapter, base):
        np.testing.assert_allclose(a, b, atol=1e-6)
        assert a[0] == 0.0 and np.all(a[1:] < 0)


def test_sft_loss_is_the_completion_token_nll_and_decreases(make_learner):
    learner = make_learner(lr=2e-2)
    s = samples(4)
    lps = learner.token_logprobs(s)
    want = -sum(float((lp * np.array(x.loss_mask)).sum()) for lp, x in zip(lps, s)) / sum(sum(x.loss_mask) for x in s)
    first = learner.sft_update(s)
    assert first.loss == pytest.approx(want, rel=1e-5)
    assert first.loss_tokens == sum(sum(x.loss_mask) for x in s) and first.grad_norm > 0
    for _ in range(15):
        last = learner.sft_update(s)
    assert last.loss < first.loss - 0.5
    # prompt tokens are not trained: changing them in the mask-0 region leaves the loss definition unchanged
    masked = [Sample(x.input_ids, tuple(0 for _ in x.loss_mask[:-1]) + (1,)) for x in s]
    assert learner.sft_update(masked).loss_tokens == len(s)


def test_gradient_accumulation_matches_one_big_batch(make_learner):
    s = samples(6)
    from bapsql.train.config import OptimConfig

    sgd_like = OptimConfig(lr=1e-2, eps=1.0)  # Adam with a large eps steps ~ lr * g: weights compare gradients
    a = make_learner(micro_batch_tokens=100_000, optim=sgd_like)
    b = make_learner(micro_batch_tokens=60, optim=sgd_like)  # about two sequences per micro-batch
    ma, mb = a.sft_update(s), b.sft_update(s)
    assert ma.micro_batches == 1 and mb.micro_batches >= 3
    assert ma.loss == pytest.approx(mb.loss, rel=1e-5)
    assert ma.grad_norm == pytest.approx(mb.grad_norm, rel=1e-4)
    for (ka, va), (kb, vb) in zip(sorted(a.adapter_state().items()), sorted(b.adapter_state().items())):
        assert ka == kb
        torch.testing.assert_close(va, vb, atol=1e-7, rtol=1e-4)


def test_gradient_checkpointing_gives_the_same_grpo_update(make_learner):
    """Checkpointing recomputes each layer in the backward pass (memory, not math): with LoRA on a frozen base the
    adapter still gets its gradients (the inputs require grad) and the update is the one without it."""
    from bapsql.train.config import OptimConfig

    s = [Sample(x.input_ids, x.loss_mask, advantage=a) for x, a in zip(samples(4), (1.0, -0.5, 0.8, -1.3))]
    sgd_like = OptimConfig(lr=1e-2, eps=1.0)
    plain, ckpt = make_learner(optim=sgd_like), make_learner(optim=sgd_like, gradient_checkpointing=True)
    eng = [tuple(float(v) for v in lp) for lp in plain.token_logprobs(s)]
    s = [Sample(x.input_ids, x.loss_mask, advantage=x.advantage, engine_logprobs=e) for x, e in zip(s, eng)]
    mp, mc = plain.grpo_update(s, LossConfig()), ckpt.grpo_update(s, LossConfig())
    assert mp.grad_norm > 0 and mc.grad_norm == pytest.approx(mp.grad_norm, rel=1e-4)
    for (ka, va), (kb, vb) in zip(sorted(plain.adapter_state().items()), sorted(ckpt.adapter_state().items())):
        assert ka == kb
        torch.testing.assert_close(va, vb, atol=1e-7, rtol=1e-4)


def test_a_resumed_learner_follows_its_own_schedule_horizon(make_learner):
    """A checkpoint saved at the end of a 1-step cosine holds lr 0; resumed by a learner whose schedule has 2 steps
    (GRPO's updates grew), the next step runs at that schedule's rate (half the peak) and moves the adapter."""
    from bapsql.train.config import OptimConfig

    s = samples(4)
    short = make_learner(optim=OptimConfig(lr=1e-2, schedule="cosine", total_steps=1))
    short.sft_update(s)
    saved, adapter = short.training_state(), short.adapter_state()
    assert short.optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    same = make_learner(optim=OptimConfig(lr=1e-2, schedule="cosine", total_steps=1))
    same.load_adapter_state(adapter)
    same.load_training_state(saved)
    assert same.optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # a plain resume: unchanged
    longer = make_learner(optim=OptimConfig(lr=1e-2, schedule="cosine", total_steps=2))
    longer.load_adapter_state(adapter)
    longer.load_training_state(saved)
    assert longer.optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-2)
    assert longer.scheduler.get_last_lr() == [pytest.approx(0.5e-2)] * len(longer.optimizer.param_groups)
    longer.sft_update(s)
    moved = max(float((longer.adapter_state()[k] - v).abs().max()) for k, v in adapter.items())
    assert moved > 0


def test_grad_norm_is_clipped(make_learner):
    from bapsql.train.config import OptimConfig

    def delta_norm(max_grad_norm):
        learner = make_learner(optim=OptimConfig(lr=1.0, eps=1e3, max_grad_norm=max_grad_norm))  # step ~ g / 1e3
        before = learner.adapter_state()
        m = learner.sft_update(samples(2))
        after = learner.adapter_state()
        return m.grad_norm, float(sum(((after[k] - before[k]) ** 2).sum() for k in before) ** 0.5)

    norm, free = delta_norm(1e6)
    norm2, clipped = delta_norm(norm / 10)
    assert norm == pytest.approx(norm2, rel=1e-6)  # the reported norm is the pre-clip norm
    assert clipped == pytest.approx(free / 10, rel=1e-2)


def test_grpo_update_moves_logprobs_along_the_advantage(make_learner):
    learner = make_learner(lr=5e-3)
    s = samples(4)
    before = learner.token_logprobs(s)
    adv = [1.0, -1.0, 1.0, -1.0]
    batch = [Sample(x.input_ids, x.loss_mask, tuple(lp), a) for x, lp, a in zip(s, before, adv)]
    m = learner.grpo_update(batch, LossConfig())
    assert m.stats.tokens == sum(sum(x.loss_mask) for x in s) and m.stats.mismatch == pytest.approx(0, abs=1e-6)
    after = learner.token_logprobs(s)
    gain = [float(((b - a) * np.array(x.loss_mask)).sum()) for a, b, x in zip(before, after, s)]
    assert gain[0] > 0 and gain[2] > 0 and gain[1] < 0 and gain[3] < 0


def test_grpo_with_kl_uses_the_base_as_reference(make_learner):
    learner = make_learner(lr=5e-3)
    s = samples(2)
    for _ in range(3):
        learner.sft_update(s)
    lp = learner.token_logprobs(s)
    batch = [Sample(x.input_ids, x.loss_mask, tuple(l), 0.0) for x, l in zip(s, lp)]
    m = learner.grpo_update(batch, LossConfig(kl_coef=0.5))
    assert m.stats.kl > 0  # the adapter moved away from the base during SFT


def test_merged_model_equals_base_plus_adapter(make_learner, tmp_path):
    learner = make_learner(lr=2e-2)
    s = samples(3)
    for _ in range(3):
        learner.sft_update(s)
    merged = learner.merge_and_save(tmp_path / "merged")
    assert (merged / "tokenizer.json").is_file() and (merged / "config.json").is_file()
    again = make_learner(model_path=merged)  # a fresh adapter on the merged base
    for a, b in zip(learner.token_logprobs(s), again.token_logprobs(s)):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_sample_validation():
    with pytest.raises(ValueError):
        Sample((1, 2), (0,))
    with pytest.raises(ValueError):
        Sample((1, 2), (1, 1))


def _hf_samples(model_dir, temperature, top_p, n=4, tokens=10):
    """Completions the HF engine samples from the tiny model (seeded), with the logprobs it reports."""
    from bapsql.rollout.engines.base import EngineConfig, SamplingParams
    from bapsql.rollout.engines.hf import HFEngine

    engine = HFEngine(EngineConfig(kind="hf", model=str(model_dir), dtype="float32", device="cpu", num_threads=1,
                                   max_model_len=2048))
    rng = random.Random(1)
    prompts = [[rng.randrange(100, 8000) for _ in range(6 + 3 * i)] for i in range(n)]
    gens = engine.generate(prompts, [SamplingParams(max_tokens=tokens, temperature=temperature, top_p=top_p, seed=i)
                                     for i in range(n)])
    raw = [engine.logprobs_of(p, g.completion_ids) for p, g in zip(prompts, gens)]
    engine.close()
    return prompts, gens, raw


def _gap(learner, prompts, gens, **kw):
    """max |engine − learner| per sampled token, and the per-token gaps."""
    gaps = []
    for p, g in zip(prompts, gens):
        s = Sample(tuple(p) + g.completion_ids, (0,) * len(p) + (1,) * len(g.completion_ids))
        lp = learner.token_logprobs([s], masked_only=True, **kw)[0][len(p):]
        gaps.extend(abs(a - b) for a, b in zip(g.logprobs, lp))
    return max(gaps), gaps


def test_the_learner_recomputes_the_engines_nucleus_logprobs(make_learner, tiny_model_dir):
    """The HF engine samples at T = 0.7, top-p 0.95 and reports logprobs renormalised over the nucleus; the
    learner at the same temperature and top-p recomputes them (chunked and plain paths, policy and KL reference),
    while the full softmax at T (the learner before the nucleus) is off by the nucleus mass on every token."""
    prompts, gens, raw = _hf_samples(tiny_model_dir, 0.7, 0.95)
    assert sum(len(g.completion_ids) for g in gens) >= 20
    for chunk in (None, 0):  # chunked head, plain full-logits path
        learner = make_learner(temperature=0.7, top_p=0.95, logprob_chunk_tokens=chunk)
        assert _gap(learner, prompts, gens)[0] < 1e-5
        assert _gap(learner, prompts, gens, reference=True)[0] < 1e-5  # the fresh adapter is the base: same values
        for p, g, r in zip(prompts, gens, raw):  # the sync probe stays raw: T = 1, full softmax
            np.testing.assert_allclose(learner.logprobs_of(p, g.completion_ids), r, atol=1e-5)
    worst, gaps = _gap(make_learner(temperature=0.7), prompts, gens)
    assert worst > 0.01 and min(gaps) > 1e-3  # the nucleus mass, < 1 on every token


def test_learner_nucleus_settings_are_checked():
    from bapsql.errors import ConfigError
    from bapsql.train.config import LearnerConfig

    for kw in ({"top_p": 0.0}, {"top_p": 1.2}, {"top_k": -1}):
        with pytest.raises(ConfigError, match="top_"):
            LearnerConfig(model_path="m", **kw)


def test_rollback_restores_the_state_of_the_snapshot_exactly(make_learner):
    """Pipelined GRPO undoes a batch whose optimizer steps failed part-way: adapter, optimizer moments, scheduler
    and step come back as they were, and training again from there takes the very same steps (twice: the snapshot
    is not stepped in place by the optimizer it was loaded into)."""
    learner = make_learner(lr=1e-2)
    s = samples(4)
    learner.sft_update(s)  # optimizer moments exist
    assert learner.snapshot() == 1
    before = learner.adapter_state()
    first = [learner.sft_update(s).loss for _ in range(2)]
    assert learner.step == 3
    moved = learner.adapter_state()
    assert any(not torch.equal(before[k], moved[k]) for k in before)
    for _ in range(2):
        assert learner.rollback() == 1 and learner.step == 1
        after = learner.adapter_state()
        assert all(torch.equal(before[k], after[k]) for k in before)
        assert learner.scheduler.state_dict()["last_epoch"] == 1
        again = [learner.sft_update(s).loss for _ in range(2)]
        assert again == pytest.approx(first, rel=1e-6)


def test_rollback_without_a_snapshot_is_refused(make_learner):
    from bapsql.errors import ConfigError

    with pytest.raises(ConfigError, match="no snapshot"):
        make_learner().rollback()
