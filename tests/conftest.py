"""Shared test set-up: CPU determinism, the `gpu` marker gate, and tiny local artifacts."""
import os

import pytest

# Keep vLLM in-process (one engine per test process) and DeepSpeed on the CPU accelerator.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing means the install is broken anyway
        has_cuda = False
    if has_cuda:
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (run on a GPU machine: launch/gpu_check.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


ENV = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", WANDB_MODE="offline", PYTHONUNBUFFERED="1",
           DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"))


def vcppo(*args, cwd, check=True, timeout=600, **kw):
    """Run the `vcppo` CLI in a subprocess, as a user does."""
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "vcppo.cli", *map(str, args)], cwd=cwd, env=ENV, check=check,
                          capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory):
    """Task data, a tiny random Qwen2 policy, and an RM-format value model made from it."""
    root = tmp_path_factory.mktemp("artifacts")
    vcppo("data", "make", "--task", "add", "--out", "data", "--n", "200", "--n-eval", "16", cwd=root)
    vcppo("model", "make", "--size", "tiny", "--out", "tiny", cwd=root)
    from vcppo.models.value_model import ValueModel
    ValueModel.from_policy(str(root / "tiny")).save_pretrained(str(root / "rm"), tokenizer_src=str(root / "tiny"))
    return root


@pytest.fixture(scope="module")
def info():
    """The process's distributed set-up (one rank, gloo) for a test module's real engines; torn
    down after the module, so every module starts from a clean default group."""
    from vcppo.engines import dist
    info = dist.init_distributed("cpu")
    yield info
    dist.shutdown()
