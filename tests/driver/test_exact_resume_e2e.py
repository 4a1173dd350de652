"""Exact resume on every path, real engines, cosine schedules for actor and critic. A kill is
reproduced exactly: from a finished run's directory, the checkpoints after the kill point, the
final export and the metrics logged after it are removed. Everything else stays, the published
critic cache included. The rerun must then log what the uninterrupted run logged, record for
record, with no duplicates. The run carries state beyond the engines (an adaptive KL coefficient,
a reward model's running score moments), so a resume that lost it would log other figures.
  (b) a kill after the pretrained critic is published but before the first PPO checkpoint:
      pretraining resumes from its own checkpoint (it does not take the cached critic), and
      `val 0` is logged once;
  (a)+(c) a kill after PPO step 3 is logged but before its checkpoint: the critic's cosine lr
      continues as uninterrupted (it was rebuilt with 0 pretraining steps before), and step 3
      is not in metrics.jsonl twice.
A real SIGKILL mid-run is resumed the same way (the second test)."""
import json
import os
import shutil
import signal
import time

import pytest

from tests.conftest import start_process
from tests.driver.test_train_e2e import base_overrides, train
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete

pytestmark = [pytest.mark.integration]

IGNORED = ("time", "perf/")


def records(run_dir):
    """Every record of metrics.jsonl in file order, without wall times (duplicates kept)."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.append({k: v for k, v in r.items() if not k.startswith(IGNORED)})
    return out


def cut_after(run_dir, keep_ckpts: set[str], last_logged: tuple[str, int]):
    """The directory a kill leaves: checkpoints in ``keep_ckpts``, the records up to ``last_logged``."""
    for p in list_complete(checkpoint_root(run_dir)):
        if p.name not in keep_ckpts:
            shutil.rmtree(p)
    shutil.rmtree(run_dir / "final")
    (run_dir / "final_metrics.json").unlink()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    keys = [(json.loads(x)["phase"], json.loads(x)["step"]) for x in lines]
    (run_dir / "metrics.jsonl").write_text("".join(lines[:keys.index(last_logged) + 1]))


def assert_same(got, want):
    assert [(r["phase"], r["step"]) for r in got] == [(r["phase"], r["step"]) for r in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys(), (g["phase"], g["step"])
        for k, v in w.items():
            if isinstance(v, float):
                assert g[k] == pytest.approx(v, rel=1e-5, abs=1e-6), (g["phase"], g["step"], k)
            else:
                assert g[k] == v, (g["phase"], g["step"], k)


def sigkill_after_checkpoint(args: list[str], cwd, first: str, timeout: float = 900):
    """`vcppo train vcppo ARGS` in ``cwd``, its process group SIGKILLed once a checkpoint named
    ``first`` or later is complete (wherever the run is then); the run's checkpoint root."""
    proc = start_process("train", "vcppo", *args, cwd=cwd)
    ckpts = checkpoint_root(cwd / "vcppo-seed0")
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if any(p.name >= first for p in list_complete(ckpts)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return ckpts


def overrides(art, out):
    return base_overrides(art, out, **{
        "trainer.total_steps": 4, "trainer.save_every": 2, "trainer.keep_last": 5, "value_pretrain.steps": 3,
        "critic.lr_schedule": "cosine", "actor.lr_schedule": "cosine", "critic.warmup_steps": 1,
        "rollout.temperature": 1.0,
        # state a resume must restore beyond the engines: the adaptive KL coefficient, and the running
        # moments of a reward model's scores (accumulated from value pretraining on)
        "algorithm.kl_coef": 0.05, "algorithm.kl_target": 0.01, "reward.model_path": art / "rm_scored",
        "reward.combine": "weighted_sum", "reward.normalize_model_scores": True})


@pytest.fixture(scope="module")
def uninterrupted(tiny_artifacts, tmp_path_factory):
    """One uninterrupted run: (its output root, its records)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    res = train("vcppo", overrides(tiny_artifacts, root), cwd=root, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return root, records(root / "vcppo-seed0")


@pytest.mark.slow
def test_resume_is_exact_after_a_kill_at_either_point(uninterrupted, tiny_artifacts):
    root, full = uninterrupted
    over = overrides(tiny_artifacts, root)
    run = root / "vcppo-seed0"
    # checkpoints: pretraining step 2 (tag 2), PPO steps 2 and 4 (tags 3+2, 3+4)
    assert [p.name for p in list_complete(checkpoint_root(run))] == ["step_000002", "step_000005", "step_000007"]
    critic_lrs = [r["critic/lr"] for r in full if r["phase"] == "ppo"]
    assert critic_lrs[-1] < critic_lrs[0]  # the cosine decays over the PPO steps, not at its floor

    # (b) killed after publishing the critic and logging PPO step 1, before the first PPO checkpoint
    cut_after(run, {"step_000002"}, ("ppo", 1))
    res = train("vcppo", over, cwd=root, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from" in res.stderr and "reusing the pretrained critic" not in res.stderr
    assert_same(records(run), full)

    # (a) + (c) killed after PPO step 3 was logged, before its checkpoint
    cut_after(run, {"step_000002", "step_000005"}, ("ppo", 3))
    res = train("vcppo", over, cwd=root, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_same(records(run), full)


@pytest.mark.slow
def test_a_sigkilled_run_resumes_with_the_uninterrupted_metrics(uninterrupted, tiny_artifacts, tmp_path):
    """A real SIGKILL of the whole process group after the first PPO checkpoint, wherever the run is
    then (mid-step, mid-write); rerunning the same command resumes from the last complete
    checkpoint and logs what the uninterrupted run logged, each step once."""
    _, full = uninterrupted
    # the first PPO checkpoint is tag 3 + 2; it really was cut short before the last (3 + 4)
    ckpts = sigkill_after_checkpoint(overrides(tiny_artifacts, tmp_path), tmp_path, "step_000005")
    assert list_complete(ckpts)[-1].name < "step_000007"

    res = train("vcppo", overrides(tiny_artifacts, tmp_path), cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from" in res.stderr
    assert_same(records(tmp_path / "vcppo-seed0"), full)


@pytest.mark.slow
def test_a_command_that_lands_on_another_runs_directory_is_refused(uninterrupted, tiny_artifacts):
    """trainer.resume=auto would continue (here: re-report) the seed-0 run for a seed-1 command that
    names its directory; it exits 2 naming the key, and the directory is left as it was."""
    root, _ = uninterrupted
    run = root / "vcppo-seed0"
    before, config_before = records(run), (run / "config.yaml").read_text()
    res = train("vcppo", overrides(tiny_artifacts, root) + ["trainer.seed=1", "trainer.run_name=vcppo-seed0"],
                cwd=root, timeout=600)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "holds another run (trainer.seed: 0 there, 1 now)" in res.stderr and "trainer.resume=never" in res.stderr
    assert records(run) == before and (run / "config.yaml").read_text() == config_before
