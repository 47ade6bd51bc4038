"""GRPO math (DESIGN §5): group-relative advantages and the token-level clipped policy-gradient loss. Pure.

Advantages (numpy): for trajectory ``i`` of group ``g``, ``A_i = (R_i − mean_g R) / (std_g R + eps)`` (``scale =
"std"``; std is the unbiased sample std, as TRL / verl compute it; a group of one has std 0) or ``A_i = R_i − mean_g
R`` (``scale = "none"``, Dr. GRPO). Groups whose rewards are all equal get zero advantages.

Loss (torch tensors, used by the learner; no torch import is needed here because only tensor methods are used).
Per policy token ``t`` of sequence ``b`` (``mask[b, t] = 1`` exactly on sampled tokens, 0 on prompt/observation)::

    ratio  = exp(logp − old)                                   # PPO ratio vs the rollout-time learner policy
    w      = min(exp(old − engine), is_cap)   (no gradient)    # truncated importance correction (TIS) for the
                                                               # engine-vs-learner logprob mismatch
    pg     = −w · min(ratio·A_b, clip(ratio, 1 − clip_low, 1 + clip_high)·A_b)
    kl     = exp(ref − logp) − (ref − logp) − 1                # k3 estimator, only when kl_coef > 0
    loss   = Σ_{b,t} mask·(pg + kl_coef·kl) / normalizer       # token-level mean ("token-mean", DAPO)

``old`` is the learner's logprob under the weights that produced the rollouts; when it is not given (one optimizer
step per rollout batch, the default) it is ``logp.detach()``, so the ratio is 1 in value and the product
``w · ratio`` equals the ratio of the learner to the behaviour (engine) policy truncated at ``is_cap``.
``normalizer`` defaults to the number of policy tokens in the tensors given; with gradient accumulation pass the
token count of the whole effective batch so micro-batches add up to the full-batch loss.

Shapes: ``logp``, ``engine_logp``, ``old_logp``, ``ref_logp``, ``mask``: ``[B, T]``; ``advantages``: ``[B]``.

Stale rollouts (``grpo.max_staleness: k``, `bapsql.train.loop.overlap`): a group sampled by policy version ``v`` is
trained by the learner at version ``u`` (``u − v ≤ k``). ``engine`` then holds the *behaviour* policy's logprobs
(version ``v``, stored with the trajectory) and ``old`` the current policy's, so ``w`` is the truncated importance
weight ``min(π_u / π_v, is_cap)`` per token — the same formula as the engine-vs-learner correction, which it
subsumes. `importance_weights` is that weight as a pure numpy function (the reference the loss is tested against,
and the statistics the loop logs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np

from bapsql.errors import ConfigError

AdvantageScale = Literal["std", "none"]


@dataclass(frozen=True)
class LossConfig:
    """Knobs of the policy loss (see the module docstring). ``is_cap`` ≤ 0 disables the importance correction."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    is_cap: float = 2.0
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ConfigError(f"grpo clip range must satisfy 0 <= clip_low < 1 and clip_high >= 0, got "
                              f"{self.clip_low}, {self.clip_high}")
        if self.kl_coef < 0:
            raise ConfigError(f"grpo.kl_coef: must be >= 0, got {self.kl_coef}")


@dataclass(frozen=True)
class LossStats:
    """Token-weighted statistics of one loss evaluation (plain floats, summed by the learner over micro-batches).

    ``tokens``: policy tokens; the other fields are *sums* over those tokens (divide by ``tokens`` for means)."""

    tokens: float
    clipped: float  # tokens whose clipped term was active (the gradient is cut)
    is_weight: float  # Σ w
    is_truncated: float  # tokens with exp(old − engine) > is_cap
    mismatch: float  # Σ |old − engine|: engine-vs-learner logprob mismatch
    kl: float  # Σ k3(ref, logp), 0 without a reference
    pg: float  # Σ pg term (unnormalized)
    is_weight_max: float = 0.0  # max over tokens of the untruncated weight exp(old − engine) (a max, not a sum)


