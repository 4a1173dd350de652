"""Split placement end to end: real vLLM on a rollout rank, real DeepSpeed ZeRO-3 on a training
rank, two gloo processes (one thread each), started by hand as a launcher would start them, and under
torchrun where a rank is killed (the launcher's part in ending the job is tested there).

* synchronous (max_staleness 0) over 1 rollout + 1 training rank logs what a colocated run on one
  rank logs, and exports the same weights;
* one step ahead (max_staleness 1): every PPO batch after the first is one actor update old, the
  decoupled correction's statistics are logged; a real SIGKILL of the rollout rank takes the job
  down, non-zero, and the same command then resumes from the last checkpoint (whose in-flight
  batch was saved with it) and logs what the uninterrupted run logged.
"""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import ENV, run_ranks
from tests.driver.test_exact_resume_e2e import assert_same, records
from tests.driver.test_train_e2e import base_overrides
from vcppo.runtime.launch_env import free_port
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]

ONE_THREAD = dict(ENV, OMP_NUM_THREADS="1")  # torchrun's default per rank; the colocated run matches it
SPLIT_ONLY = ("staleness/", "time", "perf/", "rollout/asleep_while_training")  # wall times, and what only one placement measures (colocated: vLLM asleep while training)


def overrides(art, out, **extra):
    return base_overrides(art, out, **{"rollout.temperature": 1.0, "logging.wandb": False, **extra})


def torchrun(args, cwd, **kw):
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
            "-m", "vcppo.cli", "train", "vcppo", *args]


def run(cmd, cwd):
    res = subprocess.run(cmd, cwd=cwd, env=ONE_THREAD, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    return res


def comparable(recs):
    return [{k: v for k, v in r.items() if not k.startswith(SPLIT_ONLY)} for r in in_step_order(recs)]


def in_step_order(recs):
    """Records in the order a colocated run writes them. A split run logs a validation when its
    result arrives, which may be a step or two later: the training ranks do not wait for it."""
    return sorted(recs, key=lambda r: (r["phase"] != "value_pretrain", r["step"], r["phase"] == "val"))


def final_actor(run_dir):
    from safetensors.torch import load_file
    return load_file(str(next((run_dir / "final" / "actor").glob("*.safetensors"))))


def test_split_synchronous_logs_what_colocated_logs(tiny_artifacts, tmp_path):
    colocated, split = tmp_path / "colocated", tmp_path / "split"
    run_ranks("train", "vcppo", *overrides(tiny_artifacts, colocated), cwd=tmp_path, world_size=1, env=ONE_THREAD)
    err = run_ranks("train", "vcppo", *overrides(tiny_artifacts, split), "placement.mode=split", cwd=tmp_path,
                    env=ONE_THREAD)
    assert "split placement: 1 rollout rank(s) sample" in err
    want, got = records(colocated / "vcppo-seed0"), records(split / "vcppo-seed0")
    assert {k for r in got for k in r} - {k for r in want for k in r} == {"staleness/steps_behind"}
    assert [r["staleness/steps_behind"] for r in got if r["phase"] == "ppo" and "reward/mean" in r] \
        == [0.0, 0.0]
    assert_same(comparable(got), comparable(want))  # samples, rewards, losses, validation: to float tolerance
    a, b = final_actor(colocated / "vcppo-seed0"), final_actor(split / "vcppo-seed0")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)


@pytest.fixture(scope="module")
def one_step_ahead(tiny_artifacts, tmp_path_factory):
    """An uninterrupted split run one step ahead: (its arguments, its records)."""
    root = tmp_path_factory.mktemp("split_s1")
    args = overrides(tiny_artifacts, root, **{
        "placement.mode": "split", "trainer.max_staleness": 1, "algorithm.rollout_is_cap": 2.0,
        "trainer.total_steps": 4, "trainer.save_every": 2, "trainer.keep_last": 5})
    run_ranks("train", "vcppo", *args, cwd=root, env=ONE_THREAD)
    return args, in_step_order(records(root / "vcppo-seed0"))


