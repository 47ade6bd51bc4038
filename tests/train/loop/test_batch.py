"""Rollout groups → GRPO samples: rewards and advantages per group, policy-token masks, context-only masking."""

import math

import numpy as np
import pytest

from bapsql.rollout.groups import EpisodeSpec, SegmentTokens, Trajectory
from bapsql.train.algo.reward import RewardConfig
from bapsql.train.loop.batch import build_samples, group_outcome, restrict_to_actions
from bapsql.types import Task

TASK = Task("t1", "db", "/nonexistent.sqlite", "q?", "SELECT 1")


def traj(sample, correct, feasible=True, evidence=1.0, queries=1, actions=("execute_query", "answer")):
    spec = EpisodeSpec(episode_id=f"e{sample}", run="r", method="model.policy", level="XS", seed=0, sample=sample,
                       sample_seed=sample, task=TASK, group_id="g")
    # prompt (3 tokens) | completion 1 (2 tokens) | observation (2) | completion 2 (3 tokens)
    ids = tuple(range(10))
    mask = (0, 0, 0, 1, 1, 0, 0, 1, 1, 1)
    lp = tuple(-0.5 if m else 0.0 for m in mask)
    ep = {"success": correct and feasible, "correct": correct, "feasible": feasible, "evidence_score": evidence,
          "queries": queries}
    return Trajectory(spec, ep, tuple({"action": a} for a in actions), (SegmentTokens(ids, mask, lp),))


def test_group_outcome_and_samples():
    group = [traj(0, True, queries=1), traj(1, True, queries=2), traj(2, False), traj(3, True, feasible=False)]
    assert group_outcome(group) == (("t1", "XS"), 2, 4)
    samples, info = build_samples([group], RewardConfig())
    want_r = np.array([1.4, 1.4 * math.sin((4 / 3) * math.pi / 2), 0.0, 0.0])
    np.testing.assert_allclose(info.rewards, want_r)
    centered = want_r - want_r.mean()
    np.testing.assert_allclose(info.advantages, centered / (want_r.std(ddof=1) + 1e-6))
    assert [s.advantage for s in samples] == pytest.approx(list(info.advantages))
    assert all(s.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1, 1, 1) for s in samples)
    assert info.policy_tokens == 4 * 5 and info.zero_advantage_groups == 0


def test_all_equal_groups_have_zero_advantage():
    _, info = build_samples([[traj(i, True) for i in range(4)]], RewardConfig(variant="correctness"))
    assert info.zero_advantage_groups == 1 and np.all(info.advantages == 0)


def test_context_only_rl_keeps_only_listed_actions():
    t = traj(0, True, actions=("execute_query", "manage_evidence"))
    masks, aligned = restrict_to_actions(t.segments, t.turns, ("manage_evidence", "answer", "abstain"))
    assert aligned and masks == [(0, 0, 0, 0, 0, 0, 0, 1, 1, 1)]
    group = [t, traj(1, False, actions=("execute_query", "manage_evidence"))]
    samples, info = build_samples([group], RewardConfig(), trainable_actions=("manage_evidence",))
    assert info.policy_tokens == 6 and info.misaligned == 0

def test_a_context_only_trajectory_that_cannot_be_aligned_is_dropped_from_the_loss():
    """Two completions but one turn row: which tokens are the listed action's is unknown, so the trajectory must
    not be trained on whole (every token, execute_query's included); it is dropped and counted."""
    bad = traj(2, True, actions=("execute_query",))
    good = traj(3, False)
    samples, info = build_samples([[bad, good]], RewardConfig(), trainable_actions=("answer",))
    assert info.misaligned == 1
    assert len(samples) == 1 and samples[0].loss_mask == (0, 0, 0, 0, 0, 0, 0, 1, 1, 1)  # good's answer turn only
    assert info.policy_tokens == 3 and len(info.rewards) == 2  # the dropped one still counts in its group's baseline
