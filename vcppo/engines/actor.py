"""The policy: a causal LM under DeepSpeed (ZeRO-3 by default): response logprobs and entropies,
one optimizer step (the gradient contract is in :mod:`vcppo.engines.deepspeed_engine`),
checkpoints and an HF-format export that vLLM and transformers load.
"""
from __future__ import annotations

import torch

from vcppo.algos.losses import entropy_from_logits
from vcppo.engines.deepspeed_engine import DeepSpeedModelEngine
from vcppo.engines.loss_contract import ModelOutputs
from vcppo.runtime.dist import DistInfo
from vcppo.runtime.collectives import barrier
from vcppo.engines import logprob_head
from vcppo.engines.logprob_head import LogprobRequest, requesting
from vcppo.engines.lora import save_adapter
from vcppo.engines.packing import pack, scatter_responses
from vcppo.engines.sequence_parallel import gather_slices, shard_packed
from vcppo.experience import Layout
from vcppo.models.export import save_causal_lm
from vcppo.config.schema import EngineConfig


def response_logprobs(logits: torch.Tensor, responses: torch.Tensor, temperature: float = 1.0):
    """The full-logits path: logits (..., V) aligned with responses (...) -> (logprobs (...) float32,
    scaled logits), every position's fp32 log-softmax held (and kept by autograd) at once."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1), logits


class ActorEngine(DeepSpeedModelEngine):
    """The policy: ``AutoModelForCausalLM`` under DeepSpeed.

    ``temperature``: the sampler's temperature. Every logprob this engine computes, before and
    during the update, is of ``softmax(logits / temperature)``, the distribution vLLM sampled from
    (its ``processed_logprobs``), so the PPO ratio compares like with like.

    ``cfg.logprob_chunk_size`` > 0: the LM head answers with logprobs and entropies computed a chunk
    of positions at a time (:mod:`vcppo.engines.logprob_head`); 0, or a head the chunked path cannot
    stand in for (``head`` is None), computes the full logits.
    """

    ADAPTER_TASK = "CAUSAL_LM"
    CONFIG_SECTION = "actor"

    def __init__(self, model_path: str, cfg: EngineConfig, dist: DistInfo, total_optimizer_steps: int,
                 dtype: str = "auto", train: bool = True, temperature: float = 1.0):
        self.model_path = model_path
        self.temperature = float(temperature)
        super().__init__(cfg, dist, total_optimizer_steps, dtype=dtype, train=train)
        self.head = logprob_head.install(self.module) if cfg.logprob_chunk_size > 0 else None

    def _build_module(self):
        from transformers import AutoModelForCausalLM
        m = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype)
        m.config.use_cache = False
        return m

    def _weights_source(self) -> str:
        return self.model_path

    def _forward_outputs(self, micro: Layout, need_entropy: bool) -> ModelOutputs:
        micro = micro.to(self.dist.device)
        if self.sp is not None:
            return self._sequence_parallel_outputs(micro, need_entropy)
        if self.head is None:
            return self._full_logits_outputs(micro, need_entropy)
        if self.cfg.packed:
            packed = pack(micro)
            rows, cols, keep, index = packed.rows, packed.cols, packed.predict_index, None
            inputs = dict(input_ids=packed.input_ids, position_ids=packed.position_ids)
        else:
            R = micro.responses.shape[1]
            rows, cols = micro.policy_mask.nonzero(as_tuple=True)
            # the last R + 1 positions reach the head; position (row, t) predicts response token t
            keep, index = R + 1, rows * (R + 1) + cols
            inputs = dict(input_ids=micro.input_ids, attention_mask=micro.attention_mask,
                          position_ids=micro.position_ids)
        request = LogprobRequest(micro.responses[rows, cols], index, self.temperature,
                                 self.cfg.logprob_chunk_size, need_entropy)
        with requesting(self.head, request):
            logp, entropy = self.engine(**inputs, use_cache=False, logits_to_keep=keep).logits
        shape = (micro.size, micro.responses.shape[1])
        return ModelOutputs(logprobs=scatter_responses(logp, rows, cols, shape),
                            entropy=scatter_responses(entropy, rows, cols, shape) if need_entropy else None)

    def _sequence_parallel_outputs(self, micro: Layout, need_entropy: bool) -> ModelOutputs:
        """This rank's slice of the packed row through the model (Ulysses attention), logprobs and
        entropies at the slice's n_r predicting positions (chunked head, or full logits), gathered
        to the micro-batch's (b, R) on every rank of the group."""
        packed = pack(micro)
        shard = shard_packed(packed, self.sp)
        targets = micro.responses[packed.rows, packed.cols][shard.take]
        inputs = dict(input_ids=shard.input_ids, position_ids=shard.position_ids, use_cache=False,
                      logits_to_keep=shard.local_predict)
        if self.head is not None:
            request = LogprobRequest(targets, None, self.temperature, self.cfg.logprob_chunk_size, need_entropy)
            with requesting(self.head, request):
                logp, entropy = self.engine(**inputs).logits
        else:
            logp, scaled = response_logprobs(self.engine(**inputs).logits[0], targets, self.temperature)
            entropy = entropy_from_logits(scaled) if need_entropy else None
        logp = packed.to_response_layout(gather_slices(logp, shard, self.sp))
        entropy = packed.to_response_layout(gather_slices(entropy, shard, self.sp)) if need_entropy else None
        return ModelOutputs(logprobs=logp, entropy=entropy)

    def _full_logits_outputs(self, micro: Layout, need_entropy: bool) -> ModelOutputs:
        """``logprob_chunk_size: 0``: the head's whole logits at every response position."""
        if self.cfg.packed:
            packed = pack(micro)
            out = self.engine(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                              logits_to_keep=packed.predict_index)
            logp, scaled = response_logprobs(out.logits[0], micro.responses[packed.rows, packed.cols],
                                             self.temperature)
            return ModelOutputs(logprobs=packed.to_response_layout(logp),
                                entropy=packed.to_response_layout(entropy_from_logits(scaled)) if need_entropy else None)
        R = micro.responses.shape[1]
        out = self.engine(input_ids=micro.input_ids, attention_mask=micro.attention_mask,
                          position_ids=micro.position_ids, use_cache=False, logits_to_keep=R + 1)
        logp, scaled = response_logprobs(out.logits[:, :-1], micro.responses, self.temperature)
        return ModelOutputs(logprobs=logp * micro.policy_mask,
                            entropy=entropy_from_logits(scaled) * micro.policy_mask if need_entropy else None)

    @torch.no_grad()
    def forward_logprobs(self, batch: Layout, with_entropy: bool = False):
        """(logprobs (B, R), entropy (B, R) or None); zeros at padded response positions."""
        self.engine.eval()
        def both(micro: Layout):
            out = self._forward_outputs(micro, with_entropy)
            return out.logprobs, out.entropy
        logprobs, entropy = self.per_token_outputs(batch, both)
        return logprobs, entropy

    def export_hf(self, directory: str) -> None:
        """Full weights as an HF causal-LM dir with the source's config, generation config and
        tokenizer files (:func:`vcppo.models.export.save_causal_lm`: tied and untied LM heads),
        written by rank 0; all ranks call."""
        state = self.full_state_dict()  # collective: every rank gathers
        if self.dist.is_main:
            save_causal_lm(state, self.model_path, directory, self.dtype)
        barrier()

    def export_adapter(self, directory: str, every_rank: bool = False) -> None:
        """With LoRA: the adapters alone, as peft's adapter directory over ``model_path`` (loads with
        ``peft.PeftModel.from_pretrained`` and as a vLLM ``LoRARequest``); all ranks call. Written by
        rank 0, or by ``every_rank`` into its own ``directory`` (each rank's vLLM reads its own)."""
        state = self.adapter_state_dict()  # collective
        if every_rank or self.dist.is_main:
            save_adapter(self.module, state, directory, self.model_path)
        if not every_rank:
            barrier()
