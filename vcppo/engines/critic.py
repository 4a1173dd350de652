"""DeepSpeed value model (critic): values, one optimizer step, save / load / export.

Initialisation (``init``): ``policy`` (backbone of the policy + zero head), ``reward_model`` (an RM
dir in ValueModel format, head kept: the paper's PPO baseline), ``checkpoint`` (a pretrained
critic, e.g. from value pretraining -- same format).
"""
from __future__ import annotations

import torch

from vcppo.algos.confidence import confidence_features
from vcppo.engines.deepspeed_engine import DeepSpeedModelEngine
from vcppo.engines.freeze import freeze
from vcppo.engines.loss_contract import ModelOutputs
from vcppo.runtime.dist import DistInfo
from vcppo.runtime.collectives import barrier
from vcppo.engines.packing import pack
from vcppo.engines.sequence_parallel import gather_slices, shard_packed
from vcppo.experience import Rollout
from vcppo.config.schema import OptimConfig
from vcppo.errors import ConfigError

CRITIC_INITS = ("policy", "reward_model", "checkpoint")


class CriticEngine(DeepSpeedModelEngine):
    CONFIG_SECTION = "critic"

    def __init__(self, init: str, path: str, cfg: OptimConfig, dist: DistInfo, total_optimizer_steps: int,
                 dtype: str = "auto", train: bool = True):
        if init not in CRITIC_INITS:
            raise ValueError(f"critic init must be one of {CRITIC_INITS}, got {init!r}")
        self.init, self.path = init, path
        self.frozen: set[str] = set()  # critic.freeze's parameters (names as the module has them)
        super().__init__(cfg, dist, total_optimizer_steps, dtype=dtype, train=train)

    def _build_module(self):
        from vcppo.models.value_model import ValueModel
        confidence = bool(getattr(self.cfg, "confidence_features", False))
        if self.init == "policy":
            return ValueModel.from_policy(self.path, dtype=self.dtype, confidence=confidence)
        return ValueModel.from_pretrained(self.path, dtype=self.dtype, confidence=confidence)

    def _weights_source(self) -> str:
        return self.path

    def _confidence_features(self, micro: Rollout) -> torch.Tensor | None:
        """(b, R, 3) features of the sampler's logprobs, when the model has a confidence head."""
        if getattr(self.module, "confidence_head", None) is None:
            return None
        if micro.sampler_logprobs is None:
            raise ValueError("critic.confidence_features needs the sampler's logprobs in the batch "
                             "(Rollout.sampler_logprobs)")
        return confidence_features(micro.sampler_logprobs, micro.policy_mask)

    def _param_groups(self, module: torch.nn.Module) -> list:
        """``critic.freeze`` applied first (before the optimizer exists: frozen parameters get no
        state); then the backbone at lr, the value head at lr x head_lr_scale, the confidence head (if
        any) at lr x confidence_lr_scale; one group when nothing is scaled."""
        specs = list(getattr(self.cfg, "freeze", []) or [])
        if specs:
            try:
                self.frozen = freeze(module, specs)
            except ValueError as e:
                raise ConfigError(f"config key 'critic.freeze': {e}") from None
        lr = float(self.cfg.lr)
        rates = {"value_head.": lr * float(getattr(self.cfg, "head_lr_scale", 1.0))}
        if getattr(module, "confidence_head", None) is not None:
            rates["confidence_head."] = lr * float(getattr(self.cfg, "confidence_lr_scale", 1.0))
        if all(r == lr for r in rates.values()):
            return super()._param_groups(module)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in named if not n.startswith(tuple(rates))]}]
        groups += [{"params": [p for n, p in named if n.startswith(prefix)], "lr": rate} for prefix, rate in rates.items()]
        return groups

    def _forward_outputs(self, micro: Rollout, need_entropy: bool = False) -> ModelOutputs:
        micro = micro.to(self.dist.device)
        feats = self._confidence_features(micro)  # (b, R, 3) or None
        P, R = micro.prompt_len, micro.responses.shape[1]
        if self.sp is not None:
            return self._sequence_parallel_outputs(micro, feats)
        if self.cfg.packed:
            packed = pack(micro)
            kw = {}
            if feats is not None:  # at the positions whose outputs are read as values
                kw["confidence"] = feats.new_zeros(1, packed.input_ids.shape[1], feats.shape[-1])
                kw["confidence"][0, packed.predict_index] = feats[packed.rows, packed.cols]
            values = self.engine(input_ids=packed.input_ids, position_ids=packed.position_ids, **kw)
            return ModelOutputs(values=packed.to_response_layout(values[0, packed.predict_index].float()))
        kw = {}
        if feats is not None:
            kw["confidence"] = feats.new_zeros(*micro.input_ids.shape, feats.shape[-1])
            kw["confidence"][:, P - 1:P + R - 1] = feats
        values = self.engine(input_ids=micro.input_ids, attention_mask=micro.attention_mask,
                             position_ids=micro.position_ids, **kw)
        # V(state before response token t) = value at the column of the previous token.
        v = values[:, P - 1:P + R - 1].float()
        return ModelOutputs(values=v * micro.policy_mask)

    def _sequence_parallel_outputs(self, micro: Rollout, feats: torch.Tensor | None) -> ModelOutputs:
        """This rank's slice of the packed row (Ulysses attention), values at its n_r predicting
        positions, gathered to the micro-batch's (b, R) on every rank of the group."""
        packed = pack(micro)
        shard = shard_packed(packed, self.sp)
        kw = {}
        if feats is not None:  # (1, T, 3): the features at the positions whose outputs are read
            row = feats.new_zeros(1, packed.input_ids.shape[1], feats.shape[-1])
            row[0, packed.predict_index] = feats[packed.rows, packed.cols]
            kw["confidence"] = shard.local_rows(row)
        values = self.engine(input_ids=shard.input_ids, position_ids=shard.position_ids, **kw)  # (1, s)
        local = values[0].index_select(0, shard.local_predict).float()
        return ModelOutputs(values=packed.to_response_layout(gather_slices(local, shard, self.sp)))

    @torch.no_grad()
    def forward_values(self, batch: Rollout) -> torch.Tensor:
        """(B, R) values at response positions, zero at pads."""
        self.engine.eval()
        return self.per_token_outputs(batch, lambda micro: (self._forward_outputs(micro).values,))[0]

    def export(self, directory: str, extra: dict | None = None, masters: bool = False) -> None:
        """ValueModel format (loads with ``ValueModel.from_pretrained`` / ``init='checkpoint'``);
        ``masters``: a bf16 critic's trained weights in fp32, for a run that trains on from it."""
        state = self.full_state_dict(masters=masters)  # collective
        if self.dist.is_main:
            from transformers import AutoConfig, AutoModel
            from vcppo.models.value_model import save_value_model
            config = AutoConfig.from_pretrained(self.path)
            backbone = AutoModel.from_config(config)  # only a vessel for config + save_pretrained
            save_value_model(backbone, directory, state, tokenizer_src=self.path, extra=extra)
        barrier()
