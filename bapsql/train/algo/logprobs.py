"""Memory-bounded token logprobs under the sampler's distribution: the LM head, the top-k / top-p nucleus and the
log-softmax applied a chunk of positions at a time. Pure (torch).

The learner needs ``log π(target_n | context_n)`` at ``N`` positions, where ``π`` is the distribution the engine
sampled from: logits at temperature ``T``, truncated to the top-k / top-p nucleus and renormalised over it (vLLM's
``processed_logprobs``, the HF engine's `_pick`). The plain way materialises the logits ``[N, V]`` (and, under
autograd, their float32 copy, the log-softmax and its gradient): at a 151,936-token vocabulary and the L budget's
8k-token episodes that is several GiB per copy. `chunked_token_logprobs` computes the same values from the final
hidden states ``[N, H]`` and the head's weight ``[V, H]`` ``chunk`` positions at a time; under autograd each chunk
is checkpointed (`torch.utils.checkpoint`), so only its inputs are kept and the backward pass recomputes one
``[chunk, V]`` block at a time. Peak memory is ``O(chunk · V)`` instead of ``O(N · V)`` (a chunk costs about four
``[chunk, V]`` float32 blocks at its peak: logits, the exponentials of the log-sum-exp, and their gradients; with a
nucleus also a ``[chunk, V]`` bool mask, the masked logits, and a sort of at most ``SORT_LOGITS`` logits at a time;
`auto_chunk` sizes chunks by the vocabulary).

Finding the nucleus does not sort the vocabulary when it need not: the boundary comes from the row's largest logits
(``torch.topk`` prefixes of `NUCLEUS_PREFIXES` entries, each settling the rows whose top-p mass is reached inside it;
the rest fall back to a full sort), and a checkpointed chunk keeps its boundary (``O(chunk)`` values) for the
backward pass's recompute of the same logits. On SmolLM2 (49,152 tokens) at top-p 0.95 the sort cost about 5× the
LM head per position and the recompute doubled it: the GRPO learner ran at 0.52× a bare forward + backward.

Per position ``n`` (``s`` = ``z_n`` sorted descending, ``p = softmax(s)``)::

    z_n   = (W h_n + b) / T                                   # logits at temperature T, [V]
    K_n   = {v : z_n[v] >= s[k−1]}            (top_k = k > 0; all V when top_k is 0 / None or >= V)
    m_n   = #{i : s_i in K_n  and  Σ_{j<i} p'_j < top_p}     # p' = softmax over K_n; always >= 1 (the top token)
    τ_n   = s[m_n − 1]                                        # the smallest logit kept
    N_n   = m_n tokens of largest logit (t_n among them if z_n[t_n] = τ_n), plus t_n if z_n[t_n] < τ_n  (a mask)
    lp_n  = z_n[t_n] − logsumexp_{v ∈ N_n} z_n[v]             # float32; the gradient flows through kept logits

``top_p = 1`` and ``top_k = 0`` give the full softmax (``N_n`` = the vocabulary). Shapes: ``hidden`` ``[N, H]``,
``weight`` ``[V, H]``, ``bias`` ``[V]`` or None, ``targets`` ``[N]`` (int64) → ``[N]`` float32;
`nucleus_logprobs` takes the logits ``[N, V]`` (already divided by T) instead. `reference_token_logprobs` is the
plain full-logits computation, for tests and benchmarks.

The nucleus is the engines' (vLLM's ``apply_top_k_top_p``, the HF engine's mask): top-k keeps every token whose
logit reaches the k-th largest (ties at the k-th value all stay, as in vLLM); top-p keeps, in descending order, each
token whose preceding mass (over the top-k set) is below ``top_p`` — the same set as vLLM's "drop the ascending
prefix whose cumulative mass is ≤ 1 − top_p, always keep the largest". Both engines cut a group of equal logits at
the top-p boundary by sort position, which is arbitrary, but the *count* ``m_n`` and so the nucleus mass depend
only on the sorted values: here the nucleus holds the tokens above ``τ_n`` plus as many tokens at ``τ_n`` as make
``m_n``, and a target at ``τ_n`` counts as inside (the engine could have sampled it), so the normaliser equals the
engine's whatever its sort order. Ties are common with bfloat16 logits.

The target is always in ``N_n``. A token the engine sampled is in its own nucleus, but the learner's nucleus can
differ: the policy changed since sampling (stale groups, the second and later optimizer steps of a batch, the KL
reference), or float rounding moved the boundary. Rather than −inf (a NaN loss), such a token gets
``log(p_t / (nucleus mass + p_t))`` — finite and small when the current policy would not have kept it, so the
importance weight π_learner / π_engine is ≪ 1 and the truncated weight down-weights the token, which is the
correction's purpose. When the target is inside the nucleus (every token the learner scores for the policy that
sampled it) the union changes nothing.
"""

