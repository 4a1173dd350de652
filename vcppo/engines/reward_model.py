"""A frozen reward model under DeepSpeed: one score per sequence, read at its last response token.

Built only when ``reward.model_path`` is set, on the training ranks (ZeRO-3 among them with
several, no optimizer). Configured by the ``reward_model`` section (micro-batch size or token
budget, packing, ZeRO stage, offload). Where in a row the score is read depends on the
directory's format (:mod:`vcppo.models.reward_model`): a `vcppo rm` head at the position that
predicts the last token (where it was trained), a sequence classifier at the last token itself.
"""
from __future__ import annotations

import torch

from vcppo.engines.deepspeed_engine import DeepSpeedModelEngine
from vcppo.runtime.dist import DistInfo
from vcppo.engines.packing import pack
from vcppo.experience import Layout, response_lengths
from vcppo.models.reward_model import VCPPO, load_score_module, reward_model_format
from vcppo.config.schema import EngineConfig


class RewardModelEngine(DeepSpeedModelEngine):
    def __init__(self, path: str, cfg: EngineConfig, dist: DistInfo, dtype: str = "auto"):
        self.path = path
        self.format = reward_model_format(path)
        # 1: read one position before the last token (the critic's reading a `vcppo rm` head learnt)
        self.offset = 1 if self.format == VCPPO else 0
        super().__init__(cfg, dist, total_optimizer_steps=0, dtype=dtype, train=False)
        # transformers pools a classifier at the last token that is not the pad id: where pad == eos,
        # the token before a final eos (and that is where such a reward model was trained)
        self.pad_id = getattr(self.module.config, "pad_token_id", None) if self.format != VCPPO else None

    def _build_module(self) -> torch.nn.Module:
        return load_score_module(self.path, self.format, self.dtype)

    def _micro_scores(self, micro: Layout) -> tuple[torch.Tensor]:
        """(b, 1) scores of one micro-batch."""
        micro = micro.to(self.dist.device)
        n = response_lengths(micro).long()  # an episode's observation tokens count: its last token is the end
        back = self.offset * (n > 0).long()  # an empty response is scored at its prompt's last token
        if self.pad_id is not None:
            last = micro.responses.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0]
            back = back + ((n > 0) & (last == self.pad_id)).long()
        if self.cfg.packed:
            packed = pack(micro)
            ends = micro.attention_mask.sum(1).cumsum(0) - 1  # packed index of each row's last token
            out = self.engine(input_ids=packed.input_ids, position_ids=packed.position_ids)
            return (out[0, ends - back].float()[:, None],)
        out = self.engine(input_ids=micro.input_ids, attention_mask=micro.attention_mask,
                          position_ids=micro.position_ids)
        cols = micro.prompt_len + n - 1 - back
        return (out.gather(1, cols[:, None]).float(),)

    @torch.no_grad()
    def score(self, batch: Layout) -> torch.Tensor:
        """(B,) score of each sequence (collective with several ranks: every rank calls)."""
        self.engine.eval()
        return self.per_token_outputs(batch, self._micro_scores)[0][:, 0]
