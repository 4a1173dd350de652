"""The critic on ranks of its own (``placement.critic_ranks``), end to end: three gloo processes
started by hand as a launcher would (an actor rank with real DeepSpeed ZeRO-3, a critic rank with
its own, a rollout rank with real vLLM), one thread each.

Synchronous (max_staleness 0), value pretraining then PPO, the run logs what a colocated run on
one rank logs, to float tolerance, and exports the same actor and critic. The step's order differs
(V_old from a values pass on the critic rank rather than the critic update's own forward, which
the colocated run takes at lambda_critic = 1), not its arithmetic: same weights, same inputs.
Then it checkpoints, and a second command resumes it from the checkpoint on the critic rank too.
One step ahead, a SIGKILLed critic rank ends the job, and the same command resumes it exactly; and
(``make test-faults``) two critic ranks serve two actor ranks, each its own.
"""
import json
import os
import signal
import time

import pytest
import torch

from tests.conftest import run_ranks, start_ranks
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete
from tests.driver.test_exact_resume_e2e import assert_same, records
from tests.driver.test_split_e2e import ONE_THREAD, SPLIT_ONLY, final_actor, in_step_order, overrides

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]


def comparable(recs):
    """Records in step order without timings; lists of floats (the advantage profile) as numbers
    compared to float tolerance, like the other floats (V_old comes from another forward)."""
    out = []
    for r in in_step_order(recs):
        kept = {k: v for k, v in r.items() if not k.startswith(SPLIT_ONLY)}
        for k, v in kept.items():
            if isinstance(v, list):
                kept[k] = pytest.approx(v, rel=1e-5, abs=1e-6)
        out.append(kept)
    return out


def final_critic(run_dir):
    from safetensors.torch import load_file
    return load_file(str(next((run_dir / "final" / "critic").glob("*.safetensors"))))


def test_critic_ranks_log_what_colocated_logs_and_resume(tiny_artifacts, tmp_path):
    colocated, split = tmp_path / "colocated", tmp_path / "split"
    extra = {"trainer.save_every": 2, "trainer.keep_last": 5}
    run_ranks("train", "vcppo", *overrides(tiny_artifacts, colocated, **extra), cwd=tmp_path, world_size=1,
              env=ONE_THREAD)
    args = [*overrides(tiny_artifacts, split, **extra), "placement.mode=split", "placement.critic_ranks=1"]
    err = run_ranks("train", "vcppo", *args, cwd=tmp_path, world_size=3, env=ONE_THREAD)
    assert "on the critic's own ranks" in err and "1 critic rank(s) hold the critic" in err  # as logged
    want, got = records(colocated / "vcppo-seed0"), records(split / "vcppo-seed0")
    assert {k for r in got for k in r} - {k for r in want for k in r} == {"staleness/steps_behind"}
    timed = [json.loads(line) for line in (split / "vcppo-seed0" / "metrics.jsonl").read_text().splitlines()]
    # V_old from the critic rank's values pass in PPO; in value pretraining from its update's forward
    assert [r["time/critic_rank_values_s"] > 0 for r in timed if "time/critic_rank_values_s" in r] \
        == [False, False, True, True]
    ppo = [r for r in got if r["phase"] == "ppo" and "reward/mean" in r]
    assert_same(comparable(got), [{k: v for k, v in r.items() if not k.startswith(SPLIT_ONLY)}
                                  for r in in_step_order(want)])
    for load in (final_actor, final_critic):
        a, b = load(colocated / "vcppo-seed0"), load(split / "vcppo-seed0")
        assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)
    # the run's checkpoints hold the critic rank's engine; one more step resumes from the last
    assert (split / "vcppo-seed0" / "checkpoints" / "step_000004" / "critic").is_dir()
    err = run_ranks("train", "vcppo", *args, "trainer.total_steps=3", cwd=tmp_path, world_size=3, env=ONE_THREAD)
    assert "resuming from" in err
    resumed = [r for r in records(split / "vcppo-seed0") if r["phase"] == "ppo" and "reward/mean" in r]
    assert [r["step"] for r in resumed] == [1, 2, 3] and resumed[:2] == ppo


