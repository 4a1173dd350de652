"""Any checkpoint as a model: `vcppo model export CHECKPOINT --out DIR` joins ZeRO-3 partitions and merges
LoRA adapters into what the run's own final export holds, and `vcppo eval` takes the checkpoint as MODEL;
`--critic` writes its critic as the value-model directory `critic.init_from` reads."""
import pytest
from safetensors.torch import load_file

from tests.conftest import vcppo
from tests.driver.test_train_e2e import base_overrides, train

pytestmark = [pytest.mark.integration]


@pytest.mark.slow
def test_a_zero3_lora_checkpoint_exports_as_the_final_model_and_evaluates(tiny_artifacts, tmp_path):
    over = base_overrides(tiny_artifacts, tmp_path, **{
        "trainer.total_steps": 1, "trainer.save_every": 1, "data.val_files": "null", "actor.zero_stage": 3,
        "actor.lora.rank": 4, "actor.lr": 1e-2, "algorithm.entropy_coef": 0.1})  # the bonus moves weights anyway
    res = train("grpo", over, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    run = tmp_path / "grpo-seed0"
    point = run / "checkpoints" / "step_000001"
    res = vcppo("model", "export", point, "--out", tmp_path / "exported", cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    got, want = load_file(tmp_path / "exported" / "model.safetensors"), load_file(run / "final/actor/model.safetensors")
    start = load_file(tiny_artifacts / "tiny" / "model.safetensors")
    assert sorted(got) == sorted(want) and not any(".lora_" in k for k in got)
    assert all((got[k] == want[k]).all() for k in got)  # the run's own export after the same step
    assert any((got[k] != start[k]).any() for k in got)  # and the step did move the weights
    assert (tmp_path / "exported" / "tokenizer.json").exists()

    res = vcppo("eval", point, tiny_artifacts / "data/val.parquet", "eval.max_prompts=2", "eval.n_samples=0",
                "rollout.max_response_tokens=16", cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "is a run's checkpoint: exported its policy" in res.stdout and "pass@1_greedy" in res.stdout


@pytest.mark.slow
def test_a_checkpoints_critic_exports_as_the_value_model_init_from_reads(tiny_artifacts, tmp_path):
    """A ZeRO-3 critic with frozen attention: the export is the run's own final/critic after the same step,
    and critic.init_from takes the exported directory, while the step directory itself is one line."""
    from vcppo.config.critic_start import resolve_init_from
    from vcppo.errors import ConfigError
    over = base_overrides(tiny_artifacts, tmp_path, **{
        "trainer.total_steps": 1, "trainer.save_every": 1, "data.val_files": "null", "critic.zero_stage": 3,
        "critic.freeze": "[attention]", "value_pretrain.enabled": "false", "critic.lr": 1e-2})
    res = train("vcppo", over, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    run = tmp_path / "vcppo-seed0"
    point = run / "checkpoints" / "step_000001"
    with pytest.raises(ConfigError, match=rf"^config key 'critic.init_from': {point} is a run's training checkpoint"
                                          rf".*`vcppo model export {point} --critic --out DIR` and pass DIR$"):
        resolve_init_from(str(point))
    res = vcppo("model", "export", point, "--critic", "--out", tmp_path / "critic", cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    for name in ("model.safetensors", "value_head.safetensors"):
        got, want = load_file(tmp_path / "critic" / name), load_file(run / "final" / "critic" / name)
        assert sorted(got) == sorted(want) and all((got[k] == want[k]).all() for k in got), name
    assert load_file(tmp_path / "critic" / "value_head.safetensors")["weight"].abs().max() > 0  # the update moved it
    assert resolve_init_from(str(tmp_path / "critic")) == str(tmp_path / "critic")
