"""`vcppo sft`, `vcppo rm` and `vcppo eval` on a tiny model with the real engines."""
import json

import pytest

from tests.conftest import vcppo

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_sft_lowers_nll_and_exports_a_loadable_checkpoint(tiny_artifacts, tmp_path):
    art = tiny_artifacts
    res = vcppo("sft", "--model", art / "tiny", "--train", art / "data/train.parquet", "--val",
                art / "data/val.parquet", "--out", tmp_path / "sft", "--steps", "8", "--batch-size", "8",
                "--micro-batch-size", "4", "--lr", "3e-3", "--warmup-steps", "1", "--eval-prompts", "4",
                "--max-new-tokens", "32", "--no-wandb", cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "sft" / "sft_summary.json").read_text())
    assert summary["steps"] == 8 and 0.0 <= summary["val/pass@1_greedy"] <= 1.0
    nll = [json.loads(l)["sft/nll_token"] for l in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()
           if json.loads(l)["phase"] == "sft"]
    assert nll[-1] < nll[0] - 0.5, nll  # a random 0.5M model learns the trace alphabet fast
    from transformers import AutoModelForCausalLM, AutoTokenizer
    AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    assert AutoTokenizer.from_pretrained(tmp_path / "sft").convert_tokens_to_ids("<think>") is not None


def test_rm_trains_at_the_final_token_and_loads_as_a_critic(tiny_artifacts, tmp_path):
    art = tiny_artifacts
    res = vcppo("rm", "--policy", art / "tiny", "--train", art / "data/train.parquet", "--out", tmp_path / "rm",
                "--prompts", "10", "--samples-per-prompt", "2", "--epochs", "1", "--batch-size", "4",
                "--micro-batch-size", "4", "--max-new-tokens", "24", "--no-wandb", cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "rm" / "rm_summary.json").read_text())
    assert summary["heldout_samples"] == 4 and summary["train_samples"] == 16
    from vcppo.models.value_model import ValueModel, is_value_model_dir
    assert is_value_model_dir(str(tmp_path / "rm"))
    ValueModel.from_pretrained(str(tmp_path / "rm"))


def test_eval_reports_pass_at_k(tiny_artifacts, tmp_path):
    art = tiny_artifacts
    res = vcppo("eval", "--model", art / "tiny", "--data", art / "data/test.parquet", "--max-prompts", "4",
                "--n", "2", "--k", "1,2", "--max-tokens", "16", "--json", tmp_path / "m.json", cwd=tmp_path,
                check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["val/num_prompts"] == 4 and {"val/pass@1", "val/pass@2", "val/pass@1_greedy"} <= set(m)
    bad = vcppo("eval", "--model", art / "tiny", "--data", art / "data/test.parquet", "--n", "2", "--k", "4",
                cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "--k" in bad.stderr
