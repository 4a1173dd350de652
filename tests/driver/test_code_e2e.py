"""The code task trains end to end with the code-execution reward: `vcppo data make --task code
--format verl`, then `vcppo train` whose rows of data_source vcppo/code are scored by running the
policy's programs in the sandbox, in the reward worker pool (real engines: vLLM CPU, DeepSpeed)."""
import pytest

from tests.conftest import vcppo
from tests.driver.test_train_e2e import base_overrides, train
from vcppo.tracking import read_metrics

pytestmark = [pytest.mark.integration]


@pytest.mark.slow
def test_code_task_trains_with_the_code_reward(tmp_path):
    vcppo("data", "make", "--task", "code", "--out", "code", "--n", "40", "--n-eval", "8", "--format", "verl",
          cwd=tmp_path)
    vcppo("model", "make", "--size", "tiny", "--out", "tiny", cwd=tmp_path)
    overrides = base_overrides(tmp_path, tmp_path, **{
        "data.train_files": tmp_path / "code/train.parquet", "data.val_files": tmp_path / "code/val.parquet",
        "data.answer_field": "reward_model.ground_truth", "trainer.val_max_prompts": 2,
        # partial credit, in [0, 1]: a reward the math verifier (-1 / +1) never gives
        "reward.functions_by_source.vcppo/code": "vcppo.rewards.code:pass_rate", "reward.num_workers": 1})
    res = train("grpo", overrides, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    ppo = sorted(read_metrics(tmp_path / "grpo-seed0", "ppo"), key=lambda r: r["step"])
    assert [r["step"] for r in ppo] == [1, 2] and all(r["reward/failures_total"] == 0.0 for r in ppo)
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in ppo), [r["reward/mean"] for r in ppo]
