"""Every step plan through the real driver step (:func:`vcppo.driver.step.rl_step.rl_step`) on fake engines:
which passes run and in which order, what each plan reports, and that the plan's shortcuts
(pi_old / V_old from the update's own forward) give what the separate passes give. Milliseconds;
the same shortcuts on the real DeepSpeed engine: test_plan_shortcuts_exact.py."""
import dataclasses

import pytest
import torch

from tests.fakes import FakeRun, scored, scripted_source
from vcppo.config.load import load_config
from vcppo.driver.state import RunState
from vcppo.driver.step.step_plan import Source, ppo_plan, pretrain_plan
from vcppo.driver.step.rl_step import rl_step

CPU = torch.device("cpu")
ROLLOUT = [[1, -1], [1, 1], [-1, 1], [-1, -1]]


def run_step(plan=None, phase="ppo", rounds=None, **overrides):
    run = FakeRun(**overrides)
    plan = plan or (ppo_plan if phase == "ppo" else pretrain_plan)(run.cfg, CPU)
    source = scripted_source(run, rounds or [scored(ROLLOUT)], logprobs=plan.sampler_logprobs)
    return run, plan, rl_step(run, source, plan, RunState(phase=plan.phase), step=1)


@pytest.mark.parametrize("preset, overrides, pi_old, v_old, critic_first", [
    ("vcppo", [], Source.UPDATE, Source.UPDATE, True),                 # the shipped default: no extra pass
    ("vcppo_no_dgae", [], Source.UPDATE, Source.PASS, False),          # lambda_critic < 1: targets need V
    ("grpo", [], Source.UPDATE, Source.NONE, False),
    ("vapo", [], Source.UPDATE, Source.UPDATE, True),
    ("vcppo", ["algorithm.kl_coef=0.1"], Source.PASS, Source.UPDATE, True),  # KL needs pi_old first
    ("vcppo", ["algorithm.kl_coef=0.1", "algorithm.old_logprobs_from_sampler=true"], Source.SAMPLER,
     Source.UPDATE, True),
    ("vcppo", ["actor.ppo_epochs=2"], Source.PASS, Source.UPDATE, True),
    ("vcppo", ["critic.ppo_mini_batches=2"], Source.UPDATE, Source.PASS, False),
])
def test_the_ppo_plan_of_each_preset(preset, overrides, pi_old, v_old, critic_first):
    plan = ppo_plan(load_config(preset, overrides), CPU)
    assert (plan.pi_old, plan.v_old, plan.critic_first) == (pi_old, v_old, critic_first)
    assert plan.entropy is (Source.PASS if pi_old is Source.PASS else Source.UPDATE if
                            "actor.ppo_epochs=2" not in overrides else Source.NONE)
    assert plan.describe().startswith("ppo step plan: pi_old from ")


def test_the_pretraining_plan_is_the_ppo_step_with_the_actor_frozen():
    plan = pretrain_plan(load_config("vcppo", ["algorithm.kl_coef=0.1"]), CPU)
    assert (plan.pi_old, plan.entropy, plan.actor_trains, plan.kl_in_reward) == (Source.NONE, Source.NONE, False, False)
    assert plan.v_old is Source.UPDATE and plan.critic_first
    slow = pretrain_plan(load_config("vcppo", ["value_pretrain.lambda_critic=0.99"]), CPU)
    assert slow.v_old is Source.PASS and slow.lambda_critic == 0.99


@pytest.mark.parametrize("phase, overrides, calls", [
    ("ppo", {}, ["critic:train_step", "actor:train_step", "wake_up", "weight_sync"]),
    ("ppo", {"actor.ppo_mini_batches": 2, "algorithm.lambda_critic": 0.99},
     ["actor:forward", "critic:forward", "critic:train_step", "actor:train_step", "actor:train_step", "wake_up",
      "weight_sync"]),
    ("ppo", {"algorithm.kl_coef": 0.1},
     ["actor:forward", "reference:forward", "critic:train_step", "actor:train_step", "wake_up", "weight_sync"]),
    ("ppo", {"algorithm.kl_coef": 0.1, "algorithm.old_logprobs_from_sampler": True},
     ["reference:forward", "critic:train_step", "actor:train_step", "wake_up", "weight_sync"]),
    ("ppo", {"algorithm.advantage_estimator": "grpo"}, ["actor:train_step", "wake_up", "weight_sync"]),
    ("value_pretrain", {}, ["critic:train_step", "wake_up"]),
    ("value_pretrain", {"value_pretrain.lambda_critic": 0.99}, ["critic:forward", "critic:train_step", "wake_up"]),
])
def test_each_plan_runs_its_passes_in_order_and_vllm_sleeps_through_the_updates(phase, overrides, calls):
    run, _, _ = run_step(phase=phase, **overrides)
    assert run.calls == [f"sample:{phase}", "sleep", *calls]


def test_what_each_plan_reports():
    _, _, m = run_step()  # VC-PPO default: entropy and pi_old from the update, V_old from the critic's
    assert {"actor/entropy", "critic/explained_variance", "adv/position_corr", "actor/pg_loss",
            "critic/value_loss", "time/weight_sync_s"} <= set(m)
    assert not any(k.startswith(("mismatch/", "actor/kl_ref")) for k in m)  # fp32: no sampler logprobs
    _, _, m = run_step(**{"rollout.sampler_logprobs": True, "algorithm.kl_coef": 0.1})
    assert {"mismatch/kl_k3", "actor/kl_ref", "time/ref_logprobs_s"} <= set(m)
    _, _, m = run_step(phase="value_pretrain")
    assert not any(k.startswith("actor/") or k == "time/weight_sync_s" for k in m)
    assert "critic/explained_variance" in m and "adv/position_profile" in m
    _, _, m = run_step(**{"algorithm.advantage_estimator": "grpo"})
    assert not any(k.startswith("critic/") for k in m) and "actor/entropy" in m


def test_the_update_shortcuts_give_what_the_passes_give():
    """pi_old and the entropy from the actor's update, V_old from the critic's: the same metrics as
    separate passes before the updates (the fake models' outputs move with every update)."""
    overrides = {"rollout.sampler_logprobs": True, "algorithm.rollout_is_cap": 2.0}
    _, plan, shortcut = run_step(**overrides)
    assert (plan.pi_old, plan.v_old) == (Source.UPDATE, Source.UPDATE)
    passes = dataclasses.replace(plan, pi_old=Source.PASS, entropy=Source.PASS, v_old=Source.PASS, critic_first=False)
    _, _, full = run_step(plan=passes, **overrides)
    timing = ("time/", "perf/")
    assert {k for k in full if not k.startswith(timing)} == {k for k in shortcut if not k.startswith(timing)}
    for key, value in full.items():
        if not key.startswith(timing):
            # (returns-to-go are computed without the values' float rounding: 1e-7 apart)
            assert shortcut[key] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), key
    assert full["mismatch/logprob_abs_max"] > 0  # the comparison has something to compare


def test_dynamic_sampling_and_mismatch_metrics_reach_the_step():
    rounds = [scored([[1, 1], [1, -1]]), scored([[-1, 1], [1, 1]])]
    _, _, m = run_step(rounds=rounds, **{"trainer.dynamic_sampling": True, "trainer.prompts_per_step": 2,
                                         "algorithm.rollout_is_cap": 2.0})
    assert m["dynamic_sampling/tries"] == 2.0 and m["dynamic_sampling/dropped_groups"] == 2.0
    assert m["mismatch/tis_weight_mean"] > 0 and "mismatch/tis_truncated_frac" in m
