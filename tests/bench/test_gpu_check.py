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
from vcppo.config.load import load_config
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


LENT_STEPS = ["carry_list", "carry", "bf16", "gpu_tests", "logprob_memory", "logprob_memory_json", "make_data",
              "make_model", "train", "train_summary", "plan_train", "bench_step", "summary"]
FULL_STEPS = ["bench_gae", "gae_bandwidth", "vcppo_plan", "sleep_wake", "mismatch", "train_7b_preset",
              "train_7b_preset_summary"]


@pytest.mark.parametrize("gpus,tp", [("0", 1), ("1", 1), ("2", 2), ("8", 2)])
@pytest.mark.parametrize("profile", ["lent", "full"])
def test_dry_run_plans_every_step_with_tp_by_gpu_count(tmp_path, gpus, tp, profile):
    steps = dry_run(tmp_path / "out", NUM_GPUS=gpus, GPU_CHECK_PROFILE=profile,
                    PY=str(fake_python(tmp_path, (), present=("trl",))))
    split = ["train_split", "train_split_summary"] if tp == 2 else []  # split placement needs 2 GPUs
    extra = FULL_STEPS + split if profile == "full" else []
    assert list(steps) == ["plan", *LENT_STEPS, *extra, "done"]
    assert not any("SKIPPED" in cmd for cmd in steps.values())  # this venv has vllm and deepspeed (trl: faked)
    assert f"tensor_parallel_size={tp} over {tp} rank" in steps["plan"] and f"profile {profile}" in steps["plan"]
    train = shlex.split(steps["train"])
    assert f"rollout.tensor_parallel_size={tp}" in train
    assert (f"NUM_GPUS={tp}" in train) if tp == 2 else (train[1:5] == ["-m", "vcppo.cli", "train", "vcppo"])
    assert "-m gpu" in steps["gpu_tests"] and not (tmp_path / "out" / "bf16.json").exists()  # nothing ran
    # the logprob-memory test runs once, in its own step, its figures in the output dir
    assert "--ignore=tests/gpu/test_logprob_memory.py" in steps["gpu_tests"]
    memory = shlex.split(steps["logprob_memory"])
    assert f"GPU_CHECK_OUT={tmp_path / 'out'}" in memory and memory[-1] == "tests/gpu/test_logprob_memory.py"
    assert steps["logprob_memory_json"] == f"cat {tmp_path / 'out' / 'logprob_memory.json'}"
    assert "bench step --trl --size qwen2.5-0.5b-shape" in steps["bench_step"]


def fake_python(tmp_path: Path, missing: tuple[str, ...], gpu_machine: bool = False,
                present: tuple[str, ...] = ()) -> Path:
    """A stand-in for the venv's python where the ``missing`` packages do not import (the GPU machine
    has no vLLM) and the ``present`` ones are found (trl, which the carry installs). ``gpu_machine``: it
    also passes the script's CUDA check and, instead of running a step, records it (with its
    DS_ACCELERATOR) in ``calls.log``; the logprob-memory test writes its JSON."""
    fake = tmp_path / "python"
    hide = "".join(f"  *\"import {m}\"*|*\"find_spec('{m}')\"*) echo \"ModuleNotFoundError: No module named "
                   f"'{m}'\" >&2; exit 1;;\n" for m in missing)
    hide += "".join(f"  *\"find_spec('{m}')\"*) exit 0;;\n" for m in present)
    if gpu_machine:
        rest = (f'  *"import torch, sys"*) echo "torch fake cuda True"; exit 0;;\n'
                f'  *"-m pytest"*test_logprob_memory.py*) echo \'{{"ok": true}}\' > "$GPU_CHECK_OUT/logprob_memory.json";;\n'
                f'esac\necho "$DS_ACCELERATOR $*" >> {tmp_path / "calls.log"}\n')
    else:
        rest = f'esac\nexec {sys.executable} "$@"\n'
    fake.write_text(f'#!/bin/bash\ncase "$*" in\n{hide}{rest}')
    fake.chmod(0o755)
    return fake


VLLM_STEPS = ["sleep_wake", "mismatch", "train_7b_preset", "train_7b_preset_summary"]


