"""Several optimizer steps per GRPO update (bapsql.train.learner.minibatch): the plan, the metrics, and the learner's
steps against the one-step update and the PPO clip."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bapsql.errors import ConfigError
from bapsql.train.algo.grpo import LossConfig, LossStats
from bapsql.train.learner.core import Sample, UpdateMetrics
from bapsql.train.learner.minibatch import combine_metrics, grpo_steps, minibatch_plan


def slow_plan(n, mini_batches, epochs, rng):
    """Reference: one permutation per epoch, dealt into parts of sizes ceil/floor in order."""
    out = []
    parts = min(mini_batches, n)
    for _ in range(epochs):
        perm = list(rng.permutation(n))
        base, extra = divmod(n, parts)
        start = 0
        for p in range(parts):
            size = base + (1 if p < extra else 0)
            out.append(np.array(perm[start:start + size]))
            start += size
    return out


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), mini=st.integers(1, 9), epochs=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_plan_covers_every_sample_once_per_epoch(n, mini, epochs, seed):
    plan = minibatch_plan(n, mini, epochs, np.random.default_rng(seed))
    ref = slow_plan(n, mini, epochs, np.random.default_rng(seed)) if n else []
    assert len(plan) == len(ref) == (epochs * min(mini, n) if n else 0)
    for a, b in zip(plan, ref):
        np.testing.assert_array_equal(a, b)
    if n:
        per_epoch = len(plan) // epochs
        for e in range(epochs):
            chunk = plan[e * per_epoch:(e + 1) * per_epoch]
            assert sorted(np.concatenate(chunk).tolist()) == list(range(n))
            sizes = [len(c) for c in chunk]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_plan_rejects_bad_counts():
    with pytest.raises(ValueError, match="mini_batches >= 1"):
        minibatch_plan(4, 0, 1, np.random.default_rng(0))


def test_combine_metrics_sums_tokens_and_stats():
    def m(loss, tokens, clipped):
        return UpdateMetrics(loss=loss, grad_norm=2 * loss, lr=1e-3, sequences=3, tokens=tokens,
                             loss_tokens=tokens // 2, micro_batches=1, seconds=1.0,
                             stats=LossStats(tokens / 2, clipped, tokens / 2, 0, 0, 0, -loss, is_weight_max=loss))
    out = combine_metrics([m(1.0, 10, 1), m(3.0, 20, 4)], sequences=6, extra_seconds=0.5)
    assert out.loss == 2.0 and out.grad_norm == 4.0 and out.lr == 1e-3 and out.sequences == 6
    assert out.tokens == 30 and out.loss_tokens == 15 and out.micro_batches == 2 and out.seconds == 2.5
    assert out.stats.tokens == 15 and out.stats.clipped == 5 and out.stats.is_weight_max == 3.0


def test_config_rejects_zero_steps():
    from bapsql.train.config import GRPOSection

    with pytest.raises(ConfigError, match="grpo.epochs and grpo.mini_batches"):
        GRPOSection(mini_batches=0)


# -------------------------------------------------------------------------------------------- with the learner
def _batch(learner, n=6, length=24, prompt=12, seed=0):
    rng = np.random.default_rng(seed)
    raw = []
    for i in range(n):
        ids = tuple(int(x) for x in rng.integers(100, 8000, size=length))
        raw.append(Sample(ids, tuple([0] * prompt + [1] * (length - prompt))))
    lps = learner.token_logprobs(raw)
    adv = [1.0, -1.0] * (n // 2)
    return [Sample(s.input_ids, s.loss_mask, tuple(lp), a) for s, lp, a in zip(raw, lps, adv)]


def test_one_step_is_the_plain_update(make_learner):
    pytest.importorskip("torch")
    a, b = make_learner(lr=5e-3), make_learner(lr=5e-3)
    batch = _batch(a)
    ma = a.grpo_update(batch, LossConfig())
    mb = grpo_steps(b, batch, LossConfig(), epochs=1, mini_batches=1)
    assert ma.loss == pytest.approx(mb.loss, rel=1e-6) and b.step == 1
    for k, v in a.adapter_state().items():
        np.testing.assert_allclose(v.numpy(), b.adapter_state()[k].numpy(), atol=1e-7)


def test_old_logprobs_equal_to_the_current_ones_change_nothing(make_learner):
    """Given the learner's own current logprobs as ``old``, the first step is the plain one (ratio 1, same grad)."""
    pytest.importorskip("torch")
    a, b = make_learner(lr=5e-3), make_learner(lr=5e-3)
    batch = _batch(a)
    old = b.token_logprobs(batch, masked_only=True)
    a.grpo_update(batch, LossConfig())
    b.grpo_update(batch, LossConfig(), old_logprobs=old)
    for k, v in a.adapter_state().items():
        np.testing.assert_allclose(v.numpy(), b.adapter_state()[k].numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="one logprob per token"):
        b.grpo_update(batch, LossConfig(), old_logprobs=[o[:-1] for o in old])


def test_several_steps_move_the_policy_further_and_the_clip_holds_it(make_learner):
    """Four steps on one batch move the advantage-weighted logprob more than one; with a large lr the later steps
    meet the PPO clip (the ratio to the update's start is bounded), which a step without ``old`` never does."""
    pytest.importorskip("torch")
    one, four = make_learner(lr=2e-2), make_learner(lr=2e-2)
    batch = _batch(one)
    start = one.token_logprobs(batch)

    def gain(learner):
        now = learner.token_logprobs(batch)
        return sum(s.advantage * float(((b - a) * np.array(s.loss_mask)).sum())
                   for s, a, b in zip(batch, start, now))

    m1 = grpo_steps(one, batch, LossConfig(), epochs=1, mini_batches=1)
    m4 = grpo_steps(four, batch, LossConfig(), epochs=2, mini_batches=2, rng=np.random.default_rng(0))
    assert four.step == 4 and one.step == 1 and m4.sequences == len(batch)
    assert gain(four) > gain(one) > 0
    assert m1.stats.clipped == 0 and m4.stats.clipped > 0
    with pytest.raises(ValueError, match="need an rng"):
        grpo_steps(four, batch, LossConfig(), epochs=2)
