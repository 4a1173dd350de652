"""Any checkpoint as a model: `vcppo model export CHECKPOINT --out DIR` joins ZeRO-3 partitions and merges
LoRA adapters into what the run's own final export holds, and `vcppo eval` takes the checkpoint as MODEL."""
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
