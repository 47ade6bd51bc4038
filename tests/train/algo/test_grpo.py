"""GRPO math against slow reference loops."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.train.algo.grpo import LossConfig, group_advantages, policy_loss, sum_stats

torch = pytest.importorskip("torch")


def ref_advantages(rewards, groups, scale, eps):
    out = []
    for i, r in enumerate(rewards):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i]]
        mean = sum(members) / len(members)
        if scale == "none":
            out.append(r - mean)
            continue
        var = sum((x - mean) ** 2 for x in members) / (len(members) - 1) if len(members) > 1 else 0.0
        out.append((r - mean) / (math.sqrt(var) + eps))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1.4)), min_size=1, max_size=24),
       st.sampled_from(["std", "none"]))
def test_group_advantages_match_reference(items, scale):
    groups = [g for g, _ in items]
    rewards = [r for _, r in items]
    got = group_advantages(np.array(rewards), np.array(groups), scale=scale)
    np.testing.assert_allclose(got, ref_advantages(rewards, groups, scale, 1e-6), rtol=1e-9, atol=1e-9)


def test_equal_rewards_give_zero_advantage():
    np.testing.assert_array_equal(group_advantages(np.ones(8), np.zeros(8)), np.zeros(8))


def ref_loss(logp, engine, adv, mask, cfg, old=None, ref=None):
    B, T = len(logp), len(logp[0])
    total, tokens = 0.0, 0
    for b in range(B):
        for t in range(T):
            if not mask[b][t]:
                continue
            o = logp[b][t] if old is None else old[b][t]
            ratio = math.exp(logp[b][t] - o)
            w = min(math.exp(o - engine[b][t]), cfg.is_cap)
            surr = min(ratio * adv[b], min(max(ratio, 1 - cfg.clip_low), 1 + cfg.clip_high) * adv[b])
            term = -w * surr
            if cfg.kl_coef > 0:
                d = ref[b][t] - logp[b][t]
                term += cfg.kl_coef * (math.exp(d) - d - 1)
            total += term
            tokens += 1
    return total / max(tokens, 1)


def ref_loss_grad(logp, engine, adv, mask, cfg, old=None, ref=None, h=1e-6):
    """Central finite differences of the reference loss w.r.t. logp (old fixed, as the reference semantics)."""
    frozen_old = [row[:] for row in logp] if old is None else old
    grads = [[0.0] * len(logp[0]) for _ in logp]
    for b in range(len(logp)):
        for t in range(len(logp[0])):
            up = [row[:] for row in logp]
            dn = [row[:] for row in logp]
            up[b][t] += h
            dn[b][t] -= h
            grads[b][t] = (ref_loss(up, engine, adv, mask, cfg, frozen_old, ref)
                           - ref_loss(dn, engine, adv, mask, cfg, frozen_old, ref)) / (2 * h)
    return grads


@pytest.mark.parametrize("use_old,kl", [(False, 0.0), (True, 0.0), (True, 0.1), (False, 0.05)])
def test_policy_loss_matches_reference_loop_value_and_gradient(use_old, kl):
    g = torch.Generator().manual_seed(0)
    B, T = 4, 7
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    engine = logp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    old = logp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4 if use_old else None
    ref = logp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.tensor([1.5, -0.7, 0.0, 0.3], dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).to(torch.int64)
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, is_cap=1.5, kl_coef=kl)
    loss, stats = policy_loss(logp, engine, adv, mask, cfg, old_logp=old, ref_logp=ref if kl else None)
    L = lambda x: x.tolist()  # noqa: E731
    want = ref_loss(L(logp), L(engine), L(adv), L(mask), cfg, L(old) if old is not None else None, L(ref))
    assert loss.item() == pytest.approx(want, rel=1e-10, abs=1e-12)
    loss.backward()
    want_grad = ref_loss_grad(L(logp), L(engine), L(adv), L(mask), cfg, L(old) if old is not None else None,
                              L(ref))
    np.testing.assert_allclose(logp.grad.numpy(), np.array(want_grad), rtol=1e-5, atol=1e-7)
    assert stats.tokens == float(mask.sum())
    # gradients never flow through masked tokens
    assert torch.all(logp.grad[mask == 0] == 0)


def test_on_policy_gradient_is_advantage_weighted_score():
    # one step per batch, no engine mismatch: grad = -A * w / N on each policy token
    logp = torch.full((2, 3), -1.0, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, LossConfig())
    loss.backward()
    np.testing.assert_allclose(logp.grad.numpy(), [[-2 / 3, -2 / 3, 0], [1 / 3, 0, 0]])
    assert stats.is_weight == pytest.approx(3.0) and stats.mismatch == 0.0


def test_importance_weight_truncates_and_normalizer_splits_microbatches():
    logp = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    engine = torch.tensor([[-5.0, 0.0], [0.0, 0.0]], dtype=torch.float64)  # first token: engine far less likely
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    cfg = LossConfig(is_cap=2.0)
    full, st_full = policy_loss(logp, engine, adv, mask, cfg)
    assert st_full.is_truncated == 1.0 and st_full.is_weight == pytest.approx(2.0 + 3.0)
    parts = [policy_loss(logp[i:i + 1], engine[i:i + 1], adv[i:i + 1], mask[i:i + 1], cfg, normalizer=4.0)
             for i in range(2)]
    assert sum(p[0] for p in parts).item() == pytest.approx(full.item())
    assert sum_stats([p[1] for p in parts]) == st_full


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))


def ref_drift(policy, ref, masks):
    d1, d3, n = 0.0, 0.0, 0
    for p, r, m in zip(policy, ref, masks):
        for a, b, k in zip(p, r, m):
            if k:
                d = b - a
                d1 += -d
                d3 += math.exp(d) - d - 1
                n += 1
    return (d1 / n, d3 / n) if n else (0.0, 0.0)


@given(st.lists(st.lists(st.tuples(st.floats(-8, 0), st.floats(-8, 0), st.integers(0, 1)), min_size=1, max_size=6),
                min_size=1, max_size=4))
@settings(max_examples=80)
def test_policy_drift_matches_reference_and_k3_is_nonnegative(seqs):
    from bapsql.train.algo.grpo import policy_drift

    policy = [np.array([a for a, _, _ in s]) for s in seqs]
    ref = [np.array([b for _, b, _ in s]) for s in seqs]
    masks = [[k for _, _, k in s] for s in seqs]
    out = policy_drift(policy, ref, masks)
    k1, k3 = ref_drift(policy, ref, masks)
    assert out["drift/kl_k1"] == pytest.approx(k1, abs=1e-9) and out["drift/kl_k3"] == pytest.approx(k3, abs=1e-9)
    assert out["drift/kl_k3"] >= 0
    assert policy_drift(policy, policy, masks)["drift/kl_k3"] == 0.0


# ------------------------------------------------------------------------------------- importance weights (stale)
def ref_importance(current, behaviour, mask, cap):
    """Slow reference: one token at a time."""
    w = [[0.0] * len(current[0]) for _ in current]
    ratios = []
    for b in range(len(current)):
        for t in range(len(current[0])):
            if mask[b][t]:
                r = math.exp(current[b][t] - behaviour[b][t])
                ratios.append(r)
                w[b][t] = min(r, cap) if cap > 0 else 1.0
    return w, ratios


logprob_grid = st.integers(1, 4).flatmap(lambda b: st.integers(1, 6).flatmap(lambda t: st.tuples(
    st.lists(st.lists(st.floats(-8, 0), min_size=t, max_size=t), min_size=b, max_size=b),
    st.lists(st.lists(st.floats(-8, 0), min_size=t, max_size=t), min_size=b, max_size=b),
    st.lists(st.lists(st.integers(0, 1), min_size=t, max_size=t), min_size=b, max_size=b))))


@settings(max_examples=150, deadline=None)
@given(logprob_grid, st.sampled_from([0.0, 1.5, 2.0, 5.0]))
def test_importance_weights_match_the_reference_loop(grid, cap):
    from bapsql.train.algo.grpo import importance_weights

    cur, beh, mask = grid
    got = importance_weights(np.array(cur), np.array(beh), np.array(mask), cap=cap)
    want, ratios = ref_importance(cur, beh, mask, cap)
    np.testing.assert_allclose(got.weights, want, rtol=1e-12, atol=0)
    assert got.tokens == len(ratios)
    if ratios:
        assert got.mean == pytest.approx(sum(ratios) / len(ratios), rel=1e-9)
        assert got.max == pytest.approx(max(ratios), rel=1e-12) and got.min == pytest.approx(min(ratios), rel=1e-12)
        assert got.truncated_share == (sum(r > cap for r in ratios) / len(ratios) if cap > 0 else 0.0)


@settings(max_examples=100, deadline=None)
@given(logprob_grid, st.sampled_from([0.0, 1.0, 2.0]))
def test_importance_weights_are_one_when_behaviour_is_the_current_policy(grid, cap):
    from bapsql.train.algo.grpo import importance_weights

    cur, _, mask = grid
    got = importance_weights(np.array(cur), np.array(cur), np.array(mask), cap=cap)
    m = np.array(mask, dtype=bool)
    assert np.all(got.weights[m] == 1.0) and np.all(got.weights[~m] == 0.0)
    assert got.truncated_share == 0.0 and (got.tokens == 0 or got.mean == got.max == got.min == 1.0)


def test_the_loss_applies_exactly_the_importance_weights():
    """policy_loss's per-token weight is importance_weights(current = learner, behaviour = engine): stale rollouts
    (engine logprobs of an older policy) are corrected by the same truncated ratio."""
    from bapsql.train.algo.grpo import importance_weights

    g = torch.Generator().manual_seed(3)
    B, T = 3, 9
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    behaviour = logp - torch.randn(B, T, generator=g, dtype=torch.float64)  # an older policy, ratio up to ~e^3
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    cfg = LossConfig(is_cap=2.0)
    loss, stats = policy_loss(logp.clone().requires_grad_(True), behaviour, adv, mask, cfg)
    iw = importance_weights(logp.numpy(), behaviour.numpy(), mask.numpy(), cap=cfg.is_cap)
    assert stats.is_weight == pytest.approx(iw.weights.sum(), rel=1e-12)
    assert stats.is_truncated == pytest.approx(iw.truncated_share * iw.tokens)
    assert stats.is_weight_max == pytest.approx(iw.max, rel=1e-12)
    # ratio = 1 in value (one optimizer step per batch): loss = −Σ w·A / tokens
    want = -(iw.weights * adv.numpy()[:, None]).sum() / iw.tokens
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
