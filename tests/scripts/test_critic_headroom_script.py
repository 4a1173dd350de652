"""scripts/critic_headroom.py --probe: the held-out linear probes and their features, on a tiny real
Qwen2 policy (no sampling: samples are given)."""
import importlib.util
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location("critic_headroom",
                                              Path(__file__).parents[2] / "scripts" / "critic_headroom.py")
headroom = importlib.util.module_from_spec(spec)
spec.loader.exec_module(headroom)


def test_the_ridge_probe_finds_a_planted_signal_on_held_out_rows_and_nothing_in_noise():
    g = torch.Generator().manual_seed(0)
    B, R = 64, 10
    mask = torch.ones(B, R)
    mask[::3, 7:] = 0  # uneven lengths
    x = torch.randn(B, R, 4, generator=g)
    returns = (x[..., 0] > 0).float() * 2 - 1  # decided by feature 0, per token
    train_rows = torch.arange(B) % 2 == 0
    assert headroom._ridge_ev(x, returns * mask, mask, train_rows) > 0.5
    noise = torch.randn(B, R, 4, generator=g)
    assert abs(headroom._ridge_ev(noise, returns * mask, mask, train_rows)) < 0.1
    probes = headroom._probes(x, noise, returns * mask, mask, per_prompt=4)  # split by prompt groups of 4
    assert probes["probe_ev_hidden"] > 0.5 and abs(probes["probe_ev_confidence"]) < 0.1
    assert probes["probe_ev_hidden_and_confidence"] > 0.5


def test_confidence_features_describe_the_tokens_before_each_state(tmp_path):
    from tests.engines.conftest import build_tiny_model
    from transformers import AutoModelForCausalLM
    policy = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m")).eval()
    samples = [([5, 6, 7], [10, 11, 12, 13], 1.0, None), ([8, 9], [20, 21], -1.0, 1)]
    hidden, conf = headroom._probe_features(policy, samples, R=4)
    assert hidden.shape == (2, 4, policy.config.hidden_size) and conf.shape == (2, 4, 3)
    with torch.no_grad():
        logits = policy(torch.tensor([[5, 6, 7, 10, 11, 12, 13]])).logits[0]
    logp = torch.log_softmax(logits[2:6], -1).gather(1, torch.tensor([[10], [11], [12], [13]]))[:, 0]
    # the state before token t has seen tokens < t: its features come from logprobs 0..t-1
    before = torch.cat([torch.zeros(1), logp[:3]])
    torch.testing.assert_close(conf[0, :, 0], before)
    torch.testing.assert_close(conf[0, :, 1], torch.cummin(before, 0).values)
    torch.testing.assert_close(conf[0, :, 2], torch.log1p(torch.cumsum((before < -0.6931).float(), 0)))
    assert conf[1, 2:].abs().sum() == 0 and hidden[1, 2:].abs().sum() == 0  # padding stays zero


def test_chain_breakdown_reports_accuracy_by_style_and_by_difficulty():
    """Accuracy per reasoning style (all prompts and the harder half), per operand count."""
    from vcppo.data.tasks_chain import prompt_of, solution
    rows = [([1, 2], "full", 1.0), ([1, 2], "direct", -1.0), ([3, 4, 5], "full", 1.0), ([3, 4, 5], "skip", -1.0),
            ([1, 1, 1, 1], "full", -1.0), ([1, 1, 1, 1], "direct", 1.0)]
    texts = [(prompt_of(ops), solution(ops, style)) for ops, style, _ in rows]
    samples = [(None, [0] * len(t), reward, None) for (_, t), (_, _, reward) in zip(texts, rows)]
    out = headroom._chain_breakdown(samples, texts)
    assert out["style_share"] == {"direct": round(2 / 6, 3), "full": 0.5, "skip": round(1 / 6, 3)}
    assert {k: v["acc"] for k, v in out["by_style"].items()} == {"direct": 0.5, "full": round(2 / 3, 3), "skip": 0.0}
    assert {k: (v["n"], v["acc"]) for k, v in out["by_operands"].items()} == {2: (2, 0.5), 3: (2, 0.5), 4: (2, 0.5)}
    hard = out["by_style_operands_ge_3"]  # the median operand count of the six is 3
    assert {k: v["n"] for k, v in hard.items()} == {"direct": 1, "full": 2, "skip": 1}
    assert out["by_style"]["full"]["mean_len"] == round(sum(len(texts[i][1]) for i in (0, 2, 4)) / 3, 1)
