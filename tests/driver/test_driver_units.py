"""Fast tests of the driver's own logic (no engines): checkpoints, stopping rule, experience
layout, whitening, metrics files. The real-engine runs are in test_train_e2e.py."""
import json
import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from vcppo.config.load import load_config
from vcppo.driver.durability import checkpoint as ckpt
from vcppo.driver.run_engines import cache_key
from vcppo.driver.step.timeline import PhaseTimer
from vcppo.driver.step.sampler import collect_rollout, rank_slice
from vcppo.driver.phases import settled
from vcppo.rewards.verifier import RewardScorer
from vcppo.config.schema import RolloutConfig
from vcppo.tracking import MetricsLogger, read_metrics


def test_checkpoints_are_atomic_and_pruned(tmp_path):
    root = ckpt.checkpoint_root(tmp_path)
    for step in (1, 2, 3):
        stage = ckpt.staging_dir(tmp_path, step)
        ckpt.write_rank_files(stage, rank=0)
        ckpt.commit(stage, {"step": step, "phase": "ppo"}, keep_last=2)
    # A crash mid-write leaves only a .tmp dir: it is never a resume point.
    ckpt.write_rank_files(ckpt.staging_dir(tmp_path, 4), rank=0)
    assert [p.name for p in ckpt.list_complete(root)] == ["step_000002", "step_000003"]
    assert ckpt.find_resume_point(tmp_path, "auto").name == "step_000003"
    assert ckpt.find_resume_point(tmp_path, "never") is None
    ckpt.clean_partial(root)
    assert not list(root.glob("*.tmp"))
    with pytest.raises(FileNotFoundError, match="trainer.resume"):
        ckpt.find_resume_point(tmp_path, str(tmp_path / "nope"))


def test_checkpoint_restores_rng(tmp_path):
    torch.manual_seed(123)
    stage = ckpt.staging_dir(tmp_path, 1)
    ckpt.write_rank_files(stage, rank=0)
    final = ckpt.commit(stage, {"phase": "ppo", "step": 1}, keep_last=1)
    expected = torch.rand(3)
    torch.manual_seed(999)
    state = ckpt.load_state(final, rank=0)
    assert state.step == 1 and state.phase == "ppo" and torch.equal(torch.rand(3), expected)


def test_settling_rule():
    vp = SimpleNamespace(window=3, min_steps=4, ev_tolerance=0.02, loss_tolerance=0.05)
    rising_ev = [0.1, 0.3, 0.5, 0.6, 0.7, 0.8]
    assert not settled(rising_ev, [1.0] * 6, vp)
    flat = [0.80, 0.81, 0.80, 0.81, 0.80, 0.81]
    assert settled(flat, [0.50, 0.49, 0.50, 0.50, 0.49, 0.50], vp)
    assert not settled(flat, [1.0, 1.0, 1.0, 0.5, 0.5, 0.5], vp)  # loss still falling
    assert not settled(flat[:5], [0.5] * 5, vp)                    # too few steps


def test_cache_key_ignores_algorithm_and_seed_but_not_critic(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "w.bin").write_bytes(b"x")
    (tmp_path / "d.parquet").write_bytes(b"y")
    base = [f"model.policy_path={tmp_path/'m'}", f"data.train_files={tmp_path/'d.parquet'}"]
    a = cache_key(load_config("vcppo", base))
    assert a == cache_key(load_config("vcppo_no_dgae", base + ["trainer.seed=3"]))
    assert a != cache_key(load_config("vcppo", base + ["critic.lr=1e-3"]))
    assert a != cache_key(load_config("vcppo", base + ["critic.head_lr_scale=10"]))
    assert a != cache_key(load_config("vcppo", base + ["value_pretrain.steps=7"]))
    # where the critic's weights live does not change what it learns: the cache still applies
    assert a == cache_key(load_config("vcppo", base + ["critic.zero_stage=3", "critic.offload_optimizer=true"]))
    # a policy-initialised critic is built from the policy whatever model.critic_path says
    assert a == cache_key(load_config("vcppo", base + [f"model.critic_path={tmp_path / 'm'}"]))
    assert a != cache_key(load_config("vcppo", base + ["model.critic_init=reward_model",
                                                       f"model.critic_path={tmp_path / 'm'}"]))
    # a reward model changes the reward the critic learns; combine=null is combine=model
    rm = [f"reward.model_path={tmp_path / 'm'}"]
    with_rm = cache_key(load_config("vcppo", base + rm))
    assert with_rm != a and with_rm == cache_key(load_config("vcppo", base + rm + ["reward.combine=model"]))
    assert with_rm != cache_key(load_config("vcppo", base + rm + ["reward.combine=weighted_sum"]))
    assert a != cache_key(load_config("vcppo", base + ["reward.verl_parity=true"]))  # verl's scores
    # a LoRA critic learns other weights; the actor's adapters start at zero, so pretraining is the same
    lora = cache_key(load_config("vcppo", base + ["critic.lora.rank=8"]))
    assert lora != a and lora != cache_key(load_config("vcppo", base + ["critic.lora.rank=8", "critic.lora.alpha=8"]))
    assert a == cache_key(load_config("vcppo", base + ["actor.lora.rank=8"]))


