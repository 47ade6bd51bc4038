"""Chunked token logprobs equal the plain full-logits computation and a slow per-position loop, values and gradients,
with and without the sampler's top-p / top-k nucleus."""

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bapsql.train.algo.logprobs import chunked_token_logprobs, nucleus_logprobs, reference_token_logprobs

torch = pytest.importorskip("torch")


def _slow_loop(hidden, weight, targets, bias=None, temperature=1.0):
    """One position at a time, in float64: the definition."""
    out = []
    for n in range(hidden.shape[0]):
        z = (weight.double() @ hidden[n].double() + (bias.double() if bias is not None else 0)) / temperature
        out.append(float(z[targets[n]] - torch.logsumexp(z, dim=0)))
    return torch.tensor(out, dtype=torch.float64)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 40), h=st.integers(1, 12), v=st.integers(2, 60), chunk=st.integers(1, 50),
       temperature=st.sampled_from([0.5, 0.7, 1.0, 1.3]), with_bias=st.booleans(), seed=st.integers(0, 10_000))
def test_chunked_equals_reference_and_the_slow_loop(n, h, v, chunk, temperature, with_bias, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g) * 3
    weight = torch.randn(v, h, generator=g)
    bias = torch.randn(v, generator=g) if with_bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    got = chunked_token_logprobs(hidden, weight, targets, bias=bias, temperature=temperature, chunk=chunk)
    ref = reference_token_logprobs(hidden, weight, targets, bias=bias, temperature=temperature)
    assert got.shape == (n,) and got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.double(), _slow_loop(hidden, weight, targets, bias, temperature),
                               rtol=1e-4, atol=1e-4)
    assert bool((got <= 1e-6).all())


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 30), chunk=st.integers(1, 31), seed=st.integers(0, 10_000))
def test_gradients_match_the_reference(n, chunk, seed):
    g = torch.Generator().manual_seed(seed)
    h0 = torch.randn(n, 8, generator=g)
    weight = torch.randn(50, 8, generator=g)
    targets = torch.randint(0, 50, (n,), generator=g)
    coef = torch.randn(n, generator=g)
    grads = []
    for fn in (lambda h: chunked_token_logprobs(h, weight, targets, temperature=0.7, chunk=chunk),
               lambda h: reference_token_logprobs(h, weight, targets, temperature=0.7)):
        h = h0.clone().requires_grad_(True)
        (fn(h) * coef).sum().backward()
        grads.append(h.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        chunked_token_logprobs(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError):
        chunked_token_logprobs(torch.zeros(3, 4), torch.zeros(5, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError):
        chunked_token_logprobs(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(3, dtype=torch.long), temperature=0)


# ---------------------------------------------------------------------------------------------- the sampler's nucleus
def _slow_nucleus(z, t, top_p=1.0, top_k=0):
    """The definition, one position at a time (``z`` [V] float64 logits already at temperature): top-k keeps every
    logit >= the k-th largest; then, in descending order, a token is kept while the mass before it (over the top-k
    set) is below top_p; a target below the smallest kept logit is added. Returns the nucleus (token ids: which of
    several equal logits at the boundary are listed does not change its mass) and the smallest distance of a
    cumulative mass from top_p (a boundary that float rounding could flip)."""
    z = z.detach()
    order = sorted(range(len(z)), key=lambda v: -float(z[v]))
    if top_k and top_k < len(z):
        kth = float(z[order[top_k - 1]])
        order = [v for v in order if float(z[v]) >= kth]
    top = torch.logsumexp(z[order], dim=0)
    kept, before, margin = [], 0.0, float("inf")
    for v in order:
        if top_p < 1:
            margin = min(margin, abs(before - top_p))
        if before < top_p or top_p >= 1:
            kept.append(v)
        before += float(torch.exp(z[v] - top))
    return kept + ([t] if float(z[t]) < float(z[kept[-1]]) else []), margin


def _plain_loop(hidden, weight, targets, bias=None, temperature=1.0, top_p=1.0, top_k=0):
    """Per position: float64 logits, the nucleus, ``z[t] − logsumexp(z[nucleus])`` (differentiable in ``hidden``
    when it is float64 with grad)."""
    out, margin = [], float("inf")
    for n in range(hidden.shape[0]):
        z = (weight.double() @ hidden[n].double() + (bias.double() if bias is not None else 0)) / temperature
        nucleus, m = _slow_nucleus(z, int(targets[n]), top_p, top_k)
        out.append(z[int(targets[n])] - torch.logsumexp(z[nucleus], dim=0))
        margin = min(margin, m)
    return (torch.stack(out) if out else torch.zeros(0, dtype=torch.float64)), margin


def _head(seed, n, h, v, ties):
    """Random hidden states and head; with ``ties`` both hold small half-integers (every product and sum is exact in
    float32, whatever the matmul's blocking) and the head repeats some rows, so many tokens' logits are equal."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g) * 2
    weight = torch.randn(v, h, generator=g)
    if ties:
        hidden = torch.randint(-3, 4, (n, h), generator=g).float() / 2
        weight = torch.randint(-3, 4, (v, h), generator=g).float() / 2
        weight = weight[torch.randint(0, max(1, v // 3), (v,), generator=g)]
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 24), h=st.integers(1, 8), v=st.integers(2, 40), chunk=st.integers(1, 30),
       temperature=st.sampled_from([0.5, 0.7, 1.0, 1.3]), top_p=st.sampled_from([0.1, 0.5, 0.8, 0.95, 1.0]),
       top_k=st.sampled_from([0, 1, 3, 10, 100]), ties=st.booleans(), seed=st.integers(0, 10_000))
def test_nucleus_logprobs_equal_the_plain_loop(n, h, v, chunk, temperature, top_p, top_k, ties, seed):
    hidden, weight, targets = _head(seed, n, h, v, ties)
    want, margin = _plain_loop(hidden, weight, targets, temperature=temperature, top_p=top_p, top_k=top_k)
    assume(margin > 1e-5)  # no cumulative mass within float rounding of top_p
    got = chunked_token_logprobs(hidden, weight, targets, temperature=temperature, top_p=top_p, top_k=top_k,
                                 chunk=chunk)
    ref = reference_token_logprobs(hidden, weight, targets, temperature=temperature, top_p=top_p, top_k=top_k)
    assert got.shape == (n,) and got.dtype == torch.float32 and bool(torch.isfinite(got).all())
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    small = nucleus_logprobs(hidden @ weight.T / temperature, targets, top_p=top_p, top_k=top_k, sort_rows=2)
    torch.testing.assert_close(small, ref, rtol=1e-5, atol=1e-5)  # the boundary found a few rows at a time


def test_top_p_one_and_no_top_k_give_the_old_full_softmax():
    hidden, weight, targets = _head(3, 20, 6, 30, ties=True)
    old = torch.log_softmax(hidden @ weight.T / 0.7, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    for kw in ({}, {"top_p": 1.0, "top_k": 0}, {"top_k": None}, {"top_k": 30}, {"top_k": 500}):
        torch.testing.assert_close(chunked_token_logprobs(hidden, weight, targets, temperature=0.7, chunk=7, **kw),
                                   old)


def test_ties_at_the_boundary_count_as_the_engines_count_them():
    """Logits 2, 1, 1, 1, 0 with top_p such that the nucleus is the first three sorted tokens: the engines keep
    the top token and two of the three tied ones (which two depends on the sort); every tied token reports the
    same logprob, log(e / (e² + 2e)), and the untied tail token is added to the nucleus as a target."""
    z = torch.tensor([[1.0, 2.0, 1.0, 0.0, 1.0]])
    p = torch.softmax(z[0].double(), 0)
    top_p = float(p[1] + p[0]) + 0.01  # the third sorted token still starts below top_p, the fourth does not
    lp = [float(nucleus_logprobs(z, torch.tensor([t]), top_p=top_p)[0]) for t in range(5)]
    e = math.e
    mass = e ** 2 + 2 * e
    assert lp[0] == lp[2] == lp[4] == pytest.approx(math.log(e / mass), abs=1e-6)
    assert lp[1] == pytest.approx(math.log(e ** 2 / mass), abs=1e-6)
    assert lp[3] == pytest.approx(math.log(1 / (mass + 1)), abs=1e-6)
    # top-k keeps every logit tied with the k-th largest, as vLLM's does
    assert float(nucleus_logprobs(z, torch.tensor([0]), top_k=2)[0]) == pytest.approx(math.log(e / (e ** 2 + 3 * e)))


@settings(max_examples=60, deadline=None)
@given(v=st.integers(2, 30), temperature=st.sampled_from([0.5, 0.7, 1.0]), top_p=st.floats(0.01, 1.0),
       top_k=st.integers(0, 40), ties=st.booleans(), seed=st.integers(0, 10_000))
def test_nucleus_properties(v, temperature, top_p, top_k, ties, seed):
    """Renormalising can only raise a logprob; over the nucleus the probabilities sum to 1 and keep the logits'
    differences; every target, in the nucleus or not, gets a finite logprob; shrinking top_p never lowers one."""
    hidden, weight, _ = _head(seed, 1, 4, v, ties)
    z = (hidden @ weight.T / temperature).expand(v, v).contiguous()  # one row per target token
    every = torch.arange(v)
    full = torch.log_softmax(z[0], dim=-1)
    lp = nucleus_logprobs(z, every, top_p=top_p, top_k=top_k)
    assert bool(torch.isfinite(lp).all()) and bool((lp <= 1e-6).all())
    assert bool((lp >= full - 1e-5).all())
    order = torch.argsort(z[0], descending=True, stable=True)
    mass = torch.cumsum(lp[order].double().exp(), 0)
    m = int((mass < 1 - 1e-4).sum()) + 1  # the nucleus: the first m sorted tokens sum to 1
    assert float(mass[m - 1]) == pytest.approx(1.0, abs=1e-4)
    inside = z[0] >= z[0, order[m - 1]]  # the nucleus and any token tied with its boundary (it could be sampled)
    shift = lp[inside] - z[0, inside]  # one common normaliser
    assert float(shift.max() - shift.min()) < 1e-5
    outside = ~inside  # a target outside: p_t / (nucleus mass + p_t)
    want = z[0, outside] - torch.logaddexp(-shift[0].expand(int(outside.sum())), z[0, outside])
    torch.testing.assert_close(lp[outside], want, rtol=1e-5, atol=1e-5)
    wider = nucleus_logprobs(z, every, top_p=min(1.0, top_p + 0.2), top_k=top_k)
    assert bool((lp >= wider - 1e-5).all())


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 12), chunk=st.integers(1, 13), top_p=st.sampled_from([0.3, 0.8, 0.95]),
       top_k=st.sampled_from([0, 5]), seed=st.integers(0, 10_000))
def test_nucleus_gradients_match_the_reference_and_the_plain_loop(n, chunk, top_p, top_k, seed):
    """Gradients flow through the kept logits only; the nucleus is a constant mask (continuous logits: no ties)."""
    g = torch.Generator().manual_seed(seed)
    h0 = torch.randn(n, 6, generator=g) * 2
    weight = torch.randn(20, 6, generator=g)
    targets = torch.randint(0, 20, (n,), generator=g)
    coef = torch.randn(n, generator=g)
    _, margin = _plain_loop(h0, weight, targets, temperature=0.7, top_p=top_p, top_k=top_k)
    assume(margin > 1e-5)

    grads = []
    for fn in (lambda h: chunked_token_logprobs(h, weight, targets, temperature=0.7, top_p=top_p, top_k=top_k,
                                                chunk=chunk),
               lambda h: reference_token_logprobs(h, weight, targets, temperature=0.7, top_p=top_p, top_k=top_k)):
        h = h0.clone().requires_grad_(True)
        (fn(h) * coef).sum().backward()
        grads.append(h.grad)
    h = h0.double().requires_grad_(True)
    (_plain_loop(h, weight, targets, temperature=0.7, top_p=top_p, top_k=top_k)[0] * coef.double()).sum().backward()
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[0].double(), h.grad, rtol=1e-3, atol=1e-4)


def test_bad_nucleus_parameters_are_refused():
    hidden, weight, targets = _head(0, 3, 4, 5, ties=False)
    for kw in ({"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"top_k": 2.5}):
        with pytest.raises(ValueError):
            chunked_token_logprobs(hidden, weight, targets, **kw)
        with pytest.raises(ValueError):
            reference_token_logprobs(hidden, weight, targets, **kw)


# ------------------------------------------------------------------ the boundary from the largest logits, not a sort
@settings(max_examples=80, deadline=None)
@given(r=st.integers(1, 12), v=st.integers(2, 40), top_p=st.sampled_from([0.1, 0.5, 0.8, 0.95, 1.0]),
       top_k=st.sampled_from([0, 1, 3, 10, 100]), prefixes=st.sampled_from([(1,), (2,), (3, 7), (5, 20), ()]),
       ties=st.booleans(), scale=st.sampled_from([0.2, 1.0, 4.0]), seed=st.integers(0, 10_000))
def test_the_prefix_boundary_equals_the_full_sort(r, v, top_p, top_k, prefixes, ties, scale, seed):
    """τ, the tie count and the token named at τ (its logit) from a few top-k prefixes (rows not settled there fall
    back to the sort) equal the full sort's, for every mix of settled and unsettled rows."""
    from bapsql.train.algo.logprobs import _boundary, _sorted_boundary

    assume(top_p < 1 or (top_k and top_k < v))  # the nucleus is active (as nucleus_logprobs calls it)
    hidden, weight, _ = _head(seed, r, 4, v, ties)
    z = hidden @ weight.T * scale
    for row in z:  # no cumulative mass within float rounding of top_p
        assume(_slow_nucleus(row.double(), 0, top_p, top_k)[1] > 1e-5)
    tau, rep, extra = _boundary(z, top_p, top_k, prefixes=prefixes)
    s_tau, s_rep, s_extra = _sorted_boundary(z, top_p, top_k)
    assert torch.equal(tau, s_tau) and torch.equal(extra, s_extra)
    assert torch.equal(z.gather(-1, rep[:, None]).squeeze(-1), tau)  # a token at the boundary (ties: any of them)


def test_a_peaked_nucleus_is_found_without_sorting_the_vocabulary(monkeypatch):
    """A trained model's distributions are peaked: the top-p boundary comes from its largest logits (torch.topk);
    sorting a 49k-150k vocabulary per position cost ~4x the LM head and halved GRPO learner throughput at
    top_p 0.95. Flat rows (a nucleus wider than the prefixes) still fall back to the sort, with the same values."""
    import bapsql.train.algo.logprobs as lp

    g = torch.Generator().manual_seed(0)
    v = 5000
    peaked = torch.randn(40, v, generator=g) * 3
    peaked[torch.arange(40), torch.randint(0, v, (40,), generator=g)] += 12  # one dominant token per row
    flat = torch.randn(3, v, generator=g) * 0.01  # the 0.95 nucleus holds ~4,700 tokens: beyond both prefixes
    targets = torch.randint(0, v, (43,), generator=g)
    z = torch.cat([peaked, flat])
    monkeypatch.setattr(lp, "NUCLEUS_PREFIXES", ())  # the full sort for every row: the definition
    want = nucleus_logprobs(z, targets, top_p=0.95, top_k=50_000)
    want_k = nucleus_logprobs(z, targets, top_p=0.9, top_k=100)
    monkeypatch.setattr(lp, "NUCLEUS_PREFIXES", (64, 1024))
    sorted_rows = []
    real_sort = lp._sorted_boundary
    monkeypatch.setattr(lp, "_sorted_boundary", lambda zz, *a: sorted_rows.append(zz.shape[0]) or real_sort(zz, *a))
    got = nucleus_logprobs(z, targets, top_p=0.95, top_k=50_000)
    assert sorted_rows == [3]  # only the flat rows were sorted
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(nucleus_logprobs(z, targets, top_p=0.9, top_k=100), want_k, rtol=1e-6, atol=1e-6)

    def no_sort(*args, **kwargs):
        raise AssertionError("sorted the vocabulary")

    monkeypatch.setattr(torch, "sort", no_sort)
    torch.testing.assert_close(nucleus_logprobs(z[:40], targets[:40], top_p=0.95), want[:40], rtol=1e-6, atol=1e-6)


def test_the_backward_recompute_reuses_the_forward_boundary(monkeypatch):
    """A checkpointed chunk finds its nucleus once: the backward pass recomputes the same logits and reuses the
    boundary the forward pass found (it cost as much again), with gradients equal to the unchunked reference."""
    import bapsql.train.algo.logprobs as lp

    hidden, weight, targets = _head(5, 12, 6, 30, ties=False)
    calls = []
    real = lp._boundary
    monkeypatch.setattr(lp, "_boundary", lambda z, *a, **k: calls.append(z.shape[0]) or real(z, *a, **k))
    grads = []
    for fn in (lambda h: chunked_token_logprobs(h, weight, targets, temperature=0.7, top_p=0.8, top_k=5, chunk=5),
               lambda h: reference_token_logprobs(h, weight, targets, temperature=0.7, top_p=0.8, top_k=5)):
        h = hidden.clone().requires_grad_(True)
        fn(h).sum().backward()
        grads.append(h.grad)
    assert calls[:3] == [5, 5, 2]  # the chunked forward: one boundary per chunk ...
    assert calls[3:] == [12]  # ... none in its backward; then the reference's one
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)
