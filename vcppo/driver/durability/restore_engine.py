"""Restoring one DeepSpeed engine from its checkpoint directory, reading tensors and plain values only
(a file that holds anything else is refused, named, before it could run code)."""
from __future__ import annotations

import logging
import pickle
from pathlib import Path

from vcppo.driver.durability import checkpoint as ckpt
from vcppo.driver.durability import reshard
from vcppo.engines.deepspeed_engine import DeepSpeedModelEngine
from vcppo.engines.safe_checkpoint import use_weights_only_loading

logger = logging.getLogger(__name__)


def refused_file(path: str | Path, error: BaseException) -> ckpt.CheckpointError:
    """One line for a checkpoint file torch will not unpickle with ``weights_only``: the file, what it
    holds, what to do; torch's own advice (load it with ``weights_only=False``) is not ours to give."""
    logger.debug("weights-only load of %s failed", path, exc_info=(type(error), error, error.__traceback__))
    return ckpt.unpickle_refusal(path, error)


def _name_refused_files(engine: DeepSpeedModelEngine) -> None:
    """Make the engine's checkpoint loader name the file it refuses (DeepSpeed reads many)."""
    loader = engine.engine.checkpoint_engine
    load = type(loader).load

    def load_naming_the_file(path, map_location=None):
        try:
            return load(loader, path, map_location=map_location)
        except pickle.UnpicklingError as e:
            raise refused_file(path, e) from None

    loader.load = load_naming_the_file


def restore_engine(engine: DeepSpeedModelEngine, directory: Path, universal: bool = False) -> None:
    """``engine``'s states from its checkpoint ``directory`` (``universal``: DeepSpeed's universal
    format, written for another number of ranks), reading tensors and plain values only; a file
    that holds anything else is a :class:`~vcppo.driver.durability.checkpoint.CheckpointError` naming it."""
    use_weights_only_loading(engine.engine)  # nothing in a checkpoint directory may run code
    _name_refused_files(engine)
    try:
        if universal:
            with reshard.weights_only_loading():  # DeepSpeed's universal reader calls torch.load itself
                engine.load_checkpoint(str(directory), universal=True)
        else:
            engine.load_checkpoint(str(directory))
    except pickle.UnpicklingError as e:  # read by DeepSpeed itself: name the directory
        raise refused_file(directory, e) from None
