"""`vcppo train sao` on CPU (tiny model, real engines), and a critic warm-started from its export with
``critic.init_from``: no value pretraining, the source recorded, the frozen attention the source's after
a kill-free resume. Each run is its own process, as a user runs it."""
import json

import pytest
import yaml
from safetensors.torch import load_file

from tests.conftest import vcppo
from tests.driver.test_train_e2e import base_overrides
from vcppo.tracking import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def train(preset, overrides, cwd):
    res = vcppo("train", preset, *overrides, cwd=cwd, check=False, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]


def attention(critic_dir):
    state = load_file(str(critic_dir / "model.safetensors"))
    return {k: v for k, v in state.items() if ".self_attn." in k}


def test_sao_runs_and_a_warm_started_critic_keeps_its_source_and_freeze_across_a_resume(tiny_artifacts, tmp_path):
    train("sao", base_overrides(tiny_artifacts, tmp_path, **{"trainer.prompts_per_step": 8,
                                                             "rollout.n_samples_per_prompt": 1}), tmp_path)
    source = tmp_path / "sao-seed0"
    ppo = sorted(read_metrics(source, "ppo"), key=lambda r: r["step"])
    assert [r["step"] for r in ppo] == [1, 2] and len(read_metrics(source, "value_pretrain")) == 2
    assert all("actor/clip_frac_high" in r and "mismatch/logprob_abs_mean" not in r for r in ppo)  # DIS: no pi_old pass
    # the frozen attention of sao's critic: its final export's attention is the policy's backbone's
    from transformers import AutoModel
    policy = {f"{k}": v for k, v in AutoModel.from_pretrained(str(tiny_artifacts / "tiny")).state_dict().items()
              if ".self_attn." in k}
    exported = attention(source / "final" / "critic")
    assert exported and all((exported[k] == policy[k]).all() for k in exported)

    warm = tmp_path / "warm"
    warm.mkdir()
    opts = {"critic.init_from": source, "trainer.run_name": "warm", "trainer.save_every": 1,
            "trainer.prompts_per_step": 8, "rollout.n_samples_per_prompt": 1, "trainer.seed": 1}
    train("sao", base_overrides(tiny_artifacts, warm, **{**opts, "trainer.total_steps": 1}), warm)
    train("sao", base_overrides(tiny_artifacts, warm, **{**opts, "trainer.total_steps": 2}), warm)  # resumes
    run = warm / "warm"
    assert read_metrics(run, "value_pretrain") == []
    reused = read_metrics(run, "value_pretrain_reused")
    assert reused and reused[0]["critic_init_from"]["path"] == str((source / "final" / "critic").resolve())
    assert [r["step"] for r in read_metrics(run, "ppo")] == [1, 2]
    assert yaml.safe_load((run / "config.yaml").read_text())["critic"]["init_from"] == str(source)
    # attention frozen through both processes: still the source critic's
    final = attention(run / "final" / "critic")
    assert final and all((final[k] == exported[k]).all() for k in final)
