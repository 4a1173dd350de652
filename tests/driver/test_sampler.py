"""The run's Sampler, chosen once: single responses or multi-turn episodes. What differs between the
two is the sampler's, so the experience maker, the step's metrics and validation hold no branch on
the kind (read from their syntax trees), and each kind makes its own rollouts and metrics."""
import ast
import inspect

import torch

from tests.driver.test_multi_turn import ScriptedSampler, cfg_for, rows
from vcppo.config.schema import Config
from vcppo.driver.step import experience_maker, metrics, validation
from vcppo.driver.step.sampler import EpisodeSampler, SingleTurnSampler, make_sampler


def _reads(module) -> set[str]:
    """The attribute and variable names ``module``'s code reads (docstrings aside)."""
    tree = ast.parse(inspect.getsource(module))
    return ({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            | {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)})


def test_the_step_modules_hold_no_branch_on_the_kind_of_sample():
    for module in (experience_maker, metrics, validation):
        names = _reads(module)
        episodic = {n for n in names if "episode" in n.lower() or n in ("env", "max_turns")}
        assert not episodic, f"{module.__name__} reads {sorted(episodic)}: that is the Sampler's to know"
        assert "EpisodeSampler" not in names and "SingleTurnSampler" not in names, module.__name__


class _Scorer:
    num_workers, num_scored, num_failures, functions_by_source = 0, 0, 0, {}

    def judge(self, texts, truths, finish):
        ok = [t.startswith(str(a)) for t, a in zip(texts, truths)]
        return [1.0 if x else -1.0 for x in ok], ok


def test_the_config_chooses_the_sampler_and_each_makes_its_own_rollout():
    single = make_sampler(Config(), ScriptedSampler([["8", "3"]]), _Scorer())
    assert isinstance(single, SingleTurnSampler)
    b = single.sample(rows("8", "5"), 0, range(2), seed=0, key="ppo")
    assert b.scores.tolist() == [1.0, -1.0] and torch.equal(b.policy_mask, b.attention_mask[:, b.prompt_len:].float())
    assert single.step_metrics("PPO step 1", 0) == {}

    scorer = _Scorer()
    episodes = make_sampler(cfg_for(n_samples_per_prompt=1, max_turns=2), ScriptedSampler([["8"], ["10"]]), scorer)
    assert isinstance(episodes, EpisodeSampler)
    e = episodes.sample(rows("10"), 0, range(1), seed=0, key="ppo")
    assert e.correct.tolist() == [1.0] and scorer.num_scored == 1
    obs = e.attention_mask[:, e.prompt_len:].float() - e.policy_mask
    assert obs.sum() > 0 and e.response_lengths.item() == e.policy_mask.sum().item() + obs.sum().item()
    m = episodes.step_metrics("PPO step 1", 0)
    assert m["env/episodes"] == 1.0 and m["env/turns_mean"] == 2.0


def test_per_turn_metrics_are_the_episode_samplers():
    adv = torch.tensor([[1.0, 0.0, 3.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    assert SingleTurnSampler.batch_metrics(Config(), adv, mask, adv) == {}
    m = EpisodeSampler.batch_metrics(cfg_for(max_turns=2), adv, mask, None)
    assert m["env/adv_by_turn"] == [1.0, 3.0] and "env/value_by_turn" not in m
