"""The reward as a table of terms: a new term is one module (here: this one) plus one row, and it
trains end to end; a row's keys are checked against the schema's critic-cache tags, so a term that
shapes value pretraining's rewards cannot leave the pretrained critic's cache key stale."""
import dataclasses

import pytest
import torch

from tests.fakes import FakeRun, scored, scripted_source
from vcppo.config.provenance import schema_tags
from vcppo.config.schema import Config
from vcppo.driver.run_engines import cache_key
from vcppo.driver.state import Phase, RunState
from vcppo.driver.step import reward_terms as reward
from vcppo.driver.step.reward_terms import REWARD_TERMS, RewardAssembly, RewardTerm, RewardTermRow
from vcppo.driver.step.rl_step import rl_step
from vcppo.driver.step.step_plan import ppo_plan, pretrain_plan

CPU = torch.device("cpu")
GROUPS = [[1, -1, 1], [1, 1, -1]]
LENGTHS = [2, 5, 3, 4, 1, 5]


class LengthBonus(RewardTerm):
    """A dummy term: each sample's length over ``rollout.max_response_tokens``, added to its score
    and its last token's reward."""

    def __init__(self, cfg: Config):
        self.budget = cfg.rollout.max_response_tokens

    def outcome(self, rollout, state, timer=None):
        bonus = rollout.response_lengths / self.budget
        return dataclasses.replace(rollout, scores=rollout.scores + bonus, token_rewards=reward.add_on_last_token(
            rollout.token_rewards, rollout.policy_mask, bonus)), {"reward/length_bonus_mean": bonus.mean().item()}


def length_bonus(cfg: Config, model) -> RewardTerm:
    return LengthBonus(cfg)


def _row(**kw) -> RewardTermRow:
    return RewardTermRow(**{"name": "length_bonus", "keys": ("rollout.max_response_tokens",), "pretraining": True,
                            "build": f"{__name__}:length_bonus", "source": "a test's", **kw})


def _step(run: FakeRun, plan):
    """One step of ``plan`` on fake engines: its metrics and the (actor, critic) training batches."""
    seen = {}
    for name, engine in (("actor", run.actor), ("critic", run.critic.engine)):
        train = engine.train_step
        engine.train_step = (lambda train, name: lambda mb, loss: seen.setdefault(name, mb) and train(mb, loss))(
            train, name)
    rollout = scored(GROUPS, lengths=LENGTHS)
    metrics = rl_step(run, scripted_source(run, [rollout], logprobs=plan.sampler_logprobs), plan,
                      RunState(phase=str(plan.phase)), step=1)
    return metrics, seen, rollout


def test_a_new_reward_term_is_one_module_and_one_row(monkeypatch):
    monkeypatch.setitem(REWARD_TERMS, "length_bonus", _row())
    bonus = torch.tensor(LENGTHS, dtype=torch.float32) / 16
    for plan_of in (ppo_plan, pretrain_plan):  # the critic's pretraining learns from it too
        run = FakeRun(**{"rollout.n_samples_per_prompt": 3, "rollout.max_response_tokens": 16,
                         "algorithm.whiten_advantages": False})
        plan = plan_of(run.cfg, CPU)
        metrics, seen, rollout = _step(run, plan)
        assert metrics["reward/length_bonus_mean"] == pytest.approx(bonus.mean().item())
        assert metrics["reward/mean"] == pytest.approx((rollout.scores + bonus).mean().item())
        trained = seen["critic"]  # the critic's targets are returns of the rewards with the bonus
        last = torch.tensor(LENGTHS) - 1
        torch.testing.assert_close(trained.scores, rollout.scores + bonus)
        torch.testing.assert_close(trained.token_rewards[torch.arange(6), last], rollout.scores + bonus)
        if plan.actor_trains:
            torch.testing.assert_close(seen["actor"].scores, rollout.scores + bonus)
        else:
            assert "actor" not in seen


def test_a_term_off_in_pretraining_is_not_applied_there(monkeypatch):
    monkeypatch.setitem(REWARD_TERMS, "length_bonus", _row(pretraining=False, keys=("algorithm.kl_coef",)))
    b = scored(GROUPS, lengths=LENGTHS)
    out, m = RewardAssembly(Config(), None, Phase.VALUE_PRETRAIN).outcome(b, RunState(phase="value_pretrain"))
    assert out is b and m == {}
    out, m = RewardAssembly(Config(), None, Phase.PPO).outcome(b, RunState(phase="ppo"))
    assert "reward/length_bonus_mean" in m and not torch.equal(out.scores, b.scores)


@pytest.mark.parametrize("key, says", [
    ("algorithm.kl_coef", "'algorithm.kl_coef' is not in the critic cache's key (schema: resume='math', "
                          "critic_cache=False)"),
    ("logging.log_samples", "'logging.log_samples' is not in the critic cache's key (schema: resume='free'"),
    ("reward.no_such_key", "'reward.no_such_key' is not a config key"),
])
def test_a_term_whose_keys_would_leave_a_stale_critic_is_refused(monkeypatch, key, says):
    monkeypatch.setitem(REWARD_TERMS, "length_bonus", _row(keys=("rollout.max_response_tokens", key)))
    with pytest.raises(ValueError, match="reward term 'length_bonus'") as err:
        RewardAssembly(Config(), None, Phase.PPO)
    assert says in str(err.value)


def _changed(key: str, value, tags: dict):
    """Another valid value of ``key`` (a choice other than its default's resolved meaning: the last)."""
    if tags.get("choices"):
        return [c for c in tags["choices"] if c not in (value, None)][-1]
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, dict):
        return {**value, "a_source": "a.module:fn"}
    return "some/other"


def test_every_key_of_a_term_that_shapes_pretraining_changes_the_critic_cache_key():
    tags = schema_tags()
    base = Config()
    keys = [k for row in REWARD_TERMS.values() if row.pretraining for k in row.keys]
    assert len(keys) >= 10
    for key in keys:
        cfg = Config()
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, _changed(key, getattr(getattr(cfg, section), name), tags[key]))
        assert cache_key(cfg) != cache_key(base), key
