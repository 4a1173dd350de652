"""launch/gpu_check.sh on the CPU machine: the dry-run plan (TP size by GPU count, every config key of
its training run valid), the steps it skips, and why, where a package (vllm, deepspeed) does not import,
its CPU-safe Python parts (bf16 error, GAE bandwidth, run summary, the logprob-memory test's helpers),
and the DeepSpeed accelerator the test tree picks."""
import json
import os
import shlex
import subprocess
import sys
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
    assert list(steps) == ["plan", "bf16", "gpu_tests", "logprob_memory", "logprob_memory_json", "bench_gae",
                           "gae_bandwidth", "vcppo_plan", "sleep_wake", "mismatch", "make_data", "make_model", "train",
                           "train_summary", "train_7b_preset", "train_7b_preset_summary", *split, "done"]
    assert not any("SKIPPED" in cmd for cmd in steps.values())  # this venv has vllm and deepspeed
    assert f"tensor_parallel_size={tp} over {tp} rank" in steps["plan"]
    train = shlex.split(steps["train"])
    assert f"NUM_GPUS={tp}" in train and f"rollout.tensor_parallel_size={tp}" in train
    assert "-m gpu" in steps["gpu_tests"] and not (tmp_path / "out" / "bf16.json").exists()  # nothing ran
    assert "vcppo.cli plan vcppo" in steps["vcppo_plan"]
    # the logprob-memory test runs once, in its own step, its figures in the output dir
    assert "--ignore=tests/gpu/test_logprob_memory.py" in steps["gpu_tests"]
    memory = shlex.split(steps["logprob_memory"])
    assert f"GPU_CHECK_OUT={tmp_path / 'out'}" in memory and memory[-1] == "tests/gpu/test_logprob_memory.py"
    assert steps["logprob_memory_json"] == f"cat {tmp_path / 'out' / 'logprob_memory.json'}"


VLLM_STEPS = ["sleep_wake", "mismatch", "train", "train_summary", "train_7b_preset", "train_7b_preset_summary"]


def fake_python(tmp_path: Path, missing: tuple[str, ...], gpu_machine: bool = False) -> Path:
    """A stand-in for the venv's python where the ``missing`` packages do not import (the GPU machine
    has no vLLM). ``gpu_machine``: it also passes the script's CUDA check and, instead of running a
    step, records it (with its DS_ACCELERATOR) in ``calls.log``; the logprob-memory test writes its JSON."""
    fake = tmp_path / "python"
    hide = "".join(f"  *\"import {m}\"*|*\"find_spec('{m}')\"*) echo \"ModuleNotFoundError: No module named "
                   f"'{m}'\" >&2; exit 1;;\n" for m in missing)
    if gpu_machine:
        rest = (f'  *"import torch, sys"*) echo "torch fake cuda True"; exit 0;;\n'
                f'  *"-m pytest"*test_logprob_memory.py*) echo \'{{"ok": true}}\' > "$GPU_CHECK_OUT/logprob_memory.json";;\n'
                f'esac\necho "$DS_ACCELERATOR $*" >> {tmp_path / "calls.log"}\n')
    else:
        rest = f'esac\nexec {sys.executable} "$@"\n'
    fake.write_text(f'#!/bin/bash\ncase "$*" in\n{hide}{rest}')
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("gpus", ["1", "2"])
def test_dry_run_without_vllm_skips_only_the_steps_that_need_it(tmp_path, gpus):
    steps = dry_run(tmp_path / "out", NUM_GPUS=gpus, PY=str(fake_python(tmp_path, ("vllm",))))
    skipped = VLLM_STEPS + (["train_split", "train_split_summary"] if gpus == "2" else [])
    for name in skipped:
        assert steps[name].startswith("SKIPPED, needs vllm, not importable here (vllm: not found by "), steps[name]
    ran = [name for name, cmd in steps.items() if not cmd.startswith("SKIPPED")]
    assert ran == ["plan", "bf16", "gpu_tests", "logprob_memory", "logprob_memory_json", "bench_gae", "gae_bandwidth",
                   "vcppo_plan", "make_data", "make_model", "skipped", "not importable", "done"]
    assert steps["skipped"] == " ".join(skipped)
    assert steps["not importable"].startswith("vllm (not found by ") and steps["done"] == "status 0"


def test_dry_run_without_deepspeed_also_skips_the_logprob_memory_step(tmp_path):
    steps = dry_run(tmp_path / "out", NUM_GPUS="1", PY=str(fake_python(tmp_path, ("vllm", "deepspeed"))))
    assert steps["logprob_memory"].startswith("SKIPPED, needs deepspeed, not importable here (deepspeed: not found")
    assert steps["mismatch"].startswith("SKIPPED, needs vllm, deepspeed, not importable here (vllm: not found by ")
    assert "deepspeed: not found by" in steps["mismatch"]
    assert steps["skipped"].split() == ["logprob_memory", "logprob_memory_json", *VLLM_STEPS]
    assert not steps["gpu_tests"].startswith("SKIPPED") and not steps["make_model"].startswith("SKIPPED")


