"""A VC-PPO run with a LoRA actor and a LoRA critic, end to end on the real engines: value
pretraining of the LoRA critic, the KL against the actor with its adapters off, vLLM sampling with
the actor's adapters (its own LoRA), both exports, and an exact resume after a kill."""
import json

import pytest

from tests.driver.test_exact_resume_e2e import assert_same, cut_after, records
from tests.driver.test_train_e2e import base_overrides, train
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def overrides(art, out):
    return base_overrides(art, out, **{
        "trainer.total_steps": 4, "trainer.save_every": 2, "trainer.keep_last": 5,
        "actor.lora.rank": 4, "actor.lora.alpha": 8, "critic.lora.rank": 4, "critic.lora.alpha": 8,
        "actor.lr": 1e-3, "critic.lr": 1e-3, "rollout.lora_sync": "adapter", "rollout.sampler_logprobs": True,
        "algorithm.kl_coef": 0.05, "algorithm.kl_in": "loss", "algorithm.kl_estimator": "low_var_kl"})


def test_lora_run_exports_and_resumes_exactly(tiny_artifacts, tmp_path):
    over = overrides(tiny_artifacts, tmp_path)
    res = train("vcppo", over, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "reference policy: the actor with its LoRA adapters off" in res.stderr
    run = tmp_path / "vcppo-seed0"
    full = records(run)
    ppo = [r for r in full if r["phase"] == "ppo"]
    assert len(ppo) == 4 and ppo[0]["actor/kl_loss"] == 0.0  # step 1 starts at the reference
    assert max(r["actor/kl_loss"] for r in ppo[1:]) > 0  # then the adapters move the policy away
    # vLLM samples with the adapters of the actor that trains on the samples (fp32: no gap)
    assert all(r["mismatch/logprob_abs_max"] < 1e-4 for r in ppo)
    adapter = json.loads((run / "final" / "actor_adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["base_model_name_or_path"] == str(tiny_artifacts / "tiny")
    assert (run / "final" / "actor" / "config.json").is_file() and (run / "final" / "critic").is_dir()

    # killed after PPO step 3 was logged, before its checkpoint: the rerun logs what the run logged
    tags = [p.name for p in list_complete(checkpoint_root(run))]
    cut_after(run, set(tags[:-1]), ("ppo", 3))
    res = train("vcppo", over, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from" in res.stderr
    assert_same(records(run), full)