@pytest.mark.extended
def test_a_killed_critic_rank_ends_the_job_and_the_run_resumes_exactly(tiny_artifacts, tmp_path):
    """One step ahead (max_staleness 1): the critic rank SIGKILLed after the first PPO checkpoint;
    its actor rank, waiting on it, exits non-zero (no launcher ends the ranks here), the rollout
    rank follows, and the same command resumes and logs what an uninterrupted run logs."""
    def args(root):
        return [*overrides(tiny_artifacts, root, **{
            "placement.mode": "split", "placement.critic_ranks": 1, "trainer.max_staleness": 1,
            "algorithm.rollout_is_cap": 2.0, "trainer.total_steps": 6, "trainer.save_every": 2,
            "trainer.keep_last": 5})]
    full = tmp_path / "full"
    run_ranks("train", "vcppo", *args(full), cwd=tmp_path, world_size=3, env=ONE_THREAD)
    want = in_step_order(records(full / "vcppo-seed0"))
    assert [r["staleness/steps_behind"] for r in want if r["phase"] == "ppo" and "reward/mean" in r] \
        == [0.0] + [1.0] * 5

    cut = tmp_path / "cut"
    errs = [tmp_path / f"rank{r}.err" for r in range(3)]
    ranks = start_ranks("train", "vcppo", *args(cut), cwd=tmp_path, world_size=3, env=ONE_THREAD,
                        err=lambda r: str(errs[r]))
    ckpts = checkpoint_root(cut / "vcppo-seed0")
    try:
        deadline = time.time() + 600
        while time.time() < deadline and all(p.poll() is None for p in ranks):
            if any(p.name >= "step_000004" for p in list_complete(ckpts)):  # pretraining 2 + PPO 2
                break
            time.sleep(0.05)
        assert all(p.poll() is None for p in ranks), "a rank ended before the critic rank could be killed"
        os.killpg(ranks[1].pid, signal.SIGKILL)  # the critic rank
        killed_at = time.time()
        codes = [p.wait(timeout=120) for p in ranks]
        waited = time.time() - killed_at
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    assert codes[0] != 0 and codes[1] == -9 and waited < 120, (codes, waited, errs[0].read_text()[-3000:])
    assert not (cut / "vcppo-seed0" / "final").exists()
    err = run_ranks("train", "vcppo", *args(cut), cwd=tmp_path, world_size=3, env=ONE_THREAD)
    assert "resuming from" in err
    assert_same(in_step_order(records(cut / "vcppo-seed0")), want)


@pytest.mark.faults
def test_two_critic_ranks_serve_two_actor_ranks(tiny_artifacts, tmp_path):
    """5 processes (2 actor, 2 critic, 1 rollout), one step ahead: each actor rank's share goes to its own
    critic rank, and the run logs what split over the same 2 training ranks logs, to float tolerance."""
    base = {"placement.mode": "split", "trainer.max_staleness": 1, "algorithm.rollout_is_cap": 2.0,
            "trainer.total_steps": 3}
    run_ranks("train", "vcppo", *overrides(tiny_artifacts, tmp_path / "two", **base), cwd=tmp_path, world_size=3,
              env=ONE_THREAD)
    err = run_ranks("train", "vcppo", *overrides(tiny_artifacts, tmp_path / "pairs", **base,
                                                 **{"placement.critic_ranks": 2}),
                    cwd=tmp_path, world_size=5, env=ONE_THREAD)
    assert "2 critic rank(s) hold the critic" in err
    want = [{k: v for k, v in r.items() if not k.startswith(SPLIT_ONLY)}
            for r in in_step_order(records(tmp_path / "two" / "vcppo-seed0"))]
    assert_same(comparable(records(tmp_path / "pairs" / "vcppo-seed0")), want)
