"""``vcppo train vcppo`` with the actor and the critic at sequence_parallel_size 2 on 2 ranks logs what
the same 2 ranks log without SP (same samples: sampling is per rank either way), every logged figure
to float tolerance, value pretraining included; the step takes V_old from the critic's update
(the update's own outputs, gathered back from the SP group's passes)."""
import pytest

from tests.conftest import ENV, run_ranks
from tests.driver.test_exact_resume_e2e import records
from tests.driver.test_train_e2e import base_overrides

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]


def test_sp2_run_logs_what_data_parallel_logs(tiny_artifacts, tmp_path):
    runs = {}
    for sp in (1, 2):
        out = tmp_path / f"sp{sp}"
        args = base_overrides(tiny_artifacts, out, **{"actor.sequence_parallel_size": sp,
                                                       "critic.sequence_parallel_size": sp})
        run_ranks("train", "vcppo", *args, cwd=tmp_path, world_size=2, env=dict(ENV, OMP_NUM_THREADS="1"))
        runs[sp] = records(out / "vcppo-seed0")
    assert any(r["phase"] == "ppo" and "actor/grad_norm" in r for r in runs[2])
    assert_close_records(runs[2], runs[1])


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