def test_one_step_ahead_trains_on_batches_one_update_old(one_step_ahead):
    _, recs = one_step_ahead
    ppo = [r for r in recs if r["phase"] == "ppo" and "reward/mean" in r]
    assert [r["staleness/steps_behind"] for r in ppo] == [0.0, 1.0, 1.0, 1.0]
    # the decoupled correction: pi_old recomputed at train time, the stale sampler weighted in
    assert all(0.0 <= r["mismatch/tis_truncated_frac"] <= 1.0 and r["mismatch/tis_weight_mean"] > 0 for r in ppo)
    assert all(r["mismatch/logprob_abs_mean"] > 1e-4 for r in ppo[1:])  # stale: the policy moved


def _children(pid):
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [(int(line.split()[0]), line) for line in out.splitlines() if "vcppo.cli" in line]


@pytest.mark.extended
def test_a_killed_rollout_rank_ends_the_job_and_the_run_resumes_exactly(one_step_ahead, tmp_path):
    args, full = one_step_ahead
    args = [a if not a.startswith("trainer.output_root=") else f"trainer.output_root={tmp_path}" for a in args]
    proc = subprocess.Popen(torchrun(args, tmp_path), cwd=tmp_path, env=ONE_THREAD, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    ckpts = checkpoint_root(tmp_path / "vcppo-seed0")
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:  # the first PPO checkpoint (pretrain 2 + PPO 2)
        if any(p.name >= "step_000004" for p in list_complete(ckpts)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    assert (list_complete(ckpts)[-1] / "inflight.pt").exists()  # batch 3, sampled with step 1's weights
    workers = _children(proc.pid)
    assert len(workers) == 2
    killed_at = time.time()
    os.kill(workers[-1][0], signal.SIGKILL)  # the last rank: the rollout rank
    try:
        code = proc.wait(timeout=120)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    assert code != 0 and time.time() - killed_at < 120
    # it really was cut short: no final export (the trainer may still have checkpointed step 6 from the
    # batches the rollout rank had sent ahead before it died, then failed at the final validation)
    assert not (tmp_path / "vcppo-seed0" / "final").exists()

    err = run_ranks("train", "vcppo", *args, cwd=tmp_path, env=ONE_THREAD)
    assert "resuming from" in err
    assert_same(in_step_order(records(tmp_path / "vcppo-seed0")), full)


@pytest.mark.faults
def test_a_killed_training_rank_ends_the_job_and_the_run_resumes_exactly(one_step_ahead, tmp_path):
    """The training rank SIGKILLed as PPO step 3's actor update starts (tests/kill_at.py): the rollout
    rank, sampling ahead or waiting on the bridge, loses its peer, and torchrun ends the job
    non-zero; the same command resumes from step 2's checkpoint and logs the uninterrupted run."""
    from tests.driver.test_multirank_faults_e2e import REPO, launcher_command
    args, full = one_step_ahead
    args = [a if not a.startswith("trainer.output_root=") else f"trainer.output_root={tmp_path}" for a in args]
    cmd = [*launcher_command("torchrun", str(free_port())), "tests.kill_at", "0", "update", "3", "--",
           "train", "vcppo", *args]
    res = subprocess.run(cmd, cwd=tmp_path, env=dict(ONE_THREAD, PYTHONPATH=str(REPO)), capture_output=True,
                         text=True, timeout=900)
    ended = time.time()
    assert res.returncode != 0 and ended - float((tmp_path / "killed_at").read_text()) < 60, res.stderr[-3000:]
    run_dir = tmp_path / "vcppo-seed0"
    assert not (run_dir / "final").exists()
    assert list_complete(checkpoint_root(run_dir))[-1].name == "step_000004"  # pretraining 2 + PPO 2

    res = run(torchrun(args, tmp_path), tmp_path)
    assert "resuming from" in res.stderr
    assert_same(in_step_order(records(run_dir)), full)