def test_rank_slice_keeps_whole_prompts():
    items = list(range(10))
    parts = [rank_slice(items, r, 3) for r in range(3)]
    assert [p[0] for p in parts] == [0, 4, 8]
    assert sum((p[1] for p in parts), []) == items


@dataclass
class _Sample:
    prompt_index: int
    prompt_ids: list
    response_ids: list
    logprobs: list
    finish_reason: str
    text: str


class _FakeRollout:
    """Stands in for vLLM in this unit test only (the real engine runs in the integration tests)."""

    def generate(self, prompt_ids, n, **kw):
        out = []
        for i, p in enumerate(prompt_ids):
            out.append(_Sample(i, p, [5, 6, 7], [-0.1, -0.2, -0.3], "stop", "<think>x</think>\\boxed{3}"))
            out.append(_Sample(i, p, [5], [-0.5], "length", "<think>x"))
        return out[: len(prompt_ids) * n]


def test_collect_rollout_places_outcome_reward_on_last_token():
    rows = [{"prompt_ids": [1, 2], "answer": "3"}, {"prompt_ids": [4], "answer": "4"}]
    batch = collect_rollout(rows, first_index=10, rollout=_FakeRollout(), scorer=RewardScorer(), pad_id=0,
                               device=torch.device("cpu"), seed=0,
                               sampling=RolloutConfig(n_samples_per_prompt=2, max_response_tokens=3))
    assert batch.scores.tolist() == [1.0, -1.0, -1.0, -1.0]
    assert batch.correct.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert batch.truncated.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert batch.group.tolist() == [10, 10, 11, 11]
    assert torch.equal(batch.token_rewards[0], torch.tensor([0.0, 0.0, 1.0]))
    assert torch.equal(batch.token_rewards[1], torch.tensor([-1.0, 0.0, 0.0]))
    assert batch.sampler_logprobs is None  # not asked for (the plan's sampler_logprobs)
    with_lp = collect_rollout(rows, first_index=10, rollout=_FakeRollout(), scorer=RewardScorer(), pad_id=0,
                                 device=torch.device("cpu"), seed=0, logprobs=True,
                                 sampling=RolloutConfig(n_samples_per_prompt=2, max_response_tokens=3))
    assert torch.allclose(with_lp.sampler_logprobs[0], torch.tensor([-0.1, -0.2, -0.3]))
    assert torch.equal(with_lp.sampler_logprobs[1], torch.tensor([-0.5, 0.0, 0.0]))
    assert batch.has_rule is None  # no per-source rules


def test_collect_rollout_marks_the_rows_whose_data_source_has_a_rule():
    from vcppo.rewards.routing import GroundTruth
    rows = [{"prompt_ids": [1, 2], "answer": GroundTruth("3", {"data_source": "math"})},
            {"prompt_ids": [4], "answer": GroundTruth("4", {"data_source": "chat"})}]
    scorer = RewardScorer(functions_by_source={"math": "vcppo.rewards.verifier:score"})
    batch = collect_rollout(rows, first_index=0, rollout=_FakeRollout(), scorer=scorer, pad_id=0,
                            device=torch.device("cpu"), seed=0,
                            sampling=RolloutConfig(n_samples_per_prompt=2, max_response_tokens=3))
    assert batch.has_rule.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_phase_timer_sums_phases():
    t = PhaseTimer()
    with t("a"):
        pass
    with t("b"):
        pass
    m = t.metrics()
    assert set(m) == {"time/a_s", "time/b_s", "time/step_s"}
    assert m["time/step_s"] == pytest.approx(m["time/a_s"] + m["time/b_s"])