from __future__ import annotations

from typing import Any

DEFAULT_CHUNK = 1024
CHUNK_LOGITS = 1 << 25  # logits per chunk when sized automatically: 128 MiB of float32
SORT_LOGITS = 1 << 23  # logits sorted at once to find the nucleus boundary (values, int64 indices, cumsum: ~170 MiB)
# largest logits looked at (torch.topk) before a full sort to find a top-p boundary: on agent transcripts
# SmolLM2's 0.95 nucleus holds <= 64 tokens at 61 % of positions, <= 1,024 at 81 %, and at most ~4,600; a full
# sort of its 49,152 logits per position cost ~5x the LM head on a CPU, topk(8192) a quarter of that
NUCLEUS_PREFIXES = (64, 1024, 8192)


def auto_chunk(vocab: int) -> int:
    """Positions per chunk so one chunk's float32 logits take ``CHUNK_LOGITS`` entries (≈ 220 positions at a
    151,936-token vocabulary, 4,096 at 8,192): a chunk's forward + recomputed backward then peaks at a few hundred
    MiB whatever the sequence length."""
    return max(16, CHUNK_LOGITS // max(1, vocab))


def _check_nucleus(top_p: float, top_k: int | None) -> None:
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"top_k must be an integer >= 0 (0 / None: off), got {top_k!r}")


def nucleus_active(top_p: float, top_k: int | None, vocab: int) -> bool:
    """Whether ``(top_p, top_k)`` truncates a ``vocab``-token distribution at all."""
    return top_p < 1 or bool(top_k and top_k < vocab)


def _sorted_boundary(z: Any, top_p: float, top_k: int | None) -> tuple[Any, Any, Any]:
    """`_boundary` by a full descending sort of every row (the definition; ``O(V log V)`` per row)."""
    import torch

    s, idx = torch.sort(z, dim=-1, descending=True)
    vocab = z.shape[-1]
    valid = None
    if top_k and top_k < vocab:
        valid = s >= s[:, top_k - 1:top_k]
        s = s.masked_fill(~valid, float("-inf"))
    if top_p < 1:
        p = torch.softmax(s, dim=-1)
        before = torch.cumsum(p, dim=-1).sub_(p)  # mass of the tokens sorted ahead of each one
        kept = before < top_p
        del p, before
        if valid is not None:
            kept &= valid
        m = kept.sum(-1)
    else:
        m = valid.sum(-1)
    last = (m - 1).clamp(min=0)[:, None]
    tau = s.gather(-1, last).squeeze(-1)
    above = (s > tau[:, None]).sum(-1)
    return tau, idx.gather(-1, last).squeeze(-1), m - above - 1


