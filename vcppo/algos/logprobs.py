"""Per-token logprobs and entropies of sampled tokens, straight from the LM head's input.

Notation (one flattened batch of N predicted positions):

    h       (N, H)  the last hidden states at the positions that predict a response token
    W       (V, H)  the LM head's weight (tied to the input embedding or not)
    y       (N,)    the sampled token at each position
    tau             the sampler's temperature
    z = h W^T / tau                       (N, V) scaled logits, in fp32
    lse_n = logsumexp_v z_nv
    logp_n = z_{n, y_n} - lse_n           log pi(y_n | s_n)
    H_n = -sum_v p_nv log p_nv            entropy of softmax(z_n), p = exp(z - lse)

The full (N, V) logits cost ~1.5 MB per token at Qwen's 151,936-token vocabulary in fp32 (the
logits, their upcast and the log-softmax autograd keeps), far more than the transformer's layers
at long CoT lengths. :func:`token_logprobs` computes the same two outputs ``chunk_size`` rows at a
time and keeps only (lse, H) per row for the backward, which recomputes each chunk's logits
(as verl's fused PPO kernels, Liger's fused linear cross-entropy and NeMo-RL's chunked logprobs
do; written here in plain torch so the CPU and GPU paths are one code).

Gradients (g = dL/dlogp, e = dL/dH, both (N,)), per row over the vocabulary:

    dlogp/dz_v = 1[v = y] - p_v
    dH/dz_v    = -p_v (log p_v + H)
    dL/dz = g (onehot(y) - p) - e p (log p + H);   dL/d(hW^T) = dL/dz / tau
    dL/dh = (dL/d(hW^T)) W                         (N, H)
    dL/dW = (dL/d(hW^T))^T h                       (V, H), accumulated over chunks in fp32
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _scaled_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """(n, H) x (V, H) -> (n, V) fp32 logits / tau: the head's matmul in the model's dtype, then
    the upcast, exactly as the full path computes them."""
    z = F.linear(h, weight).float()
    return z.div_(temperature) if temperature != 1.0 else z


def _chunk_forward(h, weight, targets, temperature, with_entropy):
    """One chunk: (logp (n,), lse (n,), entropy (n,) or None), all fp32. Holds one (n, V) fp32 buffer
    (two with the entropy): the logits are shifted and exponentiated in place."""
    z = _scaled_logits(h, weight, temperature)
    target = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    top = z.amax(dim=-1, keepdim=True)
    shifted = z.sub_(top)                    # z - max, in place
    if not with_entropy:
        log_sum = shifted.exp_().sum(dim=-1).log_()
        lse = log_sum + top.squeeze(-1)
        return target - lse, lse, None
    e = shifted.exp()
    sum_e = e.sum(dim=-1)
    log_sum = sum_e.log()
    lse = log_sum + top.squeeze(-1)
    # H = lse - sum_v p_v z_v = log sum e - sum_v e_v (z_v - max) / sum e
    entropy = log_sum - e.mul_(shifted).sum(dim=-1) / sum_e
    return target - lse, lse, entropy


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """See the module docstring. Saves h, W, y, lse and H; never an (N, V) tensor."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk_size, with_entropy):
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_empty(n, dtype=torch.float32) if with_entropy else None
        for s in range(0, n, chunk_size):
            e = min(n, s + chunk_size)
            lp, ls, ent = _chunk_forward(hidden[s:e], weight, targets[s:e], temperature, with_entropy)
            logp[s:e], lse[s:e] = lp, ls
            if with_entropy:
                entropy[s:e] = ent
        ctx.save_for_backward(hidden, weight, targets, lse, entropy if with_entropy else lse)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        if with_entropy:
            return logp, entropy
        return logp, logp.new_zeros(0)

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        tau, chunk = ctx.temperature, ctx.chunk_size
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        use_entropy = ctx.with_entropy and grad_entropy is not None and grad_entropy.numel() > 0
        grad_h = torch.empty_like(hidden) if want_h else None
        # fp32 accumulator: one rounding to the weight's dtype at the end, as the full path's one matmul
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        g_lp = grad_logp.float() if grad_logp is not None else torch.zeros_like(lse)
        for s in range(0, hidden.shape[0], chunk):
            e = min(hidden.shape[0], s + chunk)
            h = hidden[s:e]
            dz = _chunk_grad_logits(_scaled_logits(h, weight, tau), lse[s:e], targets[s:e], g_lp[s:e],
                                    grad_entropy[s:e].float() if use_entropy else None, entropy[s:e])
            if tau != 1.0:
                dz.div_(tau)
            dz_d = dz.to(hidden.dtype)
            if want_h:
                grad_h[s:e] = dz_d @ weight
            if want_w:
                if dz_d.dtype == torch.float32:
                    grad_w.addmm_(dz_d.t(), h)
                else:
                    grad_w.add_(dz_d.t() @ h)
        return grad_h, (grad_w.to(weight.dtype) if want_w else None), None, None, None, None


