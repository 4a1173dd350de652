"""Resume loads nothing by unpickling: RNG states as JSON, DeepSpeed states with
weights_only=True; a planted print-on-unpickle object never runs."""
import json
import logging
import random

import numpy as np
import pytest
import torch

from vcppo.driver.durability import checkpoint as ckpt
from vcppo.engines.safe_checkpoint import WeightsOnlyCheckpointEngine, load_weights_only

PAYLOAD_OUTPUT = "PLANTED-CODE-RAN"


class PrintOnUnpickle:
    """Harmless stand-in for a crafted object: unpickling it calls print()."""

    def __reduce__(self):
        return (print, (PAYLOAD_OUTPUT,))


def _draws():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def _checkpoint(tmp_path):
    stage = ckpt.staging_dir(tmp_path, 1)
    ckpt.write_rank_files(stage, rank=0)
    return ckpt.commit(stage, {"phase": "ppo", "step": 1}, keep_last=1)


def test_the_payload_does_run_when_unpickled(tmp_path, capsys):
    """The planted object is live: what the tests below show is that the loaders refuse it."""
    torch.save({"x": PrintOnUnpickle()}, tmp_path / "f.pt")
    torch.load(tmp_path / "f.pt", weights_only=False)
    assert PAYLOAD_OUTPUT in capsys.readouterr().out


def test_rng_state_is_json_and_restores_torch_numpy_and_python(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.randn()  # a cached gaussian is part of numpy's state too
    final = _checkpoint(tmp_path)
    expected = _draws()
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    ckpt.load_state(final, rank=0)
    assert _draws() == expected
    state = json.loads((final / "rng_rank0.json").read_text())  # plain JSON, nothing to unpickle
    assert set(state) == {"torch", "cuda", "numpy", "python"}
    assert not list(final.glob("*.pt"))


def test_a_planted_pickle_next_to_the_json_is_never_read(tmp_path, capsys):
    final = _checkpoint(tmp_path)
    torch.save({"torch": PrintOnUnpickle()}, final / "rng_rank0.pt")
    ckpt.load_state(final, rank=0)
    assert PAYLOAD_OUTPUT not in capsys.readouterr().out


def test_a_planted_legacy_rng_file_is_refused_without_running(tmp_path, capsys):
    final = _checkpoint(tmp_path)
    (final / "rng_rank0.json").unlink()
    torch.save({"torch": torch.get_rng_state(), "numpy": PrintOnUnpickle()}, final / "rng_rank0.pt")
    with pytest.raises(ckpt.CheckpointError, match="rng_rank0.pt: refusing to load"):
        ckpt.load_state(final, rank=0)
    assert PAYLOAD_OUTPUT not in capsys.readouterr().out


def test_a_legacy_rng_file_of_an_older_checkpoint_still_restores(tmp_path):
    final = _checkpoint(tmp_path)
    (final / "rng_rank0.json").unlink()
    torch.manual_seed(5), np.random.seed(6), random.seed(7)
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
               final / "rng_rank0.pt")  # what the trainer wrote before
    expected = _draws()
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    ckpt.load_state(final, rank=0)
    assert _draws() == expected


def test_a_damaged_rng_file_is_named_and_a_missing_one_reported(tmp_path, caplog):
    final = _checkpoint(tmp_path)
    (final / "rng_rank0.json").write_text('{"torch": 1}')
    with pytest.raises(ckpt.CheckpointError, match="rng_rank0.json: not a valid RNG state"):
        ckpt.load_state(final, rank=0)
    (final / "rng_rank0.json").unlink()
    with caplog.at_level(logging.WARNING, logger="vcppo.driver.durability.checkpoint"):
        ckpt.load_state(final, rank=0)
    assert "no RNG state of rank 0" in caplog.text


def test_deepspeed_state_files_load_weights_only_and_refuse_planted_objects(tmp_path, capsys):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    genuine = {"optimizer_state_dict": {"zero_stage": ZeroStageEnum.weights, "loss_scaler": LossScaler(1.0),
                                        "fp32_flat_groups": [torch.ones(4)]}, "ds_version": "0.19.8"}
    torch.save(genuine, tmp_path / "optim_states.pt")
    loaded = WeightsOnlyCheckpointEngine().load(str(tmp_path / "optim_states.pt"), map_location="cpu")
    sd = loaded["optimizer_state_dict"]
    assert sd["zero_stage"] is ZeroStageEnum.weights and sd["loss_scaler"].cur_scale == 1.0
    assert torch.equal(sd["fp32_flat_groups"][0], torch.ones(4))
    genuine["optimizer_state_dict"]["planted"] = PrintOnUnpickle()
    torch.save(genuine, tmp_path / "optim_states.pt")
    with pytest.raises(Exception, match="Unsupported global: GLOBAL print"):
        load_weights_only(str(tmp_path / "optim_states.pt"), map_location=lambda storage, loc: storage)
    assert PAYLOAD_OUTPUT not in capsys.readouterr().out


def test_the_legacy_rng_refusal_says_what_to_do_in_plain_text(tmp_path):
    final = _checkpoint(tmp_path)
    (final / "rng_rank0.json").unlink()
    torch.save({"torch": torch.get_rng_state(), "numpy": PrintOnUnpickle()}, final / "rng_rank0.pt")
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load_state(final, rank=0)
    message = str(err.value)
    assert "\x1b[" not in message and "two options" not in message and "\n" not in message
    assert "move its step_N directory out of checkpoints/" in message and "trainer.resume=never" in message
    assert "Unsupported global" in message  # what the file holds, in torch's words