def _boundary(z: Any, top_p: float, top_k: int | None,
              prefixes: tuple[int, ...] | None = None) -> tuple[Any, Any, Any]:
    """For logits ``z`` ``[r, V]`` (no grad): the boundary logit ``τ`` ``[r]``, one token at ``τ`` ``[r]`` (int64)
    and how many *more* tokens at ``τ`` the nucleus holds ``[r]`` (see the module docstring).

    The nucleus count ``m`` needs only the largest logits, not a sort of the vocabulary: top-k alone is settled by
    the k-th largest logit; for top-p, ``torch.topk`` of the first of ``prefixes`` (default `NUCLEUS_PREFIXES`)
    gives the row's largest logits in descending order (the full sort's first entries), their top-p cumulative mass
    uses the softmax normaliser of the whole (top-k-masked) row, and ``m`` is settled for every row whose mass
    reaches ``top_p`` inside the prefix or whose whole top-k set fits in it. Rows left over try the next prefix,
    then the full sort (`_sorted_boundary`). Same ``τ``, count and tie count as the full sort (up to float rounding
    of the normaliser at a mass within ~1e-7 of ``top_p``); the token named at ``τ`` may be another of several
    tied ones (the sort's choice among them is arbitrary too; the nucleus mass is the same)."""
    import torch

    r, vocab = z.shape
    k_on = bool(top_k and top_k < vocab)
    if top_p >= 1:  # top-k alone (the nucleus is active): the k-th largest logit is the boundary
        vals, idx = torch.topk(z, top_k, dim=-1)
        tau = vals[:, -1]
        return tau, idx[:, -1], (z >= tau[:, None]).sum(-1) - (z > tau[:, None]).sum(-1) - 1
    prefixes = NUCLEUS_PREFIXES if prefixes is None else prefixes
    kth = torch.topk(z, top_k, dim=-1).values[:, -1:] if k_on else None  # [r, 1]
    valid_count = (z >= kth).sum(-1) if k_on else None  # [r]: the top-k set, ties with the k-th included
    lse = torch.logsumexp(z if kth is None else z.masked_fill(z < kth, float("-inf")), dim=-1)  # [r]
    tau = torch.empty(r, dtype=z.dtype, device=z.device)
    rep = torch.empty(r, dtype=torch.long, device=z.device)
    m = torch.empty(r, dtype=torch.long, device=z.device)
    todo = torch.arange(r, device=z.device)
    for width in prefixes:
        width = max(width, top_k) if k_on else width
        if width >= vocab or todo.numel() == 0:
            break
        vals, idx = torch.topk(z[todo], width, dim=-1)  # sorted descending
        valid = vals >= kth[todo] if k_on else torch.ones_like(vals, dtype=torch.bool)
        p = torch.exp(vals - lse[todo, None]).masked_fill_(~valid, 0.0)
        kept = (torch.cumsum(p, dim=-1).sub_(p) < top_p) & valid  # a prefix of the sorted row
        count = kept.sum(-1)
        settled = ~kept[:, -1]  # the mass reached top_p inside the prefix (or the top-k set ended there)
        last = (count - 1).clamp(min=0)[:, None]
        rows = todo[settled]
        tau[rows] = vals.gather(-1, last).squeeze(-1)[settled]
        rep[rows] = idx.gather(-1, last).squeeze(-1)[settled]
        m[rows] = count[settled]
        todo = todo[~settled]
    if todo.numel():
        t_tau, t_rep, t_extra = _sorted_boundary(z[todo], top_p, top_k)
        tau[todo], rep[todo] = t_tau, t_rep
        m[todo] = t_extra + 1 + (z[todo] > t_tau[:, None]).sum(-1)
    return tau, rep, m - (z > tau[:, None]).sum(-1) - 1