def _chunk_grad_logits(z, lse, targets, g_lp, g_ent, entropy):
    """dL/dz (n, V) fp32 of one chunk, in place over the recomputed scaled logits ``z`` (one (n, V)
    buffer; a second only when the entropy carries a gradient)."""
    logp = z.sub_(lse.unsqueeze(-1))
    if g_ent is None:
        dz = logp.exp_().mul_(-g_lp.unsqueeze(-1))                     # -g p
    else:
        p = logp.exp()
        # e * (-p (log p + H)), built in the log p buffer, then - g p added
        logp.add_(entropy.unsqueeze(-1)).mul_(p).mul_(-g_ent.unsqueeze(-1))
        dz = p.mul_(-g_lp.unsqueeze(-1)).add_(logp)
    dz.scatter_add_(-1, targets.unsqueeze(-1), g_lp.unsqueeze(-1))   # + g onehot(y)
    return dz


def full_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                        temperature: float = 1.0, with_entropy: bool = False):
    """The same outputs from the whole (N, V) logits at once (autograd keeps them): the reference
    :func:`token_logprobs` is tested against, and its ``chunk_size=0`` path."""
    z = _scaled_logits(hidden, weight, temperature)
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, None
    p = logp_all.exp()
    return logp, -torch.where(p > 0, p * logp_all, torch.zeros_like(p)).sum(-1)


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                   temperature: float = 1.0, chunk_size: int = 1024, with_entropy: bool = False):
    """log pi(y_n | s_n) at temperature tau, and the entropy when asked, never holding (N, V).

    Args:
        hidden:      (N, H) the LM head's input at the N predicting positions (model dtype).
        weight:      (V, H) the LM head's weight (same dtype; no bias).
        targets:     (N,) long, the sampled tokens.
        temperature: tau > 0; the logits are divided by it (the distribution vLLM sampled from).
        chunk_size:  rows of logits held at a time; 0 = all N at once (:func:`full_token_logprobs`).
        with_entropy: also return the per-position entropy of softmax(z).

    Returns:
        (logprobs (N,) fp32, entropy (N,) fp32 or None), differentiable w.r.t. ``hidden`` and
        ``weight`` (the entropy too, for an entropy bonus).

    Memory: ``chunk_size`` x V x 4 bytes of fp32 working set (twice that when the entropy is asked
    for in the forward, or carries a gradient in the backward; plus the head's output in the model's
    dtype before its upcast when that is not fp32), 4 x V x H more in the backward (the fp32
    weight-gradient accumulator), 8 bytes per row kept between the two.
    """
    if chunk_size <= 0:
        return full_token_logprobs(hidden, weight, targets, temperature, with_entropy)
    logp, entropy = _ChunkedTokenLogprobs.apply(hidden, weight, targets, float(temperature),
                                                int(chunk_size), bool(with_entropy))
    return logp, (entropy if with_entropy else None)
