"""``vcppo train vcppo`` with the actor and the critic at sequence_parallel_size 2 on 2 ranks logs what
the same 2 ranks log without SP (same samples: sampling is per rank either way), every logged figure
to float tolerance, value pretraining included; the step takes V_old from the critic's update
(the update's own outputs, gathered back from the SP group's passes). A kill of the SP run after a
step is logged but before its checkpoint resumes, on the same layout, to the same records."""
import pytest

from tests.conftest import ENV, run_ranks
from tests.driver.test_exact_resume_e2e import assert_same, cut_after, records
from tests.driver.test_train_e2e import base_overrides
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]


def _train(art, out, cwd, sp):
    args = base_overrides(art, out, **{"actor.sequence_parallel_size": sp, "critic.sequence_parallel_size": sp,
                                       "trainer.total_steps": 3, "trainer.save_every": 2, "trainer.keep_last": 5})
    return run_ranks("train", "vcppo", *args, cwd=cwd, world_size=2, env=dict(ENV, OMP_NUM_THREADS="1"))


@pytest.fixture(scope="module")
def sp_runs(tiny_artifacts, tmp_path_factory):
    """{sp: (run directory, its records)} for SP 1 and 2 on 2 ranks."""
    root = tmp_path_factory.mktemp("sp_runs")
    runs = {}
    for sp in (1, 2):
        log = _train(tiny_artifacts, root / f"sp{sp}", root, sp)
        run = root / f"sp{sp}" / "vcppo-seed0"
        runs[sp] = (run, records(run), log)
    return runs


def test_sp2_run_logs_what_data_parallel_logs(sp_runs):
    (_, sp2, log2), (_, sp1, log1) = sp_runs[2], sp_runs[1]
    # Ulysses ran in both engines of the SP run, and in neither of the other (equal records alone
    # would also hold if the engines had silently run without SP)
    for role in ("actor", "critic"):
        assert f"{role} engine: Ulysses sequence parallelism over 2 ranks (attention vcppo_ulysses_" in log2
    assert "Ulysses" not in log1
    assert any(r["phase"] == "ppo" and "actor/grad_norm" in r for r in sp2)
    assert_close_records(sp2, sp1)


@pytest.mark.extended  # a kill-and-resume on another layout: `make test` resumes 2 ranks in test_multirank_faults_e2e
def test_a_killed_sp_run_resumes_to_the_same_records(sp_runs, tiny_artifacts):
    run, full, _ = sp_runs[2]
    ckpts = [p.name for p in list_complete(checkpoint_root(run))]
    assert len(ckpts) >= 2  # value pretraining's and PPO step 2's
    cut_after(run, set(ckpts[:2]), ("ppo", 3))  # killed after step 3 was logged, before any later checkpoint
    log = _train(tiny_artifacts, run.parent, run.parent.parent, 2)
    assert "resuming from" in log
    assert_same(records(run), full)


def assert_close_records(got, want):
    """Every key of every record; floats, and lists of them (profiles), to rel 1e-5."""
    assert [(r["phase"], r["step"]) for r in got] == [(r["phase"], r["step"]) for r in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys(), (g["phase"], g["step"])
        for k, v in w.items():
            if isinstance(v, float) or (isinstance(v, list) and all(isinstance(x, float) for x in v)):
                assert g[k] == pytest.approx(v, rel=1e-5, abs=1e-6), (g["phase"], g["step"], k)
            else:
                assert g[k] == v, (g["phase"], g["step"], k)
