"""DeepSpeed checkpoints loaded without unpickling arbitrary objects.

DeepSpeed's default ``TorchCheckpointEngine.load`` calls ``torch.load(path, weights_only=False)``:
any object planted in a checkpoint's ``*.pt`` file runs its ``__reduce__`` on resume. Every state
file our engines load (model states, ZeRO optimizer partitions, the LR scheduler inside the model
states) goes through ``engine.checkpoint_engine.load`` (deepspeed 0.19.8: ``SDLoaderFactory`` and
``_load_zero_checkpoint``), so swapping that object is enough.

:class:`WeightsOnlyCheckpointEngine` saves exactly as DeepSpeed does and loads with
``weights_only=True``: tensors, containers and plain values, plus the few DeepSpeed classes its
own states hold (``ZeroStageEnum``; the loss scalers, rebuilt from their attribute dicts without
calling code). Anything else is refused with an ``UnpicklingError`` naming the global.
"""
from __future__ import annotations

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine


def deepspeed_state_types() -> list:
    """The non-torch classes found in DeepSpeed 0.19.8's own ZeRO states (fp32 / bf16 / fp16)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    return [ZeroStageEnum, LossScaler, DynamicLossScaler]


def allow_deepspeed_state_types() -> None:
    """Allow DeepSpeed's own state classes in every ``weights_only`` load of the process. Process-wide
    on purpose: torch's ``safe_globals`` context removes its classes on exit even when an enclosing
    context had allowed them, so nested loads (a universal checkpoint's) would lose them."""
    torch.serialization.add_safe_globals(deepspeed_state_types())


def load_weights_only(path: str, map_location=None):
    """``torch.load`` of a DeepSpeed state file that never runs code from the file."""
    allow_deepspeed_state_types()
    return torch.load(path, map_location=map_location, weights_only=True)


class WeightsOnlyCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine, loading with ``weights_only=True``."""

    def load(self, path: str, map_location=None):
        return load_weights_only(path, map_location=map_location)


def use_weights_only_loading(engine) -> None:
    """Make a ``deepspeed.DeepSpeedEngine`` load its checkpoints with ``weights_only=True``.

    Only DeepSpeed's plain torch engine is replaced; a configured fast / decoupled / datastates
    writer is left alone (its own load path would need the same treatment), with an error so the
    gap is not silent.
    """
    current = engine.checkpoint_engine
    if isinstance(current, WeightsOnlyCheckpointEngine):
        return
    if type(current) is not TorchCheckpointEngine:
        raise RuntimeError(f"DeepSpeed checkpoint engine {type(current).__name__} would load checkpoints by "
                           "unpickling; vcppo supports only DeepSpeed's default torch checkpoint engine")
    safe = WeightsOnlyCheckpointEngine.__new__(WeightsOnlyCheckpointEngine)
    safe.__dict__.update(current.__dict__)  # same name / serialization settings, no re-initialisation
    engine.checkpoint_engine = safe
