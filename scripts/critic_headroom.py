"""How much explained variance can a critic reach on the `add` / `add_running` / `chain` tasks? (docs/results.md, "How much is there for a critic to learn?")

Samples responses from a policy at T=1, grades them, and finds for each the token at which its
first wrong trace line is complete (``vcppo.data.tasks.first_wrong_line``): from there on the
outcome is certain (-1). It then reports, over all response tokens (the pooled EV the trainer logs):

* ``ev_error_aware_oracle``: a critic that knows the arithmetic -- -1 once an error is visible,
  else the mean return of error-free prefixes. An upper-bound-style reference for what a critic
  that checks the trace could explain (it ignores per-prompt difficulty).
* ``probe_ev_*`` (``--probe``): linear probes of the return, fit on half the prompts and scored
  on the other half, on the frozen policy's last hidden states and on its confidence in what it
  wrote. They say whether what a critic initialised from the policy needs is already readable
  there (then a critic that stays at the mean is an optimisation problem) or must be learned.
* ``ev[critic]`` for each ValueModel directory given (an RM, a pretrained critic), on the same
  tokens, plus its mean value on error-visible vs error-free states (a critic that had learned
  anything would score the former lower).

    python scripts/critic_headroom.py --policy artifacts/sft --data artifacts/data/train.parquet \
        --prompts 96 artifacts/rm runs/critic_cache/<hash>

On ``chain`` prompts it also reports the response-length distribution, the reasoning style the
policy chose (full / skip / direct) and accuracy and mean length by difficulty (operands).
"""
from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policy", required=True, help="HF policy directory to sample from")
    p.add_argument("--data", required=True, help="prompt rows (prompt / answer) of the add task")
    p.add_argument("--prompts", type=int, default=96)
    p.add_argument("--samples-per-prompt", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--probe", action="store_true",
                   help="also fit linear probes of the return (ridge, half the prompts; EV on the other half) "
                        "on the policy's last hidden states and on its own confidence in what it wrote")
    p.add_argument("critics", nargs="*", help="ValueModel directories to score on the same responses")
    args = p.parse_args()

    from transformers import AutoModelForCausalLM

    from vcppo.algos.stats import explained_variance
    from vcppo.data.dataset import load_prompts
    from vcppo.data.tasks import first_wrong_line_tokens
    from vcppo.models.tokenizer import load_tokenizer
    from vcppo.models.value_model import ValueModel
    from vcppo.rewards.verifier import score

    torch.manual_seed(args.seed)
    tok = load_tokenizer(args.policy)
    policy = AutoModelForCausalLM.from_pretrained(args.policy).eval()
    texts = []  # (prompt, response text), aligned with samples
    samples = []  # (prompt_ids, response_ids, reward, first error-visible response index or None)
    for row in load_prompts(args.data, tok, shuffle_seed=None, limit=args.prompts).rows():
        ids = list(row["prompt_ids"])
        x = torch.tensor([ids] * args.samples_per_prompt)
        with torch.no_grad():
            out = policy.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=args.max_new_tokens,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        for seq in out:
            resp = seq[len(ids):].tolist()
            if tok.eos_token_id in resp:
                resp = resp[:resp.index(tok.eos_token_id) + 1]
            pieces = [tok.decode([t]) for t in resp]
            text = "".join(pieces)
            span = first_wrong_line_tokens(row["prompt"], pieces)
            visible_from = None if span is None else span[1]  # the state after the wrong line's last token
            samples.append((ids, resp, score(text, row["answer"]), visible_from))
            texts.append((row["prompt"], text))

    B, R = len(samples), max(len(s[1]) for s in samples)
    returns, mask = torch.zeros(B, R), torch.zeros(B, R)
    error_visible = torch.zeros(B, R, dtype=torch.bool)
    for b, (_, resp, reward, visible_from) in enumerate(samples):
        returns[b, :len(resp)], mask[b, :len(resp)] = reward, 1.0
        if visible_from is not None:
            error_visible[b, visible_from:len(resp)] = True
    clean = (mask > 0) & ~error_visible
    oracle = torch.where(error_visible, -1.0, returns[clean].mean().item()) * mask
    wrong = [s for s in samples if s[2] < 0]
    result = {
        "samples": B,
        "accuracy": round(sum(s[2] > 0 for s in samples) / B, 3),
        "wrong_with_trace_error": round(sum(s[3] is not None for s in wrong) / max(1, len(wrong)), 3),
        "error_visible_token_share": round(error_visible.float().sum().item() / mask.sum().item(), 3),
        "ev_error_aware_oracle": round(explained_variance(oracle, returns, mask).item(), 4),
    }
    result.update(_chain_breakdown(samples, texts))
    hidden, confidence = _probe_features(policy, samples, R) if args.probe or args.critics else (None, None)
    if args.probe:
        result.update(_probes(hidden, confidence, returns, mask, args.samples_per_prompt))
    for path in args.critics:
        critic = ValueModel.from_pretrained(path).eval()
        values = torch.zeros(B, R)
        for b, (ids, resp, _, _) in enumerate(samples):
            x = torch.tensor([ids + resp])
            kw = {}
            if critic.confidence_head is not None:  # the features at the positions values are read
                kw["confidence"] = torch.zeros(1, x.shape[1], confidence.shape[-1])
                kw["confidence"][0, len(ids) - 1:len(ids) - 1 + len(resp)] = confidence[b, :len(resp)]
            with torch.no_grad():
                v = critic(x, torch.ones_like(x), torch.arange(x.shape[1])[None], **kw)[0]
            values[b, :len(resp)] = v[len(ids) - 1:len(ids) + len(resp) - 1]  # V(state before token t)
        result[f"ev[{path}]"] = round(explained_variance(values, returns, mask).item(), 4)
        result[f"value_error_visible[{path}]"] = round(values[error_visible].mean().item(), 3)
        result[f"value_error_free[{path}]"] = round(values[clean].mean().item(), 3)
    print(json.dumps(result, indent=1))