def nucleus_logprobs(logits: Any, targets: Any, *, top_p: float = 1.0, top_k: int | None = 0,
                     sort_rows: int | None = None, memo: list | None = None) -> Any:
    """Logprobs ``[N]`` of ``targets`` ``[N]`` under ``logits`` ``[N, V]`` (float32, already at temperature)
    renormalised over the top-k / top-p nucleus united with the target (see the module docstring). Differentiable in
    ``logits``; the nucleus itself is a mask (no gradient). ``sort_rows``: rows looked at at once to find the
    boundary (default: ``SORT_LOGITS // V``). ``memo``: a list that keeps the boundary (``τ``, the token at ``τ``,
    the tie count; ``O(N)``) — empty, it is filled; filled, it is used instead of finding the boundary again. A
    checkpointed chunk passes one, so the backward pass's recompute of the same logits does not redo that work."""
    import torch

    _check_nucleus(top_p, top_k)
    picked = logits.gather(-1, targets[:, None]).squeeze(-1)
    n, vocab = logits.shape
    if not nucleus_active(top_p, top_k, vocab) or n == 0:
        return picked - torch.logsumexp(logits, dim=-1)
    rows = sort_rows or max(1, SORT_LOGITS // max(1, vocab))
    with torch.no_grad():
        z = logits.detach()
        if memo:
            tau, rep, extra = memo[0]
        else:
            parts = [_boundary(z[lo:lo + rows], top_p, top_k) for lo in range(0, n, rows)]
            tau, rep, extra = (torch.cat(x) for x in zip(*parts))
            if memo is not None:
                memo.append((tau, rep, extra))
        ar = torch.arange(n, device=z.device)
        keep = z > tau[:, None]  # [N, V] bool
        keep[ar, rep] = True  # one token at the boundary value ...
        keep[ar, targets] |= picked.detach() < tau  # ... and the target when it lies outside
    lse = torch.logsumexp(logits.masked_fill(~keep, float("-inf")), dim=-1)
    # ... and the other tokens tied at the boundary that make up the count m (extra of them, each exp(τ))
    at_tau = logits.gather(-1, rep[:, None]).squeeze(-1)
    more = torch.logaddexp(lse, at_tau + torch.log(extra.clamp(min=1).to(logits.dtype)))
    return picked - torch.where(extra > 0, more, lse)


def _chunk_logprobs(hidden: Any, weight: Any, bias: Any, targets: Any, temperature: float, top_p: float,
                    top_k: int | None, memo: list | None = None) -> Any:
    """Logprobs ``[c]`` of ``targets`` ``[c]`` from ``hidden`` ``[c, H]`` (one block of logits, float32); ``memo``
    keeps the nucleus boundary between the forward pass and the checkpoint's recompute (`nucleus_logprobs`)."""
    import torch

    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if temperature != 1.0:
        logits = logits / temperature
    return nucleus_logprobs(logits, targets, top_p=top_p, top_k=top_k, memo=memo)


def _check(hidden: Any, weight: Any, targets: Any, temperature: float, top_p: float, top_k: int | None) -> None:
    if hidden.dim() != 2 or targets.dim() != 1 or hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"need hidden [N, H] and targets [N], got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must be [V, {hidden.shape[1]}], got {tuple(weight.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    _check_nucleus(top_p, top_k)


def chunked_token_logprobs(hidden: Any, weight: Any, targets: Any, *, bias: Any = None, temperature: float = 1.0,
                           top_p: float = 1.0, top_k: int | None = 0, chunk: int = DEFAULT_CHUNK) -> Any:
    """Per-position logprobs ``[N]`` (float32) of ``targets`` under the head ``(weight, bias)`` at ``temperature``,
    renormalised over the ``top_k`` / ``top_p`` nucleus (united with the target; ``top_p = 1``, ``top_k = 0``: the
    full softmax), computed ``chunk`` positions at a time (see the module docstring). Differentiable in ``hidden``
    (and in ``weight`` / ``bias`` when they require grad) with ``O(chunk · V)`` peak memory."""
    import torch
    from torch.utils.checkpoint import checkpoint

    _check(hidden, weight, targets, temperature, top_p, top_k)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad))
    parts = []
    for lo in range(0, hidden.shape[0], chunk):
        h, t = hidden[lo:lo + chunk], targets[lo:lo + chunk]
        if grad:
            parts.append(checkpoint(_chunk_logprobs, h, weight, bias, t, temperature, top_p, top_k, [],
                                    use_reentrant=False))  # the recompute reuses the forward's nucleus boundary
        else:
            parts.append(_chunk_logprobs(h, weight, bias, t, temperature, top_p, top_k))
    if not parts:
        return torch.zeros(0, dtype=torch.float32, device=hidden.device)
    return torch.cat(parts)


def reference_token_logprobs(hidden: Any, weight: Any, targets: Any, *, bias: Any = None, temperature: float = 1.0,
                             top_p: float = 1.0, top_k: int | None = 0) -> Any:
    """The plain computation: all ``[N, V]`` logits at once, the nucleus of every row in one sort, then the
    renormalised log-softmax and a gather. Same shapes and parameters as `chunked_token_logprobs`."""
    import torch

    _check(hidden, weight, targets, temperature, top_p, top_k)
    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature
    if not nucleus_active(top_p, top_k, logits.shape[-1]):
        return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    return nucleus_logprobs(logits, targets, top_p=top_p, top_k=top_k, sort_rows=max(1, logits.shape[0]))
