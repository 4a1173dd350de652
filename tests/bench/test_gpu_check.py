"""launch/gpu_check.sh on the CPU machine: the dry-run plan (TP size by GPU count, every config key of
its training run valid) and its CPU-safe Python parts (bf16 error, GAE bandwidth, run summary)."""
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from vcppo.bench import gpu_check
from vcppo.bench.mismatch import _parse as parse_mismatch_args
from vcppo.config import load_config
from vcppo.tracking import MetricsLogger

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch/gpu_check.sh"


def dry_run(out: Path, **env) -> dict[str, str]:
    res = subprocess.run([str(SCRIPT), str(out)], env=dict(os.environ, DRY_RUN="1", **env), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert (out / "summary.txt").read_text() == res.stdout
    steps = {}
    for line in res.stdout.splitlines():
        name, _, cmd = line.split("] ", 1)[1].partition(": ")
        steps[name] = cmd
    return steps


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


@pytest.mark.parametrize("gpus,tp", [("0", 1), ("1", 1), ("2", 2), ("8", 2)])
def test_dry_run_plans_every_step_with_tp_by_gpu_count(tmp_path, gpus, tp):
    steps = dry_run(tmp_path / "out", NUM_GPUS=gpus)
    split = ["train_split", "train_split_summary"] if tp == 2 else []  # split placement needs 2 GPUs
    assert list(steps) == ["plan", "bf16", "gpu_tests", "bench_gae", "gae_bandwidth", "vcppo_plan", "sleep_wake", "mismatch",
                           "make_data", "make_model", "train", "train_summary", "train_7b_preset",
                           "train_7b_preset_summary", *split, "done"]
    assert f"tensor_parallel_size={tp} over {tp} rank" in steps["plan"]
    train = shlex.split(steps["train"])
    assert f"NUM_GPUS={tp}" in train and f"rollout.tensor_parallel_size={tp}" in train
    assert "-m gpu" in steps["gpu_tests"] and not (tmp_path / "out" / "bf16.json").exists()  # nothing ran
    assert "vcppo.cli plan vcppo" in steps["vcppo_plan"]


def test_dry_run_training_overrides_are_valid_config(tmp_path):
    steps = dry_run(tmp_path / "out", NUM_GPUS="2")
    train = shlex.split(steps["train"])
    preset = train.index("launch/single_node.sh") + 1
    cfg = load_config(train[preset], train[preset + 1:])  # a typo in the script raises here
    assert cfg.model.dtype == "bfloat16" and cfg.algorithm.rollout_is_cap == 2.0
    assert cfg.trainer.prompts_per_step % 2 == 0  # divisible by the 2 ranks
    seven_b = shlex.split(steps["train_7b_preset"])
    preset = seven_b.index("launch/single_node.sh") + 1
    cfg = load_config(seven_b[preset], seven_b[preset + 1:])
    assert seven_b[preset] == "vcppo_7b_1node" and cfg.actor.gradient_checkpointing and cfg.algorithm.kl_coef == 0
    assert cfg.trainer.prompts_per_step % (2 * cfg.actor.ppo_mini_batches) == 0
    split = shlex.split(steps["train_split"])
    preset = split.index("launch/single_node.sh") + 1
    cfg = load_config(split[preset], split[preset + 1:])
    assert "NUM_GPUS=2" in split and cfg.placement.mode == "split" and cfg.trainer.max_staleness == 1
    mismatch = shlex.split(steps["mismatch"])
    args = parse_mismatch_args(mismatch[mismatch.index("mismatch") + 1:])
    assert args.dtypes == "float32,bfloat16" and args.json.endswith("mismatch.json")


def test_output_dir_comes_from_the_argument_or_the_environment(tmp_path):
    res = subprocess.run([str(SCRIPT)], env=dict(os.environ, DRY_RUN="1", GPU_CHECK_OUT=str(tmp_path / "env")),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and (tmp_path / "env" / "summary.txt").exists()


def test_bf16_check_on_cpu():
    res = gpu_check.bf16_check("cpu")
    # bf16 keeps 8 bits of mantissa: relative error around 2^-9, far above fp32's, far below 1
    assert 1e-4 < res["matmul_rel_err"] < 2e-2
    assert 0 < res["logprob_abs_err_mean"] < res["logprob_abs_err_max"] < 0.2


def test_gae_bandwidth_from_a_bench_json():
    bench = {"results": [{"B": 1024, "T": 4096, "device": "cuda", "floor": {"median_ms": 1.0},
                          "fused_torch": {"median_ms": 4.0}, "fused_triton": {"median_ms": 1.25},
                          "fused_impl": "triton", "ref_x2": {"median_ms": 900.0}}]}
    (row,) = gpu_check.gae_bandwidth(bench)["rows"]
    nbytes = 5 * 4 * 1024 * 4096
    assert row["bytes"] == nbytes
    assert row["floor_gb_s"] == pytest.approx(nbytes / 1e-3 / 1e9)
    assert row["triton_gb_s"] == pytest.approx(row["floor_gb_s"] / 1.25)
    assert row["triton_share_of_floor"] == pytest.approx(0.8) and row["torch_share_of_floor"] == pytest.approx(0.25)
    assert "ref_x2_gb_s" not in row


def test_train_summary_reads_the_run_metrics(tmp_path):
    log = MetricsLogger(tmp_path, {}, use_wandb=False, progress_bar=False)
    log.log({"critic/value_loss": 0.5, "time/rollout_s": 1.0, "time/step_s": 2.0}, step=1, phase="value_pretrain")
    for step in (2, 1):
        log.log({"perf/rollout_tokens_per_s": 100.0 * step, "mismatch/kl_k3": 1e-4, "mismatch/tis_weight_mean": 1.0,
                 "time/rollout_s": 0.5, "time/actor_update_s": 1.5, "time/step_s": 2.0}, step=step, phase="ppo")
    log.close()
    out = tmp_path / "summary.json"
    assert gpu_check.main(["train-summary", str(tmp_path), str(out)]) == 0
    summary = json.loads(out.read_text())
    assert [r["step"] for r in summary["ppo"]] == [1, 2]
    assert summary["ppo"][1]["perf/rollout_tokens_per_s"] == 200.0 and summary["ppo"][0]["mismatch/kl_k3"] == 1e-4
    assert summary["ppo"][0]["phase_s"] == {"rollout": 0.5, "actor_update": 1.5}
    assert summary["value_pretrain"][0]["phase_s"] == {"rollout": 1.0}


def test_sleep_wake_says_why_it_skips_on_cpu(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine this runs vLLM (launch/gpu_check.sh does)")
    assert gpu_check.main(["sleep-wake", str(tmp_path / "sw.json")]) == 0
    assert "no CUDA" in json.loads((tmp_path / "sw.json").read_text())["skipped"]