def test_metrics_logger_writes_jsonl_and_resume_keeps_last(tmp_path):
    log = MetricsLogger(tmp_path, {}, use_wandb=False, progress_bar=False)
    log.log({"x": torch.tensor(1.5), "nan": float("nan"), "profile": [1.0, 2.0]}, step=1, phase="ppo")
    log.log({"x": 2.0}, step=2, phase="ppo")
    log.log({"x": 9.0}, step=2, phase="ppo")  # the same step again after a resume
    log.close()
    recs = read_metrics(tmp_path, "ppo")
    assert [(r["step"], r["x"]) for r in recs] == [(1, 1.5), (2, 9.0)]
    assert recs[0]["nan"] is None and recs[0]["profile"] == [1.0, 2.0]
    json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])


def test_metrics_logger_wandb_offline(tmp_path):
    """Real wandb, offline: the run directory gets wandb's offline run files."""
    log = MetricsLogger(tmp_path, {"a": 1}, use_wandb=True, wandb_mode="offline", progress_bar=False,
                        run_name="unit")
    log.log({"reward/mean": 0.5}, step=1, phase="ppo")
    log.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and any(p.suffix == ".wandb" for p in runs[0].iterdir())


def test_a_policy_initialised_critic_starts_from_the_policy_even_when_a_critic_path_is_set():
    """The demo preset sets model.critic_path (for critic_init=reward_model); with the default
    critic_init=policy the critic must still start from the SFT policy's backbone, not the RM's."""
    from vcppo.driver.run_engines import critic_source
    demo = load_config("demo", ["demo.workdir=/w"])
    assert demo.model.critic_path == "/w/rm"
    assert critic_source(demo) == ("policy", "/w/sft")
    rm = load_config("demo", ["demo.workdir=/w", "model.critic_init=reward_model"])
    assert critic_source(rm) == ("reward_model", "/w/rm")


def test_sft_that_stops_below_its_target_is_named_with_the_reason():
    from vcppo.commands.sft import target_shortfall
    short = {"steps": 600, "stopped_by": "steps", "val/pass@1_greedy": 0.25}
    msg = target_shortfall(short, 0.4)
    assert "step 600" in msg and "sft.steps" in msg and "0.250" in msg and "sft.target_accuracy 0.4" in msg
    assert "(by sft.max_minutes)" in target_shortfall({**short, "stopped_by": "max_minutes"}, 0.4)
    assert target_shortfall({**short, "val/pass@1_greedy": 0.4}, 0.4) is None  # reached
    assert target_shortfall(short, 0.0) is None  # no target asked
    assert target_shortfall({"steps": 8}, 0.4) is None  # no val split: nothing to judge
    assert "step 600 with" in target_shortfall({"steps": 600, "val/pass@1_greedy": 0.1}, 0.4)  # older summary


@pytest.mark.parametrize("world, overrides, key", [
    (2, ["placement.rollout_ranks=2"], "'placement.rollout_ranks' (2) must leave at least one training rank"),
    (4, ["placement.critic_ranks=1"], "'placement.critic_ranks' (1) must equal the number of actor ranks (2"),
    (3, ["placement.critic_ranks=2"], "'placement.rollout_ranks' (1) must leave at least one training rank"),
    (3, ["trainer.prompts_per_step=3"], "'trainer.prompts_per_step' (3) must be divisible by the training ranks (2)"),
])
def test_split_rank_counts_that_cannot_work_name_their_key(world, overrides, key):
    from vcppo.config.placement import Placement
    from vcppo.errors import ConfigError
    cfg = load_config("vcppo", ["placement.mode=split", *overrides])
    with pytest.raises(ConfigError, match=re.escape(f"config key {key}")):
        Placement.of(cfg).check_ranks(cfg, world)
    ok = load_config("vcppo", ["placement.mode=split", "placement.critic_ranks=1"])
    Placement.of(ok).check_ranks(ok, 3)  # 1 + 1 + 1