def group_advantages(rewards: np.ndarray, groups: np.ndarray, *, scale: AdvantageScale = "std",
                     eps: float = 1e-6) -> np.ndarray:
    """Group-relative advantages ``[N]`` for rewards ``[N]`` with group ids ``[N]`` (see the module docstring)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(groups)
    if rewards.shape != groups.shape or rewards.ndim != 1:
        raise ValueError(f"rewards and groups must both be [N], got {rewards.shape} and {groups.shape}")
    if scale not in ("std", "none"):
        raise ConfigError(f"advantage scale must be 'std' or 'none', got {scale!r}")
    out = np.zeros_like(rewards)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        r = rewards[idx]
        centered = r - r.mean()
        if scale == "std":
            std = r.std(ddof=1) if len(r) > 1 else 0.0
            centered = centered / (std + eps)
        out[idx] = centered
    return out


def policy_loss(logp: Any, engine_logp: Any, advantages: Any, mask: Any, cfg: LossConfig = LossConfig(), *,
                old_logp: Any = None, ref_logp: Any = None, normalizer: float | None = None) -> tuple[Any, LossStats]:
    """The token-level clipped policy-gradient loss (a scalar tensor with grad through ``logp``) and its stats.

    ``logp`` ``[B, T]`` (with grad), ``engine_logp`` ``[B, T]``, ``advantages`` ``[B]``, ``mask`` ``[B, T]``
    (0/1, any dtype), optional ``old_logp`` / ``ref_logp`` ``[B, T]``; see the module docstring."""
    if logp.shape != engine_logp.shape or logp.shape != mask.shape or advantages.shape != logp.shape[:1]:
        raise ValueError(f"shape mismatch: logp {tuple(logp.shape)}, engine_logp {tuple(engine_logp.shape)}, "
                         f"mask {tuple(mask.shape)}, advantages {tuple(advantages.shape)}")
    m = mask.to(logp.dtype)
    old = logp.detach() if old_logp is None else old_logp.to(logp.dtype)
    adv = advantages.to(logp.dtype)[:, None]
    ratio = (logp - old).exp()
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
    surrogate = unclipped.minimum(clipped)
    log_w = (old - engine_logp.to(logp.dtype)).detach()
    if cfg.is_cap > 0:
        raw_w = log_w.exp()
        w = raw_w.clamp(max=cfg.is_cap)
    else:
        raw_w = w = log_w * 0 + 1
    pg = -w * surrogate
    total = pg
    kl = None
    if cfg.kl_coef > 0:
        if ref_logp is None:
            raise ConfigError("kl_coef > 0 needs reference logprobs")
        d = ref_logp.to(logp.dtype) - logp
        kl = d.exp() - d - 1.0
        total = total + cfg.kl_coef * kl
    tokens = float(m.sum())
    denom = float(normalizer) if normalizer is not None else max(tokens, 1.0)
    loss = (total * m).sum() / denom
    with_grad_cut = ((clipped < unclipped) & (m > 0)).to(logp.dtype)
    stats = LossStats(
        tokens=tokens,
        clipped=float(with_grad_cut.sum()),
        is_weight=float((w * m).sum()),
        is_truncated=float(((raw_w > cfg.is_cap) & (m > 0)).sum()) if cfg.is_cap > 0 else 0.0,
        mismatch=float((log_w.abs() * m).sum()),
        kl=float((kl.detach() * m).sum()) if kl is not None else 0.0,
        pg=float((pg.detach() * m).sum()),
        is_weight_max=float((log_w.exp() * m).max()) if tokens else 0.0,
    )
    return loss, stats


def sum_stats(stats: list[LossStats]) -> LossStats:
    """Field-wise sum of micro-batch stats (``is_weight_max``: the maximum)."""
    if not stats:
        return LossStats(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return LossStats(*(max(getattr(s, f) for s in stats) if f == "is_weight_max" else
                       sum(getattr(s, f) for s in stats) for f in LossStats.__dataclass_fields__))


@dataclass(frozen=True)
class ImportanceWeights:
    """Per-token truncated importance weights and their statistics over the masked tokens.

    ``weights`` ``[B, T]``: ``min(exp(current − behaviour), cap)`` on mask-1 tokens, 0 elsewhere (1 on mask-1
    tokens when ``cap`` ≤ 0: no correction). ``mean`` / ``max`` / ``min`` are of the *untruncated* ratio
    ``exp(current − behaviour)`` except ``mean_truncated`` (of ``weights``); ``truncated_share`` is the share of
    masked tokens whose ratio exceeded ``cap``. All statistics are 0 (``min`` 1) when no token is masked."""

    weights: np.ndarray
    tokens: int
    mean: float
    mean_truncated: float
    max: float
    min: float
    truncated_share: float

    def metrics(self, prefix: str = "importance/") -> dict[str, float]:
        return {f"{prefix}ratio_mean": self.mean, f"{prefix}weight_mean": self.mean_truncated,
                f"{prefix}ratio_max": self.max, f"{prefix}ratio_min": self.min,
                f"{prefix}truncated_share": self.truncated_share, f"{prefix}tokens": float(self.tokens)}


def importance_weights(current_logp: np.ndarray, behaviour_logp: np.ndarray, mask: np.ndarray, *,
                       cap: float) -> ImportanceWeights:
    """Truncated importance weights of tokens sampled by a behaviour policy and trained under the current one.

    ``current_logp`` ``[B, T]``: the current (learner) policy's logprob of each token; ``behaviour_logp`` ``[B, T]``:
    the logprob the sampling engine recorded (the policy version that sampled it); ``mask`` ``[B, T]`` (0/1): the
    tokens the loss covers. Returns `ImportanceWeights` (weights ``[B, T]`` and statistics); the weights equal
    `policy_loss`'s ``w`` for ``old = current``. When behaviour and current coincide every masked weight is 1."""
    cur = np.asarray(current_logp, dtype=np.float64)
    beh = np.asarray(behaviour_logp, dtype=np.float64)
    m = np.asarray(mask, dtype=bool)
    if cur.shape != beh.shape or cur.shape != m.shape or cur.ndim != 2:
        raise ValueError(f"current, behaviour and mask must all be [B, T], got {cur.shape}, {beh.shape}, {m.shape}")
    ratio = np.exp(cur - beh)
    w = np.where(m, np.minimum(ratio, cap) if cap > 0 else 1.0, 0.0)
    n = int(m.sum())
    if n == 0:
        return ImportanceWeights(w, 0, 0.0, 0.0, 0.0, 1.0, 0.0)
    r = ratio[m]
    return ImportanceWeights(w, n, float(r.mean()), float(w[m].mean()), float(r.max()), float(r.min()),
                             float((r > cap).mean()) if cap > 0 else 0.0)


def policy_drift(policy_logp: Sequence[np.ndarray], ref_logp: Sequence[np.ndarray],
                 masks: Sequence[Sequence[int]]) -> dict[str, float]:
    """How far the policy moved from the reference (the SFT model), on tokens the policy sampled.

    Per sample ``i``: ``policy_logp[i]``, ``ref_logp[i]`` and ``masks[i]`` are ``[T_i]``; over masked tokens with
    ``d = ref − policy``: ``kl_k1 = mean(−d)`` (the plain estimate of KL(policy ‖ ref)) and ``kl_k3 =
    mean(exp(d) − d − 1)`` (non-negative, lower variance). Zeros when no token is masked."""
    d = np.concatenate([np.asarray(r, np.float64)[np.asarray(m, bool)] - np.asarray(p, np.float64)[np.asarray(m, bool)]
                        for p, r, m in zip(policy_logp, ref_logp, masks)] or [np.zeros(0)])
    if d.size == 0:
        return {"drift/kl_k1": 0.0, "drift/kl_k3": 0.0}
    return {"drift/kl_k1": float(np.mean(-d)), "drift/kl_k3": float(np.mean(np.expm1(d) - d))}
