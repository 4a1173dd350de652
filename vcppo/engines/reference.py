"""Frozen reference policy for the KL penalty (built only when ``algorithm.kl_coef > 0``).

The same DeepSpeed ZeRO-3 wrapper as the actor, without optimizer (``train=False``): parameters
are partitioned over ranks and gathered layer by layer in forward.
"""
from __future__ import annotations

from vcppo.engines.actor import ActorEngine
from vcppo.engines.dist import DistInfo


class ReferenceEngine(ActorEngine):
    def __init__(self, model_path: str, dist: DistInfo, dtype: str = "auto", micro_batch_size: int = 8,
                 zero_stage: int = 3):
        from vcppo.config import ActorConfig
        cfg = ActorConfig(micro_batch_size=micro_batch_size, zero_stage=zero_stage)
        super().__init__(model_path, cfg, dist, total_optimizer_steps=0, dtype=dtype, train=False)

    def train_step(self, *a, **k):  # pragma: no cover - guard
        raise RuntimeError("the reference policy is frozen")