def test_a_run_without_vllm_runs_the_other_steps_on_cuda_and_says_what_it_skipped(tmp_path):
    """Not a dry run: the import checks import, and each step that needs no vllm runs (here: the fake
    python records it), with DS_ACCELERATOR=cuda whatever the caller's environment held."""
    fake = fake_python(tmp_path, ("vllm",), gpu_machine=True)
    out = tmp_path / "out"
    res = subprocess.run([str(SCRIPT), str(out)], env=dict(os.environ, PY=str(fake), NUM_GPUS="1", DS_ACCELERATOR="cpu"),
                         capture_output=True, text=True, timeout=120)
    summary = (out / "summary.txt").read_text()
    assert res.returncode == 0, summary + res.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert {c.split()[0] for c in calls} == {"cuda"}
    ran = [c.split(" ", 1)[1] for c in calls]
    assert ran.count("-c import deepspeed") == 1  # asked once, at the first step that needs it
    assert ran.index("-c import deepspeed") < ran.index("-m pytest -m gpu -q -rs -p no:cacheprovider tests/gpu/test_logprob_memory.py")
    assert [c for c in ran if "vcppo.bench.gpu_check" in c or "vcppo.cli" in c or "pytest" in c] == [
        f"-m vcppo.bench.gpu_check bf16 {out}/bf16.json",
        "-m pytest -m gpu -q -p no:cacheprovider --ignore=tests/gpu/test_logprob_memory.py tests",
        "-m pytest -m gpu -q -rs -p no:cacheprovider tests/gpu/test_logprob_memory.py",
        f"-m vcppo.cli bench gae --json {out}/bench_gae.json",
        f"-m vcppo.bench.gpu_check gae-bandwidth {out}/bench_gae.json {out}/gae_bandwidth.json",
        f"-m vcppo.cli plan vcppo --model-shape qwen2.5-7b --gpu h200 --json {out}/plan_7b_h200.json",
        f"-m vcppo.cli data make --task add --out {out}/work/data --n 2000 --n-eval 64",
        f"-m vcppo.cli model make --size tiny --out {out}/work/model"]
    assert json.loads((out / "logprob_memory_json.log").read_text()) == {"ok": True}
    for name in VLLM_STEPS:
        assert f"] {name}: SKIPPED, needs vllm, not importable here (vllm: ModuleNotFoundError: No module named 'vllm')" \
            in summary
    assert f"] skipped: {' '.join(VLLM_STEPS)}\n" in summary
    assert "] not importable: vllm (ModuleNotFoundError: No module named 'vllm')\n" in summary
    assert summary.endswith("done: status 0\n") and "FAILED" not in summary


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


# --- tests/gpu/test_logprob_memory.py's helpers (its test needs CUDA) ----------------------------
def test_logprob_memory_figures_go_under_gpu_check_out_else_out(tmp_path):
    from tests.gpu.test_logprob_memory import JSON_NAME, figures_path, write_figures

    assert figures_path({}) is None and write_figures({"x": 1}, {}) is None
    assert figures_path({"OUT": str(tmp_path / "o")}) == tmp_path / "o" / JSON_NAME
    env = {"OUT": str(tmp_path / "o"), "GPU_CHECK_OUT": str(tmp_path / "g" / "sub")}
    path = write_figures({"ok": True, "ratio": 3.5}, env)
    assert path == tmp_path / "g" / "sub" / JSON_NAME and json.loads(path.read_text()) == {"ok": True, "ratio": 3.5}
    assert not (tmp_path / "o").exists()


def test_logprob_memory_shape_is_qwen25_05b_and_its_batch_unpadded():
    from tests.gpu.test_logprob_memory import (CHUNKED, FIRST_ID, PROMPT, RESPONSE, fp32_logits_gib, shape_config,
                                               token_lists)
    from vcppo.experience import make_layout
    from vcppo.models.shapes import BUILTIN_SHAPES
    from vcppo.schema import EngineConfig

    assert EngineConfig().logprob_chunk_size == CHUNKED
    config, tokenizer = shape_config()
    ref = BUILTIN_SHAPES["qwen2.5-0.5b"]
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.vocab_size) == (896, 24, 14, 2, 4864, 151936) == (
        ref.hidden_size, ref.num_layers, ref.num_heads, ref.num_kv_heads, ref.intermediate_size, ref.vocab_size)
    assert config.tie_word_embeddings and config.max_position_embeddings >= PROMPT + RESPONSE
    assert fp32_logits_gib(config) == pytest.approx(4 * 4096 * 151936 * 4 / 2 ** 30)  # 9.27 GiB
    prompts, responses = token_lists(config.vocab_size, rows=2, prompt=3, response=5)
    assert [len(p) for p in prompts] == [3, 3] and [len(r) for r in responses] == [5, 5]
    assert min(map(min, prompts + responses)) >= FIRST_ID and max(map(max, prompts + responses)) < config.vocab_size
    batch = make_layout(prompts, responses, pad_id=tokenizer.pad_token_id)
    assert batch.input_ids.shape == (2, 8) and bool(batch.response_mask.all())
    assert token_lists(config.vocab_size, rows=2, prompt=3, response=5) == (prompts, responses)  # seeded


# --- the DeepSpeed accelerator of the test processes (tests/conftest.py) ---------------------------
@pytest.mark.parametrize("cuda", [False, True])
def test_the_test_tree_gives_deepspeed_cuda_where_there_is_a_gpu(cuda):
    """`pytest -m gpu tests` (launch/gpu_check.sh) imports tests/conftest.py and tests/engines/conftest.py
    before any test: on a CUDA machine they must leave DeepSpeed on CUDA, elsewhere on the CPU."""
    code = ("import os, torch\n"
            f"torch.cuda.is_available = lambda: {cuda}\n"
            "import tests.conftest, tests.engines.conftest, tests.gpu.test_cuda_paths\n"
            "print(os.environ['DS_ACCELERATOR'])\n")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[-1] == ("cuda" if cuda else "cpu")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(env, DS_ACCELERATOR="cpu"),
                         capture_output=True, text=True, timeout=120)
    assert res.stdout.split()[-1] == "cpu"  # one set by the caller wins
