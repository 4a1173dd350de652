"""A rank that dies (SIGKILL, as the OOM killer or a lost node does) ends the job even where no
launcher ends the others: two `vcppo train` ranks started by hand (RANK / WORLD_SIZE / MASTER_PORT,
no torchrun, no deepspeed launcher), rank 1 killed as PPO step 2's actor update starts (tests/kill_at.py). The
survivor fails at its next collective (gloo: the peer's connection closes) and exits non-zero; every
checkpoint left is complete and intact, and there is no final export. (A hung but living peer is
bounded by trainer.collective_timeout_s: tests/runtime/test_collective_timeout.py.) The run then
resumes on the one rank left, and later on two again, each time from a checkpoint written on the
other number of ranks (vcppo/driver/durability/conversion.py)."""
import time

import pytest

from tests.conftest import vcppo
from tests.driver.test_exact_resume_e2e import cut_after, records
from tests.driver.test_multirank_faults_e2e import start_two_ranks
from tests.driver.test_train_e2e import base_overrides
from vcppo.driver.durability import manifest
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete
from vcppo.engines.engine_setup import lr_lambda_factory

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow, pytest.mark.extended]


def test_a_killed_rank_ends_its_peer_and_the_run_resumes_on_one_rank_then_two(tiny_artifacts, tmp_path):
    args = base_overrides(tiny_artifacts, tmp_path, **{"value_pretrain.enabled": False, "trainer.total_steps": 4,
                                                      "trainer.save_every": 1, "trainer.keep_last": 8,
                                                      "rollout.max_response_tokens": 32,
                                                      "actor.lr_schedule": "cosine"})
    # rank 1 dies as PPO step 2 starts its actor update, after the step-1 checkpoint
    ranks = start_two_ranks(["train", "vcppo", *args], tmp_path, kill=(1, "update"))
    ckpts = checkpoint_root(tmp_path / "vcppo-seed0")
    try:
        assert ranks[1].wait(timeout=600) == -9
        killed_at = time.time()
        code = ranks[0].wait(timeout=120)
        waited = time.time() - killed_at
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
    stderr = (tmp_path / "rank0.killed.err").read_text()
    assert code != 0 and waited < 60, (code, waited, stderr[-3000:])
    assert "Connection reset by peer" in stderr or "Connection closed by peer" in stderr, stderr[-3000:]
    left = list_complete(ckpts)
    assert [p.name for p in left] == ["step_000001"] and manifest.problems(left[0], 0, 1) == []
    assert not (tmp_path / "vcppo-seed0" / "final").exists()

    # The node does not come back: the run resumes on the one rank left, from the last checkpoint the
    # two ranks wrote (converted to DeepSpeed's universal format), and then, with the node back, on
    # two ranks again from a checkpoint the single rank wrote.
    one = vcppo("train", "vcppo", *args, cwd=tmp_path, check=False, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "was written by 2 training rank(s), this run has 1" in one.stderr
    run = tmp_path / "vcppo-seed0"
    after_one = records(run)
    assert_contiguous(after_one, 4)
    keep = {p.name for p in list_complete(ckpts)[:-2]}  # back to a checkpoint the single rank wrote
    assert keep == {"step_000001", "step_000002"}
    cut_after(run, keep, ("ppo", 2))
    again = start_two_ranks(["train", "vcppo", *args], tmp_path)
    codes = [p.wait(timeout=600) for p in again]
    err = (tmp_path / "rank0.run.err").read_text()
    assert codes == [0, 0], err[-3000:]
    assert "was written by 1 training rank(s), this run has 2" in err
    final = records(run)
    assert_contiguous(final, 4)
    # schedules and step counters carried over every change of size: the lr of every step is the
    # schedule's at that step (cosine: a restarted scheduler would repeat step 1's)
    schedule = lr_lambda_factory(0, 4, "cosine", 0.0)
    assert [r["actor/lr"] for r in final if r["phase"] == "ppo"] == pytest.approx([1e-4 * schedule(s) for s in range(4)])
    assert (run / "final" / "actor" / "config.json").is_file()


def assert_contiguous(recs, steps):
    """PPO steps 1..steps, each logged once."""
    assert [r["step"] for r in recs if r["phase"] == "ppo"] == list(range(1, steps + 1))
