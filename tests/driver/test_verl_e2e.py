"""A verl-format data file trains as it is: `vcppo data make --format verl`, then `vcppo train`
with data.answer_field=reward_model.ground_truth and a reward function picked by data_source,
which sees each row's extra_info (the real engines: vLLM CPU, DeepSpeed on gloo); metrics also go
to TensorBoard."""
import json
import textwrap

import pytest

from tests.conftest import vcppo
from tests.driver.test_train_e2e import base_overrides, train
from vcppo.tracking import read_metrics

pytestmark = [pytest.mark.integration]

RECORDING_REWARD = '''
import json, os
from vcppo.rewards.verifier import score

def add_reward(text, truth, data_source=None, extra_info=None, **info):
    """The built-in verifier's score; each call is recorded, so the test sees what arrived."""
    with open(os.environ.get("VERL_E2E_LOG", "calls.jsonl"), "a") as f:
        f.write(json.dumps({"data_source": data_source, "extra_info": extra_info, "truth": truth}) + "\\n")
    return score(text, truth, finish_reason=info.get("finish_reason"))
'''


@pytest.mark.slow
def test_verl_format_file_trains(tiny_artifacts, tmp_path):
    vcppo("data", "make", "--task", "add", "--out", "verl", "--n", "40", "--n-eval", "8", "--format", "verl",
          cwd=tmp_path)
    (tmp_path / "verl_e2e_reward.py").write_text(textwrap.dedent(RECORDING_REWARD))
    overrides = base_overrides(tiny_artifacts, tmp_path, **{
        "data.train_files": tmp_path / "verl/train.parquet", "data.val_files": tmp_path / "verl/val.parquet",
        "data.answer_field": "reward_model.ground_truth",
        "reward.functions_by_source.vcppo/add": "verl_e2e_reward:add_reward",
        "reward.num_workers": 1, "logging.wandb": False, "logging.tensorboard": True})
    res = train("grpo", overrides, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    ppo = sorted(read_metrics(tmp_path / "grpo-seed0", "ppo"), key=lambda r: r["step"])
    assert [r["step"] for r in ppo] == [1, 2] and all(r["reward/failures_total"] == 0.0 for r in ppo)
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    # 2 steps x 4 prompts x 2 samples, plus validation (greedy + pass@2 on 4 prompts, at steps 0 and 2)
    assert len(calls) >= 16 and {c["data_source"] for c in calls} == {"vcppo/add"}
    assert all(c["extra_info"]["split"] in ("train", "val") and isinstance(c["extra_info"]["index"], int)
               for c in calls)
    assert all(c["truth"].isdigit() for c in calls)  # the plain ground truth, from reward_model.ground_truth
    from tests.test_tracking import scalars
    board = scalars(tmp_path / "grpo-seed0")  # logging.tensorboard, beside metrics.jsonl
    assert [step for step, _ in board["ppo/reward/mean"]] == [1, 2]
