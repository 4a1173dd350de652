"""A whole run's plan: memory per GPU of every role in each phase, the verdicts, and a step's time.

Phases. Colocated (``placement.mode: colocated``), every rank holds the resident model states of
every engine throughout; while vLLM samples it adds its whole budget (``gpu_memory_utilization`` x
device memory), and while the models train vLLM sleeps (level 1: KV cache freed, weights moved to
host memory; vcppo.engines.rollout.RolloutEngine.sleep), so training adds only the working set of
the engine that runs (its ZeRO-3 gather buffer and activations; the engines train in turn). On CPU
vLLM does not sleep. Split, the rollout ranks hold only vLLM and the training ranks only the
DeepSpeed engines, partitioned among themselves.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from vcppo.config.placement import Placement
from vcppo.plan import memory as M
from vcppo.plan import timing as T
from vcppo.plan.hardware import GiB, Hardware, dtype_bytes
from vcppo.models.shapes import ModelShape
from vcppo.config.schema import Config
from vcppo.errors import ConfigError
from vcppo.methods import uses_critic


@dataclass(frozen=True)
class Cluster:
    hardware: Hardware
    gpus_per_node: int = 8
    nodes: int = 1

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    def group_link(self, size: int) -> float:
        """Bytes/s one GPU sends to the others of a group of ``size`` consecutive ranks: NVLink when
        every such group lies within a node, else the network adapter (the slowest hop decides)."""
        within = size <= self.gpus_per_node and self.gpus_per_node % size == 0
        return self.hardware.node_link if within else self.hardware.network_link


@dataclass(frozen=True)
class Shapes:
    policy: ModelShape
    critic: ModelShape
    reward_model: ModelShape


@dataclass(frozen=True)
class EngineMemory:
    """One DeepSpeed engine on one of its ranks, in bytes."""
    role: str
    ranks: int
    zero_stage: int
    n_params: int
    states: M.ModelStates
    activations_bytes: float            # at the configured gradient_checkpointing
    activations_no_ckpt_bytes: float
    activations_ckpt_bytes: float
    micro_batch_tokens: int
    logprob_chunk_size: int = 0         # the LM head's chunked path (0: full logits, or no LM head)
    logits_bytes: float = 0.0           # the head's share of activations_bytes
    sequence_parallel: int = 1          # ranks sharing each micro-batch (activations are one rank's slice)

    @property
    def working_bytes(self) -> float:
        """What the engine adds on top of the resident states while it runs."""
        return self.states.gather_bytes + self.activations_bytes


@dataclass(frozen=True)
class Check:
    """One phase on one kind of rank: the bytes it needs per GPU against what the device offers."""
    phase: str
    kind: str                           # "train" | "rollout"
    need_bytes: float
    usable_bytes: float
    kv_sequences: int | None = None     # rollout: max-length sequences the KV cache holds

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.usable_bytes and (self.kv_sequences is None or self.kv_sequences >= 1)


@dataclass(frozen=True)
class StepTime:
    rollout_s: float
    training_s: float
    step_s: float
    responses: int
    train_tokens: float
    rollout_gpus: int
    training_gpus: int
    training_mfu: float = 0.0           # the training FLOPs' share of the training GPUs' peak over training_s
    mean_prompt_tokens: float = 0.0
    mean_response_tokens: float = 0.0
    exchange_s: float = 0.0             # of training_s: sequence parallelism's all-to-all (all passes)


@dataclass(frozen=True)
class Lengths:
    """Mean prompt and response tokens of a step's sequences; by default prompts at
    ``data.max_prompt_tokens`` and responses spread evenly up to ``rollout.max_response_tokens``
    (mean: half of it). ``vcppo plan --prompt-tokens / --response-tokens`` set them (a run's
    ``response/length_mean`` says what a model does)."""
    prompt: float
    response: float

    @classmethod
    def of(cls, cfg: Config, prompt: float | None = None, response: float | None = None) -> "Lengths":
        return cls(float(cfg.data.max_prompt_tokens if prompt is None else prompt),
                   float(cfg.rollout.max_response_tokens / 2 if response is None else response))


@dataclass(frozen=True)
class Plan:
    cluster: Cluster
    dtype_bytes: int
    engines: list[EngineMemory]
    rollout: M.RolloutMemory
    checks: list[Check]
    time: StepTime
    cpu_bytes_per_node: float
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(c.fits for c in self.checks)


def ranks(cfg: Config, cluster: Cluster, placement: Placement | None = None) -> tuple[int, int]:
    """(training ranks, rollout ranks) of the run, as its placement (None: built from ``cfg``) shares
    ``cluster``'s GPUs out; with ``placement.critic_ranks`` the training ranks are the actor's."""
    try:
        return (placement or Placement.of(cfg)).ranks(cluster.world)
    except ConfigError as e:
        raise ConfigError(f"{e} ({cluster.world} GPUs: {cluster.gpus_per_node} per node x {cluster.nodes} nodes)") from None


def sequence_parallel(engine_cfg) -> int:
    """``sequence_parallel_size`` of an engine section (1 where the schema has no such key: the
    reference and reward model run whole sequences)."""
    return int(getattr(engine_cfg, "sequence_parallel_size", 1) or 1)


def sequence_parallel_problem(size: int, shape: ModelShape, train_ranks: int) -> str | None:
    """Why ``size`` ranks cannot form SP groups for this model on ``train_ranks`` ranks, or None: the
    size must divide the training ranks and, by Ulysses' rule, the query heads, while the KV heads
    must be divisible by it or divide it (replicated); the rule of
    vcppo.engines.sequence_parallel.head_problem, restated without torch (a test holds them together)."""
    if train_ranks % size:
        return f"{size} does not divide the {train_ranks} training ranks"
    if shape.num_heads % size:
        return f"{size} does not divide {shape.name}'s {shape.num_heads} attention heads"
    if shape.num_kv_heads % size and size % shape.num_kv_heads:
        return f"{size} neither divides nor is a multiple of {shape.name}'s {shape.num_kv_heads} KV heads"
    return None


def sequence_parallel_sizes(shape: ModelShape, train_ranks: int) -> list[int]:
    """Every SP size this model and these ranks allow, ascending (1 first)."""
    return [n for n in range(1, train_ranks + 1) if sequence_parallel_problem(n, shape, train_ranks) is None]


def micro_batch_tokens(engine_cfg, max_sequence: int) -> int:
    """Tokens of the largest micro-batch (of an SP group, which counts the budget and micro-batch
    size per group): the token budget (a longer sequence gets one of its own) or micro_batch_size
    sequences all at the maximum length."""
    if engine_cfg.max_tokens_per_micro_batch > 0:
        return max(engine_cfg.max_tokens_per_micro_batch, max_sequence)
    return engine_cfg.micro_batch_size * max_sequence


def builds_reference(cfg: Config) -> bool:
    """A reference engine of its own: a KL is on and the actor has no LoRA (a LoRA actor with its
    adapters off is the reference)."""
    return cfg.algorithm.kl_coef > 0 and cfg.actor.lora.rank == 0


def engine_roles(cfg: Config, shapes: Shapes) -> list[tuple[str, object, int, ModelShape, bool, bool]]:
    """(role, its config section, parameters, shape, trained, has an LM head) of every engine the run builds."""
    out = [("actor", cfg.actor, shapes.policy.params, shapes.policy, True, True)]
    if uses_critic(cfg.algorithm.advantage_estimator):
        out.append(("critic", cfg.critic, shapes.critic.value_model_params, shapes.critic, True, False))
    if builds_reference(cfg):
        out.append(("reference", cfg.reference, shapes.policy.params, shapes.policy, False, True))
    if cfg.reward.model_path:
        out.append(("reward_model", cfg.reward_model, shapes.reward_model.value_model_params,
                    shapes.reward_model, False, False))
    return out


def lora_trained(engine_cfg, shape: ModelShape, value_model: bool) -> int | None:
    """What trains when not every parameter does: with ``lora`` on, the adapters' parameters plus a value
    model's head; with ``critic.freeze``, the value model's unfrozen parameters; else None."""
    lora = getattr(engine_cfg, "lora", None)
    freeze = list(getattr(engine_cfg, "freeze", []) or []) if value_model else []
    if freeze:  # critic.freeze: only what stays trainable carries gradients and optimizer states
        rank = 0 if lora is None else lora.rank
        return M.value_model_trained(shape, freeze, rank, list(lora.target_modules) if rank else None)
    if lora is None or lora.rank == 0:
        return None
    head = shape.hidden_size + 1 if value_model else 0
    return shape.lora_params(lora.rank, lora.target_modules) + head


def logprob_chunk(engine_cfg) -> int:
    """``logprob_chunk_size`` of an engine section (0 where the schema has no such key)."""
    return int(getattr(engine_cfg, "logprob_chunk_size", 0) or 0)


def engine_memory(cfg: Config, shapes: Shapes, train_ranks: int, d: int) -> list[EngineMemory]:
    prompt, response = cfg.data.max_prompt_tokens, cfg.rollout.max_response_tokens
    out = []
    for role, ecfg, n, shape, trained, lm_head in engine_roles(cfg, shapes):
        chunk = logprob_chunk(ecfg) if lm_head else 0
        lora = lora_trained(ecfg, shape, value_model=not lm_head)
        stage = M.auto_zero_stage(ecfg.zero_stage, train_ranks)
        largest = shape.largest_module_params
        states = M.model_states(n, largest, train_ranks, stage, d, trained,
                                offload_optimizer=getattr(ecfg, "offload_optimizer", False),
                                offload_params=ecfg.offload_params,
                                trained_params=lora)
        tokens = micro_batch_tokens(ecfg, prompt + response)
        answer_tokens = tokens * response // (prompt + response)
        sp = sequence_parallel(ecfg)
        acts = {ckpt: M.activations(shape, tokens, answer_tokens, d, checkpointing=ckpt, backward=trained,
                                    lm_head=lm_head, logprob_chunk_size=chunk,
                                    head_trained=trained and lora is None, sequence_parallel=sp)
                for ckpt in (False, True)}
        configured = acts[bool(getattr(ecfg, "gradient_checkpointing", False))]
        out.append(EngineMemory(role, train_ranks, stage, n, states, configured.total_bytes,
                                acts[False].total_bytes, acts[True].total_bytes, tokens, chunk,
                                configured.logits_bytes, sp))
    return out


def rollout_share(cfg: Config, cluster: Cluster) -> float:
    """``rollout.gpu_memory_utilization``, or the engine's default when null: 0.4 of a GPU, 0.05 of
    host memory on CPU (vcppo.engines.rollout.memory_share; not imported, it needs torch)."""
    util = cfg.rollout.gpu_memory_utilization
    if util is None:
        util = 0.05 if cluster.hardware.is_cpu else 0.4
    return float(util)


def rollout_memory(cfg: Config, shape: ModelShape, cluster: Cluster, d: int) -> M.RolloutMemory:
    util = rollout_share(cfg, cluster)
    return M.rollout_memory(shape, d, cfg.rollout.tensor_parallel_size, util, cluster.hardware.memory_bytes,
                            cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens,
                            on_cpu=cluster.hardware.is_cpu)


def phase_checks(cfg: Config, cluster: Cluster, engines: list[EngineMemory], vllm: M.RolloutMemory,
                 placement: Placement) -> list[Check]:
    """The phases whose memory must fit (see the module docstring). On a CPU "device" the ranks of a
    node share its memory: each gets its share."""
    usable = cluster.hardware.usable_bytes / (cluster.gpus_per_node if cluster.hardware.is_cpu else 1)
    resident = sum(e.states.resident_bytes for e in engines)
    working = max(e.working_bytes for e in engines)
    kv_sequences = vllm.max_length_sequences
    if placement.rollout_apart:
        vllm_check = Check("rollout ranks: vLLM", "rollout", vllm.budget_bytes, usable, kv_sequences)
        if not placement.critic_apart:
            return [Check("training ranks: states + working set", "train", resident + working, usable), vllm_check]
        actor = [e for e in engines if e.role != "critic"]
        critic = [e for e in engines if e.role == "critic"]
        return [Check(f"{name} ranks: states + working set", "train",
                      sum(e.states.resident_bytes for e in part) + max(e.working_bytes for e in part), usable)
                for name, part in (("actor", actor), ("critic", critic))] + [vllm_check]
    asleep = cfg.rollout.free_memory_during_training and not cluster.hardware.is_cpu
    during_training = resident + working + (0.0 if asleep else vllm.budget_bytes)
    return [Check("training (vLLM asleep)" if asleep else "training (vLLM awake)", "train", during_training, usable),
            Check("rollout: states + vLLM", "rollout", resident + vllm.budget_bytes, usable, kv_sequences)]


def cpu_bytes_per_node(cfg: Config, cluster: Cluster, engines: list[EngineMemory], vllm: M.RolloutMemory,
                       placement: Placement) -> float:
    """Offloaded states of the training ranks on one node, plus vLLM's weights while it sleeps
    (level 1 keeps them in host memory)."""
    train_ranks, _ = ranks(cfg, cluster, placement)
    per_node = min(cluster.gpus_per_node, train_ranks)
    offloaded = sum(e.states.cpu_bytes for e in engines) * per_node
    sleeping = placement.rollout_beside_training and cfg.rollout.free_memory_during_training
    return offloaded + (vllm.weights_bytes * cluster.gpus_per_node if sleeping and not cluster.hardware.is_cpu else 0.0)


def micro_batching(engine_cfg, sequences: int, lengths: Lengths, width: int) -> tuple[int, float]:
    """(micro-batches, computed tokens each) of one rank's ``sequences`` in one pass: token budgets
    filled nearly full (first-fit decreasing), or ``micro_batch_size`` sequences of the mean length
    when packed, of the full ``width`` (prompt + response maxima) when padded."""
    real = lengths.prompt + lengths.response
    if engine_cfg.max_tokens_per_micro_batch > 0:
        total = sequences * real
        n = max(1, math.ceil(total / max(engine_cfg.max_tokens_per_micro_batch, width)))
        return n, total / n
    n = max(1, math.ceil(sequences / max(1, engine_cfg.micro_batch_size)))
    return n, sequences * (real if getattr(engine_cfg, "packed", True) else width) / n


def trained_models(cfg: Config, shapes: Shapes, lengths: Lengths, responses: int, cluster: Cluster,
                   d: int) -> list[T.TrainedModel]:
    """The step's passes (vcppo.plan.timing.step_passes) as FLOP accounts with their micro-batches:
    the step's ``responses`` dealt over the data-parallel groups (training ranks / SP; an SP group's
    micro-batches are formed over its ranks' sequences together), one rank's tokens a micro-batch
    (its 1/SP slice), and the all-to-all bytes and link of the SP group."""
    width = cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens
    sections = {"actor": cfg.actor, "critic": cfg.critic}
    train_ranks, _ = ranks(cfg, cluster)
    models = []
    for role, (forward, train) in T.step_passes(cfg).items():
        shape = shapes.critic if role == "critic" else shapes.reward_model if role == "reward_model" else shapes.policy
        n = shape.params if role in ("actor", "reference") else shape.value_model_params
        # under LoRA the reference is the actor with its adapters off: the actor's micro-batches
        ecfg = cfg.actor if role == "reference" and not builds_reference(cfg) else getattr(cfg, role)
        sp = sequence_parallel(ecfg)
        n_mb, mb_tokens = micro_batching(ecfg, math.ceil(responses / max(1, train_ranks // sp)), lengths, width)
        trained = role in sections
        models.append(T.TrainedModel(role, n, forward_passes=forward, train_passes=train,
                                     checkpointing=trained and sections[role].gradient_checkpointing,
                                     frozen_weights=trained and sections[role].lora.rank > 0,
                                     num_layers=shape.num_layers, micro_batches=n_mb, micro_batch_tokens=mb_tokens / sp,
                                     sequence_parallel=sp, link_bandwidth=cluster.group_link(sp),
                                     exchange_bytes_per_token=T.alltoall_bytes_per_token(shape, d, sp)))
    return models


def step_time(cfg: Config, shapes: Shapes, cluster: Cluster, engines: list[EngineMemory],
              vllm: M.RolloutMemory, d: int, mfu: float | None, lengths: Lengths | None = None,
              placement: Placement | None = None) -> StepTime:
    """Rollout and training seconds of one step (vcppo.plan.timing; lengths spread evenly up to
    rollout.max_response_tokens, so the mean response is half the maximum, unless ``lengths`` says
    otherwise for training). ``mfu`` None: training by the measured pass model, rollout at
    timing.ROLLOUT_MFU."""
    lengths, placement = lengths or Lengths.of(cfg), placement or Placement.of(cfg)
    train_gpus, rollout_gpus = ranks(cfg, cluster, placement)
    prompt, response = cfg.data.max_prompt_tokens, cfg.rollout.max_response_tokens
    responses = cfg.trainer.prompts_per_step * cfg.rollout.n_samples_per_prompt
    tp = cfg.rollout.tensor_parallel_size
    replicas = max(1, rollout_gpus // tp)
    concurrency = min(M.VLLM_MAX_NUM_SEQS, vllm.kv_tokens // (prompt + response // 2))
    setup = T.DecodeSetup(shapes.policy.params, vllm.weights_bytes, vllm.kv_bytes_per_token, tp,
                          T.replica_sequences(responses, replicas), max(1, concurrency), prompt, response)
    rollout_mfu = mfu if mfu is not None else T.ROLLOUT_MFU
    # no sequence of the maximum length fits the KV cache: vLLM cannot run the step at all
    rollout_s = (T.rollout_seconds(setup, cluster.hardware, d, rollout_mfu) if vllm.max_length_sequences >= 1
                 else math.inf)
    tokens = responses * (lengths.prompt + lengths.response)
    models = trained_models(cfg, shapes, lengths, responses, cluster, d)
    if placement.critic_apart:  # the two updates side by side
        sides = ([m for m in models if m.role != "critic"], [m for m in models if m.role == "critic"])
        training_s = max(T.training_seconds(side, tokens, cluster.hardware, d, train_gpus, mfu) for side in sides)
        flop_gpus = 2 * train_gpus
    else:
        training_s = T.training_seconds(models, tokens, cluster.hardware, d, train_gpus, mfu)
        flop_gpus = train_gpus
    flops = sum(T.training_flops(m, tokens) for m in models)
    exchange_s = sum(m.forward_passes * m.exchange_seconds("forward") + m.train_passes * m.exchange_seconds("update")
                     for m in models)
    training_mfu = flops / (flop_gpus * cluster.hardware.flops(d) * training_s) if training_s > 0 else 0.0
    step_s = max(rollout_s, training_s) if placement.overlapped else rollout_s + training_s
    return StepTime(rollout_s, training_s, step_s, responses, tokens, rollout_gpus, train_gpus, training_mfu,
                    lengths.prompt, lengths.response, exchange_s)


def plan_run(cfg: Config, shapes: Shapes, cluster: Cluster, mfu: float | None = None,
             lengths: Lengths | None = None) -> Plan:
    """Memory per GPU, verdicts and step time of ``cfg`` on ``cluster``. ``mfu`` None: training time
    from the measured pass model (vcppo.plan.timing), else a constant share of peak."""
    if cfg.rollout.tensor_parallel_size > cluster.world or cluster.world % cfg.rollout.tensor_parallel_size:
        raise ConfigError(f"config key 'rollout.tensor_parallel_size' ({cfg.rollout.tensor_parallel_size}) "
                          f"must divide the {cluster.world} GPUs")
    d = dtype_bytes(cfg.model.dtype, cluster.hardware)
    placement = Placement.of(cfg)  # once per plan, passed on
    train_ranks, _ = ranks(cfg, cluster, placement)
    for role, ecfg, _, shape, trained, _ in engine_roles(cfg, shapes):
        problem = sequence_parallel_problem(sequence_parallel(ecfg), shape, train_ranks) if trained else None
        if problem:
            raise ConfigError(f"config key '{role}.sequence_parallel_size': {problem}")
    engines = engine_memory(cfg, shapes, train_ranks, d)
    vllm = rollout_memory(cfg, shapes.policy, cluster, d)
    notes = []
    if placement.rollout_apart and rollout_share(cfg, cluster) < 0.8:
        notes.append("split: the rollout ranks run only vLLM; rollout.gpu_memory_utilization=0.9 gives it "
                     "the rest of their memory as KV cache")
    return Plan(cluster, d, engines, vllm, phase_checks(cfg, cluster, engines, vllm, placement),
                step_time(cfg, shapes, cluster, engines, vllm, d, mfu, lengths, placement),
                cpu_bytes_per_node(cfg, cluster, engines, vllm, placement), notes)


def gib(n: float) -> float:
    return n / GiB
