"""DeepSpeed value model (critic): values, one optimizer step, save / load / export.

Initialisation (``init``): ``policy`` (backbone of the policy + zero head), ``reward_model`` (an RM
dir in ValueModel format, head kept: the paper's PPO baseline), ``checkpoint`` (a pretrained
critic, e.g. from value pretraining -- same format).
"""
from __future__ import annotations

import torch

from vcppo.engines.deepspeed_engine import DeepSpeedModelEngine, ModelOutputs
from vcppo.engines.dist import DistInfo, barrier
from vcppo.experience import Experience
from vcppo.schema import OptimConfig

CRITIC_INITS = ("policy", "reward_model", "checkpoint")


class CriticEngine(DeepSpeedModelEngine):
    def __init__(self, init: str, path: str, cfg: OptimConfig, dist: DistInfo, total_optimizer_steps: int,
                 dtype: str = "auto", train: bool = True):
        if init not in CRITIC_INITS:
            raise ValueError(f"critic init must be one of {CRITIC_INITS}, got {init!r}")
        self.init, self.path = init, path
        super().__init__(cfg, dist, total_optimizer_steps, dtype=dtype, train=train)

    def _build_module(self):
        from vcppo.models.value_model import ValueModel
        if self.init == "policy":
            return ValueModel.from_policy(self.path, dtype=self.dtype)
        return ValueModel.from_pretrained(self.path, dtype=self.dtype)

    def _forward_outputs(self, micro: Experience, need_entropy: bool = False) -> ModelOutputs:
        dev = self.dist.device
        P, R = micro.prompt_len, micro.responses.shape[1]
        values = self.engine(input_ids=micro.input_ids.to(dev), attention_mask=micro.attention_mask.to(dev),
                             position_ids=micro.position_ids.to(dev))
        # V(state before response token t) = value at the column of the previous token.
        v = values[:, P - 1:P + R - 1].float()
        return ModelOutputs(values=v * micro.response_mask.to(v.device))

    @torch.no_grad()
    def forward_values(self, batch: Experience) -> torch.Tensor:
        """(B, R) values at response positions, zero at pads."""
        self.engine.eval()
        return torch.cat([self._forward_outputs(m).values for m in batch.micro_batches(self.cfg.micro_batch_size)])

    def export(self, directory: str, extra: dict | None = None) -> None:
        """ValueModel format (loads with ``ValueModel.from_pretrained`` / ``init='checkpoint'``)."""
        state = self.full_state_dict()  # collective
        if self.dist.is_main:
            from transformers import AutoConfig, AutoModel
            from vcppo.models.value_model import save_value_model
            config = AutoConfig.from_pretrained(self.path)
            backbone = AutoModel.from_config(config)  # only a vessel for config + save_pretrained
            save_value_model(backbone, directory, state, tokenizer_src=self.path, extra=extra)
        barrier()
