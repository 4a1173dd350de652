"""`vcppo train` rerun in its run directory with an edited config: a change to the math is refused in
one line before any engine starts (and runs when allowed, recorded in config_history.jsonl); a
LoRA rank the checkpoint cannot load is one line too; each checkpoint holds the config that wrote it."""
import json

import pytest

from tests.driver.test_train_e2e import base_overrides, train
from vcppo.config.provenance import read_history
from vcppo.driver.durability.run_dir import RUN_CONFIG

pytestmark = [pytest.mark.integration]


def _vcppo_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("vcppo train:")]


@pytest.mark.slow
def test_an_edited_rerun_is_refused_then_allowed_and_recorded(tiny_artifacts, tmp_path):
    over = base_overrides(tiny_artifacts, tmp_path, **{"trainer.total_steps": 1, "value_pretrain.enabled": False})
    res = train("vcppo", over, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    run = tmp_path / "vcppo-seed0"
    point = run / "checkpoints" / "step_000001"
    assert json.loads((point / RUN_CONFIG).read_text())["config"]["algorithm"]["lambda_actor"] == 0.95

    # the math changed: refused before vLLM starts, naming the key with both values
    res = train("vcppo", over + ["algorithm.lambda_actor=0.5", "trainer.total_steps=2"], cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-4000:]
    assert "algorithm.lambda_actor 0.95 -> 0.5" in res.stderr and len(_vcppo_lines(res.stderr)) == 1
    assert "rollout engine:" not in res.stderr and "Traceback" not in res.stderr
    # a LoRA rank the checkpoint's tensors do not have: one line, before any engine
    res = train("vcppo", over + ["actor.lora.rank=4", "trainer.total_steps=2"], cwd=tmp_path)
    assert res.returncode == 2 and "config key 'actor.lora.rank': 0 in checkpoint" in res.stderr, res.stderr[-4000:]
    assert "rollout engine:" not in res.stderr and "Traceback" not in res.stderr
    assert len(read_history(run)) == 1  # refused runs record nothing, and config.yaml is the first run's
    assert "lambda_actor: 0.95" in (run / "config.yaml").read_text()

    # allowed: it resumes, says what changed, and the run directory records it
    res = train("vcppo", over + ["algorithm.lambda_actor=0.5", "trainer.total_steps=2",
                                 "trainer.resume_allow_changes=[algorithm.lambda_actor]"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "resuming with a changed config: algorithm.lambda_actor 0.95 -> 0.5" in res.stderr
    first, second = read_history(run)
    assert first["phase"] == "start" and first["changes"] == {}
    assert second["step"] == 1 and second["resumed_from"].endswith("step_000001")
    assert second["changes"]["algorithm.lambda_actor"] == {"old": 0.95, "new": 0.5, "class": "math"}
    assert second["changes"]["trainer.total_steps"]["class"] == "free"
    assert "algorithm.lambda_actor=0.5" in second["command"]
    assert "lambda_actor: 0.5" in (run / "config.yaml").read_text()