@pytest.mark.parametrize("gpus", ["1", "2"])
def test_dry_run_without_vllm_skips_only_the_steps_that_need_it(tmp_path, gpus):
    steps = dry_run(tmp_path / "out", NUM_GPUS=gpus, GPU_CHECK_PROFILE="full",
                    PY=str(fake_python(tmp_path, ("vllm", "trl"))))
    skipped = ["bench_step", *VLLM_STEPS] + (["train_split", "train_split_summary"] if gpus == "2" else [])
    for name in skipped[1:]:
        assert steps[name].startswith("SKIPPED, needs vllm, not importable here (vllm: not found by "), steps[name]
    assert steps["bench_step"].startswith("SKIPPED, needs trl, not importable here")
    ran = [name for name, cmd in steps.items() if not cmd.startswith("SKIPPED")]
    # the RL step itself needs no vLLM: the hf engine samples (rollout.engine=auto)
    assert ran == ["plan", *[s for s in LENT_STEPS if s != "bench_step"], "bench_gae", "gae_bandwidth", "vcppo_plan",
                   "skipped", "not importable", "done"]  # one key for both packages
    assert "rollout.engine=auto" in steps["train"]
    assert steps["skipped"] == " ".join(skipped) and steps["done"] == "status 0"


def test_dry_run_without_deepspeed_also_skips_the_training_steps(tmp_path):
    steps = dry_run(tmp_path / "out", NUM_GPUS="1", PY=str(fake_python(tmp_path, ("vllm", "deepspeed"))))
    assert steps["logprob_memory"].startswith("SKIPPED, needs deepspeed, not importable here (deepspeed: not found")
    assert steps["train"].startswith("SKIPPED, needs deepspeed") and steps["bench_step"].startswith("SKIPPED, needs deepspeed")
    assert steps["skipped"].split() == ["logprob_memory", "logprob_memory_json", "train", "bench_step"]
    assert not steps["gpu_tests"].startswith("SKIPPED") and not steps["make_model"].startswith("SKIPPED")


def test_a_run_without_vllm_runs_the_rl_step_on_cuda_with_the_carried_wheels(tmp_path):
    """Not a dry run: the import checks import, and each step runs (here: the fake python records it),
    with DS_ACCELERATOR=cuda whatever the caller's environment held, and the carried wheels first on
    the path."""
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
    main = [c for c in ran if "vcppo.bench" in c or "vcppo.cli" in c or "pytest" in c]
    site = REPO / ".gpu_carry" / "site"
    assert main[:4] == [f"-m vcppo.bench.gpu_carry list .gpu_carry --json {out}/carry_list.json",
                        f"-m vcppo.bench.gpu_carry install .gpu_carry {site} --json {out}/carry.json",
                        f"-m vcppo.bench.gpu_check bf16 {out}/bf16.json",
                        "-m pytest -m gpu -q -p no:cacheprovider --ignore=tests/gpu/test_logprob_memory.py tests"]
    assert [c.split()[1:4] for c in main[4:]] == [
        ["pytest", "-m", "gpu"], ["vcppo.cli", "data", "make"], ["vcppo.cli", "model", "make"],
        ["vcppo.cli", "train", "vcppo"], ["vcppo.bench.gpu_check", "train-summary", f"{out}/work/runs/gpu-check"],
        ["vcppo.cli", "plan", "vcppo"], ["vcppo.cli", "bench", "step"], ["vcppo.bench.gpu_check", "summary", f"{out}/work/runs/gpu-check"]]
    assert json.loads((out / "logprob_memory_json.log").read_text()) == {"ok": True}
    assert "] not importable" not in summary and "SKIPPED" not in summary
    assert summary.endswith("done: status 0\n") and "FAILED" not in summary


def test_dry_run_training_overrides_are_valid_config(tmp_path):
    steps = dry_run(tmp_path / "out", NUM_GPUS="2", GPU_CHECK_PROFILE="full")
    train = shlex.split(steps["train"])
    preset = train.index("launch/single_node.sh") + 1
    cfg = load_config(train[preset], train[preset + 1:])  # a typo in the script raises here
    assert cfg.model.dtype == "bfloat16" and cfg.algorithm.rollout_is_cap == 2.0 and cfg.rollout.engine == "auto"
    assert cfg.actor.zero_stage == cfg.critic.zero_stage == cfg.reference.zero_stage == 3  # forced, not auto
    assert cfg.actor.logprob_chunk_size > 0 and cfg.actor.packed and cfg.critic.packed
    assert cfg.trainer.prompts_per_step % 2 == 0  # divisible by the 2 ranks
    plan = shlex.split(steps["plan_train"])
    assert plan[plan.index("plan") + 2:plan.index("--gpu")] == train[preset + 1:-2]  # the same config as the run
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


