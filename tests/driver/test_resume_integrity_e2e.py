"""`vcppo train` with real engines, resumed after its newest checkpoint was damaged: the
damage is reported before the engines start, the previous intact checkpoint is used, the run
finishes; a print-on-unpickle object planted in the RNG file never runs."""
import glob
import os
import pickle

import pytest

from tests.driver.test_train_e2e import base_overrides, train
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete

pytestmark = [pytest.mark.integration]


class PrintOnUnpickle:
    def __reduce__(self):
        return (print, ("PLANTED-CODE-RAN",))


@pytest.mark.slow
def test_truncated_shard_falls_back_to_the_previous_checkpoint(tiny_artifacts, tmp_path):
    overrides = base_overrides(tiny_artifacts, tmp_path, **{"trainer.save_every": 1, "trainer.keep_last": 3,
                                                            "trainer.total_steps": 2, "value_pretrain.steps": 1})
    first = train("vcppo", overrides, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-4000:]
    run = tmp_path / "vcppo-seed0"
    complete = list_complete(checkpoint_root(run))
    assert len(complete) >= 2, complete       # PPO steps 1 and 2 (and value pretraining's)
    newest, previous = complete[-1], complete[-2]
    # the largest shard: optimizer states under ZeRO-3, model + optimizer under ZeRO-0 (auto, one rank)
    shard = max(glob.glob(str(newest / "actor" / "ds" / "*_states.pt")), key=os.path.getsize)
    with open(shard, "r+b") as f:
        f.truncate(1000)
    (newest / "rng_rank0.pt").write_bytes(pickle.dumps(PrintOnUnpickle()))  # planted, never read

    again = train("vcppo", overrides, cwd=tmp_path, timeout=600)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-4000:]
    assert f"checkpoint {newest} is damaged" in out and "truncated?" in out
    assert out.index("is damaged") < out.index("rollout engine:")  # found before any engine started
    assert "resuming from " + str(previous) in out
    assert "PLANTED-CODE-RAN" not in out
    assert (run / "final" / "actor" / "config.json").exists()
