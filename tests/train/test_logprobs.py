"""Chunked token logprobs equal the plain full-logits computation, values and gradients."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.train.logprobs import chunked_token_logprobs, reference_token_logprobs

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
