"""Frozen reference policy for the KL penalty (built only when ``algorithm.kl_coef > 0``).

The actor's DeepSpeed ZeRO-3 wrapper without optimizer (``train=False``): parameters are
partitioned over ranks and gathered layer by layer in forward. Configured by the ``reference``
section (micro-batch size, ZeRO stage, offload).
"""
from __future__ import annotations

from vcppo.engines.actor import ActorEngine
from vcppo.engines.dist import DistInfo
from vcppo.schema import EngineConfig


class ReferenceEngine(ActorEngine):
    def __init__(self, model_path: str, cfg: EngineConfig, dist: DistInfo, dtype: str = "auto",
                 temperature: float = 1.0):
        super().__init__(model_path, cfg, dist, total_optimizer_steps=0, dtype=dtype, train=False,
                         temperature=temperature)
