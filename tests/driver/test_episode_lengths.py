"""An episode's length, defined once (:func:`vcppo.experience.response_lengths`: model and observation
tokens), is what DAPO's overlong penalty and VAPO's length-adaptive lambda read: on a two-turn episode
the policy mask's sum (model tokens only) would give both another value."""
import dataclasses

import pytest
import torch

from vcppo.algos.dapo import overlong_penalty
from vcppo.algos.gae import length_adaptive_lambda
from vcppo.config.schema import AlgorithmConfig
from vcppo.driver.state import RunState
from vcppo.driver.step.update import estimate
from vcppo.driver.step.multi_turn import EpisodeRunner, episodes_rollout
from vcppo.driver.step.reward_terms import RewardAssembly
from vcppo.envs.worker import EnvRunner
from vcppo.experience import concat_batches

from tests.driver.test_multi_turn import ScriptedSampler, cfg_for, rows


@pytest.fixture(scope="module")
def two_turns():
    """One guess episode: '8' -> 'higher' -> '10' (solved), with its token counts."""
    done = EpisodeRunner(cfg_for(), ScriptedSampler([["8"], ["10"]]), EnvRunner(0, 5.0), 512).run(
        rows("10"), 1, 0, "ppo", 1.0, False)
    assert done[0].turns == 2 and done[0].solved
    batch = episodes_rollout(done, 0, 0, "cpu", logprobs=False)
    total, model = len(done[0].tokens), int(sum(done[0].policy))
    assert total > model  # the observation's tokens sit between the turns
    return batch, total, model


def test_a_rollout_carries_the_episode_length_with_its_observation_tokens(two_turns):
    batch, total, model = two_turns
    assert batch.response_lengths.tolist() == [float(total)]
    assert batch.policy_mask.sum().item() == model  # the policy mask stays the model's tokens
    # the length travels with the rows (selection, concatenation with a wider batch)
    assert batch.select([0]).response_lengths.tolist() == [float(total)]
    assert concat_batches([batch, batch]).response_lengths.tolist() == [float(total)] * 2


def test_the_overlong_penalty_counts_observation_tokens(two_turns):
    batch, total, model = two_turns
    cfg = cfg_for(max_response_tokens=total + 1)
    cfg.reward.overlong_buffer_tokens = total - model  # the buffer starts past the model's tokens alone
    out, m = RewardAssembly(cfg, None).outcome(batch, RunState(phase="ppo"))
    want = overlong_penalty(torch.tensor([float(total)]), total + 1, total - model)
    assert want.item() < 0  # the episode ran into the buffer of a budget that counts its observation
    torch.testing.assert_close(out.scores, batch.scores + want)
    assert m["reward/overlong_penalised_frac"] == 1.0


def test_vapo_lambda_reads_the_episode_length(two_turns):
    batch, total, model = two_turns
    alg = dataclasses.replace(AlgorithmConfig(), length_adaptive_lambda=True, length_adaptive_alpha=1.0)
    adv = estimate(batch, batch.token_rewards, torch.zeros_like(batch.policy_mask), alg)
    torch.testing.assert_close(adv.lambda_actor, length_adaptive_lambda(torch.tensor([float(total)]), 1.0))
    assert adv.lambda_actor.item() > length_adaptive_lambda(torch.tensor([float(model)]), 1.0).item()
