"""The reward assembly (vcppo.driver.step.reward_terms): each term applied once, in order, and logged:
the rule's score, the soft overlong shaping, the reward model's combination, the KL in the reward."""
from types import SimpleNamespace

import pytest
import torch

from tests.fakes import scored
from vcppo.driver.state import RunState
from vcppo.driver.step.reward_terms import ModelReward
from vcppo.driver.step.reward_terms import RewardAssembly
from vcppo.config.schema import Config


def _last(rollout):
    return rollout.token_rewards[torch.arange(rollout.size), rollout.policy_mask.sum(1).long() - 1]


def test_overlong_shaping_shifts_scores_and_the_last_token_reward():
    b = scored([[1, -1], [1, 1]], lengths=[2, 6, 7, 8])
    cfg = Config()
    out, m = RewardAssembly(cfg, None).outcome(b, RunState(phase="ppo"))
    assert out is b and m == {}  # off by default: nothing to add
    cfg.rollout.max_response_tokens, cfg.reward.overlong_buffer_tokens = 8, 4
    before = b.scores.clone()
    out, m = RewardAssembly(cfg, None).outcome(b, RunState(phase="ppo"))
    torch.testing.assert_close(out.scores, torch.tensor([1.0, -1.5, 0.25, 0.0]))
    torch.testing.assert_close(out.token_rewards.sum(1), out.scores)
    assert out.token_rewards[1, 5].item() == -1.5 and out.token_rewards[3, 7].item() == 0.0
    assert m["reward/overlong_penalised_frac"] == 0.75
    assert before.tolist() == [1.0, -1.0, 1.0, 1.0] and torch.equal(b.scores, before)  # the input is not written to
    assert m["reward/overlong_penalty_mean"] == pytest.approx(-(0.5 + 0.75 + 1.0) / 4)


def test_every_term_once_in_order():
    """Rule 1 / -1, a reward model's scores combined 0.5 / 2.0, the overlong shaping on top, then the
    KL per token: the rule enters the combination as the verifier gave it (never shaped and
    unshaped), the shaping is added once, the KL only in the per-token rewards."""
    lengths = [3, 4, 5, 3]
    rollout = scored([[1, -1], [1, -1]], lengths=lengths)
    cfg = Config()
    cfg.rollout.max_response_tokens = 5
    cfg.reward.overlong_buffer_tokens, cfg.reward.overlong_penalty = 2, 1.0
    cfg.reward.model_path, cfg.reward.combine = "rm", "weighted_sum"
    cfg.reward.rule_weight, cfg.reward.model_weight = 0.5, 2.0
    model = torch.tensor([0.3, 0.7, -0.1, 0.0])
    seen = []
    engine = SimpleNamespace(score=lambda batch: seen.append(batch.scores.clone()) or model.clone())
    assembly = RewardAssembly(cfg, ModelReward(cfg, engine, retokenize=None))
    out, m = assembly.outcome(rollout, RunState(phase="ppo"))
    rule = torch.tensor([1.0, -1.0, 1.0, -1.0])
    shaping = torch.tensor([0.0, -0.5, -1.0, 0.0])
    assert torch.equal(seen[0], rule)  # the model sees the rule's rollout, unshaped
    assert torch.equal(out.scores, (0.5 * rule + 2.0 * model) + shaping)
    assert torch.equal(_last(out), out.scores) and out.token_rewards.sum().item() == pytest.approx(out.scores.sum().item())
    assert m["reward/rule_mean"] == 0.0 and m["reward/overlong_penalised_frac"] == 0.5
    assert m["reward/model_score_mean"] == pytest.approx(model.mean().item())
    kl = 0.1 * out.policy_mask
    per_token = assembly.per_token(out, kl, kl_coef=2.0)
    assert torch.equal(per_token, out.token_rewards - 2.0 * kl)
    assert assembly.per_token(out, None, kl_coef=2.0) is out.token_rewards  # KL not in the reward


def test_rule_mode_keeps_the_rule_and_still_shapes():
    rollout = scored([[1, -1]], lengths=[3, 5])
    cfg = Config()
    cfg.rollout.max_response_tokens = 5
    cfg.reward.overlong_buffer_tokens = 2
    cfg.reward.model_path, cfg.reward.combine = "rm", "rule"
    engine = SimpleNamespace(score=lambda batch: torch.tensor([5.0, 5.0]))
    out, m = RewardAssembly(cfg, ModelReward(cfg, engine, retokenize=None)).outcome(rollout, RunState(phase="ppo"))
    assert out.scores.tolist() == [1.0, -2.0] and "reward/model_minus_rule" not in m
    assert rollout.scores.tolist() == [1.0, -1.0]  # the input is not written to
