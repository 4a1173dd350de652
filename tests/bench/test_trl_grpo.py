"""`vcppo bench grpo-trl` (vcppo/bench/trl_grpo.py): the run's settings handed to TRL's GRPOTrainer."""
import json

import pytest

from vcppo.bench.trl_grpo import trl_settings
from vcppo.config.load import load_config

REAL = ["trainer.prompts_per_step=16", "rollout.n_samples_per_prompt=4", "actor.ppo_mini_batches=4",
        "trainer.total_steps=20", "actor.lr=5e-6", "rollout.max_response_tokens=96", "trainer.seed=3"]


def test_grpo_run_becomes_trl_settings_with_the_same_batch_schedule_and_loss():
    s = trl_settings(load_config("grpo", REAL), "out")
    # 64 samples a step in 4 optimizer steps of 16, one generation per 4 optimizer steps, 20 RL steps
    assert (s["per_device_train_batch_size"], s["steps_per_generation"], s["num_generations"]) == (16, 4, 4)
    assert s["max_steps"] == 80 and s["gradient_accumulation_steps"] == 1 and s["num_iterations"] == 1
    assert (s["learning_rate"], s["max_completion_length"], s["seed"]) == (5e-6, 96, 3)
    assert (s["loss_type"], s["scale_rewards"], s["beta"]) == ("bnpo", "group", 0.0)
    assert (s["adam_beta1"], s["adam_beta2"], s["max_grad_norm"]) == (0.9, 0.95, 1.0)


def test_drgrpo_run_gets_trl_dr_grpo_loss_and_unscaled_advantages():
    s = trl_settings(load_config("drgrpo", REAL), "out")
    assert (s["loss_type"], s["scale_rewards"]) == ("dr_grpo", "none")


@pytest.mark.parametrize("preset,overrides,names", [
    ("vcppo", [], "algorithm.advantage_estimator=gae"),
    ("grpo", ["actor.ppo_mini_batches=3"], "actor.ppo_mini_batches=3"),
    ("grpo", ["algorithm.policy_loss=gspo", "algorithm.loss_agg=seq-mean-token-mean"], "algorithm.policy_loss=gspo"),
    ("grpo", ["algorithm.loss_agg=seq-mean-token-mean"], "algorithm.loss_agg=seq-mean-token-mean"),
])
def test_what_trl_grpo_cannot_run_is_one_line_naming_the_key(preset, overrides, names):
    with pytest.raises(ValueError, match=names.replace(".", r"\.")):
        trl_settings(load_config(preset, REAL + overrides), "out")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.extended
def test_grpo_trl_bench_trains_with_trl_and_scores_the_saved_policy(tmp_path):
    """TRL's GRPOTrainer for real on a tiny model: two steps, the policy saved at each, `vcppo eval` of each."""
    pytest.importorskip("trl")
    from tests.conftest import vcppo
    vcppo("data", "make", "--task", "arith", "--out", "data", "--n", "64", "--n-eval", "8", cwd=tmp_path)
    vcppo("model", "make", "--size", "tiny", "--out", "model", cwd=tmp_path)
    res = vcppo("bench", "grpo-trl", "grpo", "model.policy_path=model", "data.train_files=data/train.parquet",
                "data.val_files=data/val.parquet", "eval.data_files=data/test.parquet", "eval.max_prompts=4",
                "eval.n_samples=2", "eval.k=[1]", "rollout.max_response_tokens=8", "trainer.total_steps=2",
                "trainer.prompts_per_step=2", "rollout.n_samples_per_prompt=2", "actor.ppo_mini_batches=2",
                "logging.wandb=false", "--save-at", "1", "--eval", "--out", "out", cwd=tmp_path, timeout=900)
    out = json.loads((tmp_path / "out" / "grpo_trl.json").read_text())
    assert len(out["step_s"]) == 2 and sorted(out["saved"]) == ["1", "2"] and "TRL GRPOTrainer" in res.stdout
    assert {step: ev["val/num_prompts"] for step, ev in out["eval"].items()} == {"1": 4.0, "2": 4.0}