def test_skip_list_and_time_budget(tmp_path):
    steps = dry_run(tmp_path / "out", NUM_GPUS="1", GPU_CHECK_SKIP="gpu_tests,bench_step")
    assert steps["gpu_tests"] == steps["bench_step"] == "SKIPPED, named in GPU_CHECK_SKIP"
    assert steps["skipped"] == "gpu_tests bench_step"


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
    from vcppo.config.schema import EngineConfig

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
    assert batch.input_ids.shape == (2, 8) and bool(batch.policy_mask.all())
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
    if cuda:  # one set by the caller wins (over the cuda the tree would give)
        res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(env, DS_ACCELERATOR="cpu"),
                             capture_output=True, text=True, timeout=120)
        assert res.stdout.split()[-1] == "cpu"


# --- the carried wheels (vcppo/bench/gpu_carry.py) -----------------------------------------------
def _wheel(directory: Path, name: str, version: str, size: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}-{version}-py3-none-any.whl").write_bytes(b"\0" * size)


def test_carry_list_names_what_the_lent_image_lacks_at_the_versions_tested_here(tmp_path):
    from importlib import metadata
    from vcppo.bench import gpu_carry
    wheels = {w.name: w for w in gpu_carry.carry_list(tmp_path)}
    # what `vcppo train`, `vcppo plan` and `vcppo bench step --trl` import beyond torch / transformers / peft
    assert {"deepspeed", "omegaconf", "pydantic", "datasets", "pyarrow", "math-verify", "trl"} <= set(wheels)
    assert not {"torch", "transformers", "peft", "accelerate", "vllm"} & set(wheels)
    assert wheels["deepspeed"].version == metadata.version("deepspeed") and wheels["trl"].version == "1.12.0"
    assert all(w.file is None for w in wheels.values())
    _wheel(tmp_path / "part2", "omegaconf", wheels["omegaconf"].version, 1000)
    _wheel(tmp_path / "part1", "omegaconf", "0.0.1", 5)  # another version: not ours
    (w,) = [w for w in gpu_carry.carry_list(tmp_path) if w.file]
    assert (w.name, w.bytes, w.file.startswith("part2/")) == ("omegaconf", 1000, True)
    s = gpu_carry.summary(tmp_path)
    assert s["total_bytes"] == 1000 and "omegaconf" not in s["missing"] and not s["fits_one_call"]


def test_carry_parts_each_fit_one_call():
    from vcppo.bench.gpu_carry import Wheel, parts
    mib = 2 ** 20
    wheels = [Wheel("pyarrow", "pyarrow", "1", "pyarrow.whl", 53 * mib), Wheel("pandas", "pandas", "1", "pandas.whl",
              12 * mib), Wheel("ds", "ds", "1", "ds.whl", 2 * mib), Wheel("a", "a", "1", "a.whl", 1 * mib),
              Wheel("none", "none", "1")]
    assert parts(wheels, limit=56 * mib) == [["pyarrow.whl", "ds.whl", "a.whl"], ["pandas.whl"]]
    assert parts(wheels, limit=100 * mib) == [["pyarrow.whl", "pandas.whl", "ds.whl", "a.whl"]]


