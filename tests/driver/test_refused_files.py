"""A checkpoint file torch refuses to unpickle, and a wandb that cannot start: one line in vcppo's
words naming the file or the key, the cause and what to do; the library's traceback at debug level."""
import logging
import pickle

import pytest
import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from vcppo.driver.durability.checkpoint import CheckpointError
from vcppo.driver.durability.resume import restore_engine
from vcppo.errors import ConfigError
from vcppo.tracking import MetricsLogger


class Planted:
    def __reduce__(self):
        return (print, ("code from a checkpoint ran",))


class FakeEngine:
    """What restore_engine touches of a DeepSpeedModelEngine: ``engine.checkpoint_engine`` (DeepSpeed's
    default torch engine) and ``load_checkpoint``, which reads the files through it as DeepSpeed does."""

    def __init__(self, files):
        self.engine = type("DS", (), {})()
        self.engine.checkpoint_engine = TorchCheckpointEngine.__new__(TorchCheckpointEngine)
        self.files = files

    def load_checkpoint(self, directory, universal=False):
        return [self.engine.checkpoint_engine.load(str(f)) for f in self.files]


def test_a_planted_object_is_one_line_naming_the_file(tmp_path, caplog, capsys):
    good, bad = tmp_path / "mp_rank_00_model_states.pt", tmp_path / "zero_pp_rank_0_optim_states.pt"
    torch.save({"w": torch.ones(2)}, good)
    torch.save({"w": Planted()}, bad)
    with caplog.at_level(logging.DEBUG, logger="vcppo.driver.durability.resume"):
        with pytest.raises(CheckpointError) as e:
            restore_engine(FakeEngine([good, bad]), tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{bad}: refusing to load") and "\n" not in msg
    assert "print" in msg and "trainer.resume=never" in msg and "move its step_N directory" in msg
    assert "weights_only" not in msg  # torch's advice to unpickle it anyway is not repeated
    assert "code from a checkpoint ran" not in capsys.readouterr().out
    assert any(r.exc_info for r in caplog.records)  # torch's traceback: debug level only


def test_a_refusal_deepspeed_reads_itself_names_the_directory(tmp_path):
    class Universal(FakeEngine):
        def load_checkpoint(self, directory, universal=False):
            raise pickle.UnpicklingError("Weights only load failed.\n WeightsUnpickler error: Unsupported global: "
                                         "GLOBAL os.system was not an allowed global by default. Please use ...")

    with pytest.raises(CheckpointError, match=rf"^{tmp_path}: refusing .*\(Unsupported global: GLOBAL os.system "
                                              r"was not an allowed global by default\)"):
        restore_engine(Universal([]), tmp_path, universal=True)


def test_wandb_that_cannot_write_is_one_line_naming_logging_wandb(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "wandb").write_text("")  # a file where wandb makes its directory: it cannot write there
    with caplog.at_level(logging.DEBUG, logger="vcppo.tracking"):
        with pytest.raises(ConfigError) as e:
            MetricsLogger(run, {}, use_wandb=True, wandb_mode="offline", progress_bar=False)
    msg = str(e.value)
    assert msg.startswith("config key 'logging.wandb': wandb") and "\n" not in msg
    assert "logging.wandb=false" in msg and "Not a directory" in msg
    assert any(r.exc_info for r in caplog.records)
