"""Several optimizer steps per GRPO update: PPO epochs × mini-batches over one batch of rollouts.

On a machine where rollouts cost far more than learner steps (the CPU recipe: rollout 85–96 % of an update), one
optimizer step per batch leaves the policy almost where it was: ten updates of one AdamW step each moved the tiny
model's policy by ≤ 0.014 nats per token. ``grpo.epochs: E`` and ``grpo.mini_batches: M`` reuse each batch for
``E · M`` optimizer steps, as PPO does (verl's ``ppo_epochs`` / ``ppo_mini_batch_size``, TRL's
``num_iterations``):

1. the learner scores every sampled token once, before the first step: ``old`` ``[T]`` per sample (its logprob
   under the weights that start the update, at the sampling temperature, no dropout);
2. each epoch shuffles the samples (seeded per update, so a resumed run takes the same steps) and cuts them into
   ``M`` mini-batches of nearly equal size (`minibatch_plan`);
3. each mini-batch is one `Learner.grpo_update` with ``old`` given: ``ratio = exp(logp − old)`` is the PPO ratio
   that the clip range bounds (so later steps cannot push a token far from where the update started), and the
   truncated importance weight ``min(exp(old − engine), is_cap)`` corrects for the engine (or, pipelined, an older
   policy version) having sampled the tokens.

``E = M = 1`` is exactly the one-step update (``old`` is then ``logp.detach()`` inside the loss). Advantages are
computed per group before any of this, so a mini-batch may hold parts of several groups.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from bapsql.train.algo.grpo import LossConfig, sum_stats
from bapsql.train.learner.core import Sample, UpdateMetrics


def minibatch_plan(n: int, mini_batches: int, epochs: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The optimizer steps of one update over ``n`` samples: ``epochs · min(mini_batches, n)`` index arrays. Each
    epoch is a fresh permutation of ``range(n)`` cut into contiguous parts whose sizes differ by at most one, so
    every sample is in exactly one mini-batch per epoch."""
    if n < 0 or mini_batches < 1 or epochs < 1:
        raise ValueError(f"need n >= 0, mini_batches >= 1 and epochs >= 1, got {n}, {mini_batches}, {epochs}")
    if n == 0:
        return []
    parts = min(mini_batches, n)
    return [part for _ in range(epochs) for part in np.array_split(rng.permutation(n), parts)]


def combine_metrics(steps: Sequence[UpdateMetrics], *, sequences: int, extra_seconds: float = 0.0) -> UpdateMetrics:
    """One `UpdateMetrics` for the optimizer steps of an update: mean loss and pre-clip gradient norm over the
    steps, the first step's lr, token counts, micro-batches, seconds (plus ``extra_seconds``: scoring ``old``) and
    loss statistics summed over the steps (so per-token means such as the clip fraction are over every step's
    tokens)."""
    if not steps:
        raise ValueError("no optimizer steps to combine")
    stats = [s.stats for s in steps if s.stats is not None]
    return UpdateMetrics(
        loss=float(np.mean([s.loss for s in steps])), grad_norm=float(np.mean([s.grad_norm for s in steps])),
        lr=steps[0].lr, sequences=sequences, tokens=sum(s.tokens for s in steps),
        loss_tokens=sum(s.loss_tokens for s in steps), micro_batches=sum(s.micro_batches for s in steps),
        seconds=sum(s.seconds for s in steps) + extra_seconds, stats=sum_stats(stats) if stats else None)


def grpo_steps(learner: Any, samples: Sequence[Sample], loss_cfg: LossConfig, *, epochs: int = 1,
               mini_batches: int = 1, rng: np.random.Generator | None = None) -> UpdateMetrics:
    """The optimizer steps of one GRPO update (see the module docstring) on a `Learner` or a `RemoteLearner`;
    returns their combined metrics (`combine_metrics`). ``rng`` shuffles the mini-batches (needed when more than
    one step is taken)."""
    if epochs * mini_batches == 1:
        return learner.grpo_update(samples, loss_cfg)
    if rng is None:
        raise ValueError("grpo_steps: several optimizer steps need an rng for the mini-batch order")
    t0 = time.perf_counter()
    old = learner.token_logprobs(samples, masked_only=True)
    scored = time.perf_counter() - t0
    steps = [learner.grpo_update([samples[i] for i in idx], loss_cfg, old_logprobs=[old[i] for i in idx])
             for idx in minibatch_plan(len(samples), mini_batches, epochs, rng)]
    return combine_metrics(steps, sequences=len(samples), extra_seconds=scored)
