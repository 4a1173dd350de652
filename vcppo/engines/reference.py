"""Frozen reference policy for the KL penalty (built only when ``algorithm.kl_coef > 0``).

:class:`ReferenceEngine`: the actor's DeepSpeed ZeRO-3 wrapper without optimizer (``train=False``):
parameters are partitioned over ranks and gathered layer by layer in forward. Configured by the
``reference`` section (micro-batch size, ZeRO stage, offload).

:class:`AdapterFreeReference`: with a LoRA actor, the reference is the actor with its adapters off:
its frozen base weights are the initial policy's, so no second copy of the model is loaded.
"""
from __future__ import annotations

from vcppo.engines.actor import ActorEngine
from vcppo.runtime.dist import DistInfo
from vcppo.engines.lora import adapters_disabled
from vcppo.config.schema import EngineConfig


class ReferenceEngine(ActorEngine):
    def __init__(self, model_path: str, cfg: EngineConfig, dist: DistInfo, dtype: str = "auto",
                 temperature: float = 1.0):
        super().__init__(model_path, cfg, dist, total_optimizer_steps=0, dtype=dtype, train=False,
                         temperature=temperature)


class AdapterFreeReference:
    """The reference policy of a LoRA actor: ``actor``'s forward with its adapters disabled (the
    actor's micro-batching; every rank runs the same passes, as the actor's own do)."""

    def __init__(self, actor: ActorEngine):
        self.actor = actor

    def forward_logprobs(self, batch, with_entropy: bool = False):
        """(logprobs (B, R), entropy (B, R) or None) under the initial policy."""
        with adapters_disabled(self.actor.module):
            return self.actor.forward_logprobs(batch, with_entropy)
