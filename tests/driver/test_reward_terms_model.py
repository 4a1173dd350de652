"""The reward model's scores meet the rule's: each combine mode on a rollout, the overlong shaping
kept, the running moments carried in the run state, and the settings that cannot work refused
before any engine starts. Fake engine (the real one: tests/engines/test_reward_model.py)."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from tests.fakes import scored
from vcppo.config.load import load_config
from vcppo.preflight import check_paths
from vcppo.driver.state import RunState
from vcppo.driver.step.reward_terms import ModelReward
from vcppo.driver.step.reward_terms import RewardAssembly
from vcppo.config.schema import Config
from vcppo.errors import ConfigError

MODEL_SCORES = torch.tensor([0.5, 2.0, -1.0, 0.0])


def rescore(rollout=None, state=None, **reward):
    cfg = Config()
    for k, v in reward.items():
        setattr(cfg.reward, k, v)
    cfg.reward.model_path = "rm"
    engine = SimpleNamespace(score=lambda batch: MODEL_SCORES[:batch.size].clone())
    state = state or RunState(phase="ppo")
    out, metrics = RewardAssembly(cfg, ModelReward(cfg, engine, retokenize=None)).outcome(
        rollout or scored([[1, -1], [1, -1]]), state)
    return out, metrics, state


def last_token_rewards(rollout):
    last = rollout.policy_mask.sum(1).long() - 1
    return rollout.token_rewards[torch.arange(rollout.size), last]


def test_each_mode_replaces_the_scores_and_the_last_token_reward():
    rule = torch.tensor([1.0, -1.0, 1.0, -1.0])
    for mode, expected in (("model", MODEL_SCORES), ("weighted_sum", 0.5 * rule + 2.0 * MODEL_SCORES)):
        out, m, _ = rescore(combine=mode, rule_weight=0.5, model_weight=2.0)
        assert torch.allclose(out.scores, expected) and torch.allclose(last_token_rewards(out), expected), mode
        assert out.token_rewards.sum().item() == pytest.approx(expected.sum().item())  # nothing elsewhere
        assert torch.equal(out.correct, rule.gt(0).float())  # the verifier's verdict stays the truth
    has_rule = dataclasses.replace(scored([[1, -1], [1, -1]]), has_rule=torch.tensor([1.0, 0.0, 0.0, 1.0]))
    out, _, _ = rescore(has_rule, combine="model_without_rule")
    assert out.scores.tolist() == [1.0, 2.0, -1.0, -1.0]


def test_rule_mode_only_watches_the_model():
    before = scored([[1, -1], [1, -1]])
    out, m, _ = rescore(before, combine="rule")
    assert out is before
    assert m["reward/model_score_mean"] == pytest.approx(MODEL_SCORES.mean().item())
    # the model's verdict (> 0) against the verifier's: right on rows 0 and 3, wrong on 1 and 2
    assert m["reward/model_accuracy"] == 0.5 and m["reward/rule_mean"] == 0.0


def test_the_overlong_shaping_stays_on_top_of_the_combination():
    lengths = [3, 4, 5, 3]
    rollout = scored([[1, -1], [1, -1]], lengths=lengths)
    penalty = torch.tensor([0.0, -0.5, -1.0, 0.0])  # max_response_tokens 5, buffer 2, penalty 1
    cfg_overlong = dict(overlong_buffer_tokens=2, overlong_penalty=1.0)
    cfg = Config()
    cfg.rollout.max_response_tokens = 5
    for k, v in cfg_overlong.items():
        setattr(cfg.reward, k, v)
    cfg.reward.model_path, cfg.reward.combine = "rm", "model"
    engine = SimpleNamespace(score=lambda batch: MODEL_SCORES.clone())
    out, _ = RewardAssembly(cfg, ModelReward(cfg, engine, retokenize=None)).outcome(rollout, RunState(phase="ppo"))
    assert torch.allclose(out.scores, MODEL_SCORES + penalty)


def test_normalised_scores_use_the_moments_of_every_step_so_far():
    out1, m1, state = rescore(combine="model", normalize_model_scores=True)
    mean, std = MODEL_SCORES.double().mean().item(), MODEL_SCORES.double().std(unbiased=False).item()
    assert state.model_score_moments[:2] == [4.0, pytest.approx(mean)]
    assert torch.allclose(out1.scores, ((MODEL_SCORES - mean) / (std + 1e-6)).float(), atol=1e-6)
    out2, m2, state = rescore(combine="model", normalize_model_scores=True, state=state)
    assert state.model_score_moments[0] == 8.0  # the second step's scores joined the first's
    assert m2["reward/model_running_std"] == pytest.approx(std)  # the same scores again: same spread


def test_settings_that_cannot_work_are_refused_before_any_engine(tmp_path):
    with pytest.raises(ConfigError, match="reward.combine.*needs reward.model_path"):
        load_config("vcppo", ["reward.combine=weighted_sum"])
    with pytest.raises(ConfigError, match="functions_by_source"):
        load_config("vcppo", ["reward.model_path=x", "reward.combine=model_without_rule"])
    for mode in ("model", "weighted_sum"):  # dynamic sampling judges groups by the rule alone
        with pytest.raises(ConfigError, match="trainer.dynamic_sampling"):
            load_config("vapo", ["reward.model_path=x", f"reward.combine={mode}", "trainer.dynamic_sampling=true"])
    assert load_config("vapo", ["reward.model_path=x", "reward.combine=rule", "trainer.dynamic_sampling=true"])
    assert load_config("vcppo", ["reward.model_path=x"]).reward.combine is None  # null: the model alone
    for name, arch in (("policy", "Qwen2ForCausalLM"), ("rm", "Qwen2ForSequenceClassification")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(f'{{"architectures": ["{arch}"], "id2label": {{"0": "s"}}}}')
    (tmp_path / "train.jsonl").write_text("")
    base = [f"model.policy_path={tmp_path / 'policy'}", f"data.train_files={tmp_path / 'train.jsonl'}",
            "data.val_files=null", f"trainer.output_root={tmp_path / 'runs'}"]
    with pytest.raises(ConfigError, match="reward.model_path.*no score head"):
        check_paths(load_config("vcppo", base + [f"reward.model_path={tmp_path / 'policy'}"]))  # a causal LM
    with pytest.raises(ConfigError, match="reward.model_path.*does not exist"):
        check_paths(load_config("vcppo", base + [f"reward.model_path={tmp_path / 'nope'}"]))
    check_paths(load_config("vcppo", base + [f"reward.model_path={tmp_path / 'rm'}"]))
