"""The chunked logprob / entropy function against the full logits, values and gradients."""
import pytest
import torch

from vcppo.algos.logprobs import full_token_logprobs, token_logprobs


def _case(n=37, h=16, v=53, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(dtype).requires_grad_(True)
    weight = torch.randn(v, h, generator=g).to(dtype).requires_grad_(True)
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


def assert_fp32_close(got, want, hidden, weight):
    """Within 1e-6 in units of the row's logit scale max(1, max_v |z_v|): fp32 resolves no finer (one
    ulp at 16 is 1.9e-6, the same logits from a matmul over a slice of the rows already differ by one
    ulp, and logsumexp carries that into every logprob and entropy of the row)."""
    scale = (hidden.detach().float() @ weight.detach().float().T).abs().amax(-1).clamp(min=1.0)
    assert float(((got - want).abs() / scale).max()) <= 1e-6


def _loss(logp, ent, g):
    """A loss that weights every logprob and entropy differently (so every gradient term shows)."""
    a = torch.randn(logp.shape, generator=g)
    b = torch.randn(logp.shape, generator=g)
    return (a * logp).sum() + ((b * ent).sum() if ent is not None else 0.0)


def _grads(fn, hidden, weight, targets, **kw):
    h, w = hidden.detach().clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)
    logp, ent = fn(h, w, targets, **kw)
    _loss(logp, ent, torch.Generator().manual_seed(7)).backward()
    return logp.detach(), (ent.detach() if ent is not None else None), h.grad, w.grad


@pytest.mark.parametrize("chunk", [1, 5, 16, 37, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_equals_full_fp32(chunk, temperature, with_entropy):
    hidden, weight, targets = _case()
    ref = _grads(full_token_logprobs, hidden, weight, targets, temperature=temperature, with_entropy=with_entropy)
    got = _grads(token_logprobs, hidden, weight, targets, temperature=temperature, with_entropy=with_entropy,
                 chunk_size=chunk)
    assert_fp32_close(got[0], ref[0], hidden, weight)
    if with_entropy:
        assert_fp32_close(got[1], ref[1], hidden, weight)
    else:
        assert got[1] is None
    for g, r in zip(got[2:], ref[2:]):
        assert (g - r).norm() <= 1e-5 * r.norm()


def test_matches_log_softmax_of_scaled_logits_by_hand():
    """Against the definition, not against the other implementation: log softmax(h W^T / tau)[y]."""
    hidden, weight, targets = _case(n=4, h=3, v=5)
    tau = 0.5
    z = (hidden @ weight.T).double() / tau
    want = z.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    p = z.softmax(-1)
    want_h = -(p * p.log()).sum(-1)
    logp, ent = token_logprobs(hidden, weight, targets, temperature=tau, chunk_size=3, with_entropy=True)
    torch.testing.assert_close(logp.double(), want, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent.double(), want_h, atol=1e-6, rtol=0)


def test_entropy_gradient_alone_and_logprob_gradient_alone():
    """A loss on one output only: the other's gradient slot arrives empty."""
    hidden, weight, targets = _case(n=9)
    for pick in (0, 1):
        outs = {}
        for name, fn, kw in (("full", full_token_logprobs, {}), ("chunked", token_logprobs, {"chunk_size": 4})):
            h = hidden.detach().clone().requires_grad_(True)
            w = weight.detach().clone().requires_grad_(True)
            y = fn(h, w, targets, with_entropy=True, **kw)[pick].sum()
            y.backward()
            outs[name] = (h.grad, w.grad)
        for g, r in zip(outs["chunked"], outs["full"]):
            assert (g - r).norm() <= 1e-5 * r.norm()


def test_tied_weight_gets_both_gradients():
    """A tied head: the weight is also the input embedding; its gradient sums both uses."""
    hidden, weight, targets = _case(n=11, v=20)
    ids = torch.randint(0, 20, (11,), generator=torch.Generator().manual_seed(3))
    grads = []
    for fn, kw in ((full_token_logprobs, {}), (token_logprobs, {"chunk_size": 3})):
        w = weight.detach().clone().requires_grad_(True)
        h = torch.nn.functional.embedding(ids, w) + hidden.detach()
        logp, _ = fn(h, w, targets, **kw)
        logp.sum().backward()
        grads.append(w.grad)
    assert (grads[1] - grads[0]).norm() <= 1e-5 * grads[0].norm()


def test_frozen_weight_gets_no_gradient_and_no_grad_mode_runs():
    hidden, weight, targets = _case(n=6)
    w = weight.detach()
    h = hidden.detach().clone().requires_grad_(True)
    token_logprobs(h, w, targets, chunk_size=4)[0].sum().backward()
    assert h.grad is not None and w.grad is None
    with torch.no_grad():
        a = token_logprobs(hidden, weight, targets, chunk_size=4, with_entropy=True)
        b = full_token_logprobs(hidden, weight, targets, with_entropy=True)
    assert_fp32_close(a[0], b[0], hidden, weight)
    assert_fp32_close(a[1], b[1], hidden, weight)


def test_bfloat16_within_bf16_noise():
    hidden, weight, targets = _case(n=64, h=32, v=300, dtype=torch.bfloat16)
    ref = _grads(full_token_logprobs, hidden, weight, targets, with_entropy=True)
    got = _grads(token_logprobs, hidden, weight, targets, with_entropy=True, chunk_size=16)
    # the logits are the same bf16 matmul in both: values agree as closely as in fp32
    torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], ref[1], atol=1e-5, rtol=0)
    assert got[2].dtype == got[3].dtype == torch.bfloat16
    for g, r in zip(got[2:], ref[2:]):
        assert float((g.float() - r.float()).norm()) <= 2 ** -7 * float(r.float().norm())


def test_chunk_size_zero_is_the_full_path():
    hidden, weight, targets = _case()
    a = token_logprobs(hidden, weight, targets, chunk_size=0)
    b = full_token_logprobs(hidden, weight, targets)
    assert torch.equal(a[0], b[0])
