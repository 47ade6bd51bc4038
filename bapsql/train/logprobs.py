"""Memory-bounded token logprobs: the LM head and log-softmax applied a chunk of positions at a time. Pure (torch).

The learner needs ``log p(target_n | context_n)`` at ``N`` positions. The plain way materialises the logits ``[N, V]``
(and, under autograd, their float32 copy, the log-softmax and its gradient): at a 151,936-token vocabulary and the
L budget's 8k-token episodes that is several GiB per copy. `chunked_token_logprobs` computes the same values from
the final hidden states ``[N, H]`` and the head's weight ``[V, H]`` ``chunk`` positions at a time; under autograd
each chunk is checkpointed (`torch.utils.checkpoint`), so only its inputs are kept and the backward pass recomputes
one ``[chunk, V]`` block at a time. Peak memory is ``O(chunk · V)`` instead of ``O(N · V)`` (a chunk costs about
four ``[chunk, V]`` float32 blocks at its peak: logits, the exponentials of the log-sum-exp, and their gradients;
`auto_chunk` sizes chunks by the vocabulary).

Per position ``n``::

    z_n   = (W h_n + b) / T                      # logits at temperature T, [V]
    lp_n  = z_n[t_n] − logsumexp(z_n)            # float32

Shapes: ``hidden`` ``[N, H]``, ``weight`` ``[V, H]``, ``bias`` ``[V]`` or None, ``targets`` ``[N]`` (int64) →
``[N]`` float32. `reference_token_logprobs` is the plain full-logits computation, for tests and benchmarks.
"""

from __future__ import annotations

from typing import Any

DEFAULT_CHUNK = 1024
CHUNK_LOGITS = 1 << 25  # logits per chunk when sized automatically: 128 MiB of float32


def auto_chunk(vocab: int) -> int:
    """Positions per chunk so one chunk's float32 logits take ``CHUNK_LOGITS`` entries (≈ 220 positions at a
    151,936-token vocabulary, 4,096 at 8,192): a chunk's forward + recomputed backward then peaks at a few hundred
    MiB whatever the sequence length."""
    return max(16, CHUNK_LOGITS // max(1, vocab))


def _chunk_logprobs(hidden: Any, weight: Any, bias: Any, targets: Any, temperature: float) -> Any:
    """Logprobs ``[c]`` of ``targets`` ``[c]`` from ``hidden`` ``[c, H]`` (one block of logits, float32)."""
    import torch

    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets[:, None]).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def chunked_token_logprobs(hidden: Any, weight: Any, targets: Any, *, bias: Any = None, temperature: float = 1.0,
                           chunk: int = DEFAULT_CHUNK) -> Any:
    """Per-position logprobs ``[N]`` (float32) of ``targets`` under the head ``(weight, bias)`` at ``temperature``,
    computed ``chunk`` positions at a time (see the module docstring). Differentiable in ``hidden`` (and in
    ``weight`` / ``bias`` when they require grad) with ``O(chunk · V)`` peak memory."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if hidden.dim() != 2 or targets.dim() != 1 or hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"need hidden [N, H] and targets [N], got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must be [V, {hidden.shape[1]}], got {tuple(weight.shape)}")
    if chunk < 1 or not temperature > 0:
        raise ValueError(f"chunk must be >= 1 and temperature > 0, got {chunk}, {temperature}")
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad))
    parts = []
    for lo in range(0, hidden.shape[0], chunk):
        h, t = hidden[lo:lo + chunk], targets[lo:lo + chunk]
        if grad:
            parts.append(checkpoint(_chunk_logprobs, h, weight, bias, t, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(h, weight, bias, t, temperature))
    if not parts:
        return torch.zeros(0, dtype=torch.float32, device=hidden.device)
    return torch.cat(parts)


def reference_token_logprobs(hidden: Any, weight: Any, targets: Any, *, bias: Any = None,
                             temperature: float = 1.0) -> Any:
    """The plain computation: all ``[N, V]`` logits at once, then ``log_softmax`` and a gather. Same shapes."""
    import torch

    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
