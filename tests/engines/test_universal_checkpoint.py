"""A ZeRO-3 checkpoint written on 2 ranks, converted to DeepSpeed's universal format
(vcppo/driver/durability/conversion.py), continues on 1 rank (and one written on 1 rank on 2) with the same next
step as the writer's own continuation: weights, Adam's moments, the LR schedule and the step counter
carried over."""
import pytest
import torch

from tests.engines.test_distributed import cpu_worker
from vcppo.driver.durability.conversion import convert_engine
from vcppo.driver.durability import manifest

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]


def _worker(model, out, mode, ranks):
    """tests/engines/reshard_worker.py on ``ranks`` ranks started by hand (tests/conftest.py)."""
    cpu_worker("tests.engines.reshard_worker", "--model", model, "--out", str(out), "--mode", mode, world_size=ranks)


def _convert(out):
    ckpt = out / "ckpt"
    manifest.write_manifest(ckpt, [manifest.hash_share(ckpt)])  # as a sealed run checkpoint lists its files
    for role in ("actor", "critic"):
        convert_engine(ckpt, role, out / "universal" / role)


@pytest.mark.parametrize("wrote, resumes", [(2, 1)])  # 1 -> 2: tests/driver/test_dead_rank_e2e.py
def test_a_checkpoint_continues_on_another_number_of_ranks(tiny_model_dir, tmp_path, wrote, resumes):
    _worker(tiny_model_dir, tmp_path, "save", wrote)
    _convert(tmp_path)
    _worker(tiny_model_dir, tmp_path, "load", resumes)
    for role in ("actor", "critic"):
        want = torch.load(tmp_path / f"save_{role}_w{wrote}.pt")
        got = torch.load(tmp_path / f"load_{role}_w{resumes}.pt")
        assert got["steps"] == want["steps"] == 3 and got["lr"] == pytest.approx(want["lr"])
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
        for name, w in want["weights"].items():  # the third step, from Adam's carried moments
            assert (got["weights"][name] - w).abs().max() < 1e-6, (role, name)