def test_carry_install_puts_only_what_does_not_import_into_the_site(tmp_path):
    """A real pip install (no index, no dependencies) of a wheel built here, into the site the script
    puts first on PYTHONPATH; a carried package that already imports is left alone."""
    from vcppo.bench import gpu_carry
    src = tmp_path / "src"
    (src / "vcppo_carry_probe").mkdir(parents=True)
    (src / "vcppo_carry_probe" / "__init__.py").write_text("VALUE = 7\n")
    (src / "pyproject.toml").write_text('[project]\nname = "vcppo_carry_probe"\nversion = "1.0"\n'
                                        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n')
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "carry" / "part1"), str(src)], check=True, capture_output=True)
    carried = (("vcppo_carry_probe", "vcppo_carry_probe"), ("omegaconf", "omegaconf"))
    pinned = {"vcppo_carry_probe": "1.0"}
    import unittest.mock as mock
    with mock.patch.object(gpu_carry, "CARRIED", carried), mock.patch.dict(gpu_carry.PINNED, pinned):
        res = gpu_carry.install(str(tmp_path / "carry"), str(tmp_path / "site"))
    assert res == {"installed": ["vcppo_carry_probe"], "already_there": ["omegaconf"]}
    out = subprocess.run([sys.executable, "-c", "import vcppo_carry_probe as m; print(m.VALUE)"], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")))
    assert out.stdout.strip() == "7"


# --- DRY_RUN=tiny: the same commands at the tiny shape on this CPU, for real -------------------------
def tiny_run(out: Path, skip: str) -> tuple[dict[str, str], str]:
    env = dict(os.environ, DRY_RUN="tiny", GPU_CHECK_ENGINE="hf", GPU_CHECK_SKIP=skip, PY=sys.executable)
    res = subprocess.run([str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=900)
    summary = (out / "summary.txt").read_text()
    assert res.returncode == 0, summary + res.stderr[-3000:]
    steps = {}
    for line in summary.splitlines():
        name, _, cmd = line.split("] ", 1)[1].partition(": ")
        steps.setdefault(name, []).append(cmd)
    return steps, summary


@pytest.mark.slow
def test_tiny_rehearsal_lists_the_carry_and_plans_the_runs_config(tmp_path):
    """The fast part: the carry list, the data and model at the tiny shape, and `vcppo plan` of the
    training run's exact config (the rest of the rehearsal: the next test)."""
    steps, summary = tiny_run(tmp_path / "out", "carry,bf16,gpu_tests,logprob_memory,train,bench_step,summary")
    assert "CPU rehearsal at the tiny shape" in steps["plan"][0] and "FAILED" not in summary
    for name in ("carry_list", "make_data", "make_model", "plan_train"):
        assert steps[name][-1].startswith("ok ("), (name, steps[name])
    carry = json.loads((tmp_path / "out" / "carry_list.json").read_text())
    assert {"deepspeed", "trl", "pyarrow"} <= {w["name"] for w in carry["wheels"]}
    plan = json.loads((tmp_path / "out" / "plan_train.json").read_text())
    assert plan["params"]["policy"] < 10 ** 6 and plan["plan"]["dtype_bytes"] == 2  # tiny, bf16
    assert all(e["zero_stage"] == 3 for e in plan["plan"]["engines"])


@pytest.mark.slow
@pytest.mark.extended
def test_tiny_rehearsal_runs_the_step_and_writes_one_summary(tmp_path):
    """The whole CPU rehearsal but the pytest steps: `vcppo train` (bf16, ZeRO-3, chunked, packed, hf),
    `vcppo bench step --trl` where the carry gives TRL, and the one JSON summary."""
    steps, summary = tiny_run(tmp_path / "out", "gpu_tests,logprob_memory")
    for name in ("carry", "bf16", "train", "train_summary", "plan_train", "summary"):
        assert steps[name][-1].startswith("ok ("), (name, steps[name])
    result = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert result["steps"] == 3 and result["steps_timed"] == 2 and result["policy_params"] < 10 ** 6
    assert {"rollout", "actor_update", "critic_update"} <= set(result["phase_s"])
    assert all(0 < v < 1 for v in result["mfu_over_response_tokens"].values())
    assert result["plan_need_gib"] and result["peak_memory_gib"] is None  # no CUDA here
    if steps["bench_step"][-1].startswith("ok ("):  # TRL came with the carry
        assert set(result["bench_step"]["mb8"]) >= {"vcppo", "trl", "ratio_step"}
    else:
        assert steps["bench_step"][0].startswith("SKIPPED, needs trl")


def test_phase_mfu_counts_2n_per_forward_token_and_6n_or_8n_per_update_token():
    mfu = gpu_check.phase_mfu({"rollout": 2.0, "actor_update": 3.0, "critic_update": 4.0, "advantages": 0.1},
                              tokens=1000, params=10 ** 6, peak_flops=1e9, checkpointing=False)
    assert mfu == pytest.approx({"rollout": 2e9 / 2.0 / 1e9, "actor_update": 6e9 / 3.0 / 1e9,
                                 "critic_update": 6e9 / 4.0 / 1e9})  # no cost model for advantages
    ckpt = gpu_check.phase_mfu({"actor_update": 3.0}, 1000, 10 ** 6, 1e9, checkpointing=True)
    assert ckpt["actor_update"] == pytest.approx(8e9 / 3.0 / 1e9)
