"""The main job, `vcppo demo`, end to end at a tiny size: every stage (data, model, SFT, value
pretraining + VC-PPO, both evaluations, the report) runs as `make demo` runs it, a few steps each,
so CI notices when the demo breaks. Its figures are not judged here (the real run's are in
docs/results.md); that every stage wrote what the next one reads is."""
import json

import pytest

from tests.conftest import vcppo

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY = ["demo.model_size=tiny", "sft.steps=6", "sft.max_minutes=0", "sft.eval_prompts=4", "sft.batch_size=8",
        "sft.micro_batch_size=8", "value_pretrain.steps=2", "trainer.total_steps=2", "trainer.prompts_per_step=4",
        "rollout.n_samples_per_prompt=2", "rollout.max_response_tokens=24", "trainer.val_max_prompts=4",
        "trainer.val_n_samples=2", "trainer.val_k=[1,2]", "eval.max_prompts=4", "eval.n_samples=2",
        "eval.k=[1,2]", "logging.wandb=false", "logging.progress_bar=false", "actor.micro_batch_size=4",
        "critic.micro_batch_size=4"]


def test_the_demo_runs_every_stage_and_resumes_as_done(tmp_path):
    res = vcppo("demo", f"demo.workdir={tmp_path / 'w'}", f"trainer.output_root={tmp_path / 'runs'}", *TINY,
                cwd=tmp_path, timeout=900)
    run = tmp_path / "runs" / "demo-vcppo"
    summary = json.loads((run / "demo_summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == ["data", "model", "sft", "train", "eval-sft", "eval-rl",
                                                      "report"]
    assert summary["sft"]["steps"] == 6
    for name in ("sft", "rl"):
        assert 0.0 <= summary["test"][name]["val/pass@1_greedy"] <= 1.0
    assert (run / "report" / "report.md").exists() and list((run / "report").glob("*.png"))
    assert "=== demo done" in res.stdout and "Test greedy pass@1" in res.stdout
    # A second call finds every stage's output and only redraws the report.
    again = vcppo("demo", f"demo.workdir={tmp_path / 'w'}", f"trainer.output_root={tmp_path / 'runs'}", *TINY,
                  cwd=tmp_path, timeout=300)
    assert "=== [train]" not in again.stdout and "=== [report]" in again.stdout