def _probe_features(policy, samples: list, R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, R, H) last hidden states at the state before each response token (where the critic reads
    its value), and (B, R, 3) the policy's confidence in the tokens before it: the features
    ``critic.confidence_features`` gives the critic (vcppo.algos.confidence), from the logprobs of
    the T=1 samples."""
    from vcppo.algos.confidence import confidence_features
    H = policy.config.hidden_size
    hidden, logprobs, mask = torch.zeros(len(samples), R, H), torch.zeros(len(samples), R), torch.zeros(len(samples), R)
    for b, (ids, resp, _, _) in enumerate(samples):
        x = torch.tensor([ids + resp])
        with torch.no_grad():
            out = policy(x, output_hidden_states=True)
        n, start = len(resp), len(ids) - 1
        hidden[b, :n] = out.hidden_states[-1][0, start:start + n]
        logits = out.logits[0, start:start + n].float()
        logprobs[b, :n] = torch.log_softmax(logits, -1).gather(1, torch.tensor(resp)[:, None])[:, 0]
        mask[b, :n] = 1.0
    return hidden, confidence_features(logprobs, mask)


def _ridge_ev(x: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, train_rows: torch.Tensor) -> float:
    """Fit returns ~ x (+ bias) by ridge regression on the train rows' tokens, EV on the others."""
    from vcppo.algos.stats import explained_variance
    feats = torch.cat([x, torch.ones(*x.shape[:2], 1)], -1).double()
    sel = (mask > 0) & train_rows[:, None]
    X, y = feats[sel], returns.double()[sel]
    ridge = 1e-3 * X.shape[0] * torch.eye(X.shape[1], dtype=X.dtype)
    w = torch.linalg.solve(X.T @ X + ridge, X.T @ y)
    pred = (feats @ w).float() * mask
    held = mask * (~train_rows)[:, None]
    return round(explained_variance(pred, returns, held).item(), 4)


def _probes(hidden: torch.Tensor, confidence: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
            per_prompt: int) -> dict:
    """Is what a critic needs linearly readable from the frozen policy? Split by prompt."""
    train_rows = (torch.arange(returns.shape[0]) // per_prompt) % 2 == 0
    return {"probe_ev_hidden": _ridge_ev(hidden, returns, mask, train_rows),
            "probe_ev_confidence": _ridge_ev(confidence, returns, mask, train_rows),
            "probe_ev_hidden_and_confidence": _ridge_ev(torch.cat([hidden, confidence], -1), returns, mask,
                                                        train_rows)}


def _accuracy_by(rows: list) -> dict:
    """[(key, correct, length)] -> {key: {n, acc, mean_len}}, keys sorted."""
    groups: dict = {}
    for key, correct, n in rows:
        groups.setdefault(key, []).append((correct, n))
    return {k: {"n": len(v), "acc": round(sum(a for a, _ in v) / len(v), 3),
                "mean_len": round(sum(n for _, n in v) / len(v), 1)} for k, v in sorted(groups.items())}


def _chain_breakdown(samples: list, texts: list) -> dict:
    """Length quantiles, style shares, and accuracy / mean length per difficulty (operands), per
    style, and per style on the harder half of the prompts (chain only)."""
    from vcppo.data import tasks_chain
    if not texts or tasks_chain.parse_prompt(texts[0][0]) is None:
        return {}
    lengths = torch.tensor([float(len(s[1])) for s in samples])
    styles = [tasks_chain.style_of(p, t) for p, t in texts]
    operands = [len(tasks_chain.parse_prompt(prompt)) for prompt, _ in texts]
    rows = [(k, style, reward > 0, len(resp)) for (_, resp, reward, _), k, style in zip(samples, operands, styles)]
    hard = sorted(operands)[len(operands) // 2]  # the harder half: at least the median operand count
    return {
        "length_quantiles_10_50_90": [round(lengths.quantile(q).item()) for q in (0.1, 0.5, 0.9)],
        "style_share": {st: round(styles.count(st) / len(styles), 3) for st in sorted(set(styles))},
        "by_operands": _accuracy_by([(k, ok, n) for k, _, ok, n in rows]),
        "by_style": _accuracy_by([(style, ok, n) for _, style, ok, n in rows]),
        f"by_style_operands_ge_{hard}": _accuracy_by([(style, ok, n) for k, style, ok, n in rows if k >= hard]),
    }


if __name__ == "__main__":
    main()
