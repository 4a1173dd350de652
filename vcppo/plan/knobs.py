"""The knob that makes a run fit: a search over settings, in a stated order, cheapest first.

Each round plans the run, takes the first phase that does not fit (training before rollout) and
adds the first knob of that phase's ladder that changes anything; knobs accumulate until every
phase fits. The answer is the list of ``key=value`` overrides (and ``--nodes N``) of the first
setting that fits, or None when the ladders run out.

Training phase: 1. the chunked logprob path (``logprob_chunk_size``, vcppo.plan.memory) on an
engine with an LM head that runs the full-logits path and whose logits outweigh its layers'
activations (it recomputes only the head's matmul in backward: under 3% more FLOPs at 7B);
2. gradient checkpointing of the trained engines (recomputes a forward: ~+33% training FLOPs);
3. halve the micro-batch (or the token budget) of the engine with the largest working set, down to
one sequence; 4. optimizer offload (ZeRO-Offload: host memory and a CPU Adam step; not on a CPU
"device", whose host memory it is); 5. sequence parallelism for the engine with the largest working
set, the next size up that divides the training ranks and suits the model's heads
(:func:`vcppo.plan.advise.sequence_parallel_sizes`; colocated only): its activations per rank
divide by the size, at the cost of Ulysses' all-to-all and shorter micro-batches per rank
(vcppo.plan.timing), what one sequence too long for a rank needs once it trains alone; 6. parameter
offload (as 4); 7. twice the nodes.
Rollout phase: 1. the gpu_memory_utilization that fills what the resident states leave, when its KV
cache still holds a sequence of the maximum length; 2. twice the vLLM tensor parallelism
(colocated only); 3.-5. offload and nodes as for training, since offload also shrinks what stays
resident.

A run that fits may still run far slower than it needs to (a 32B rollout on one GPU per replica
holds one long sequence in its KV cache at a time). :func:`find_faster` tries, from the setting
that fits, the knobs that trade memory for time, one at a time, keeping the best that still fits
while it cuts the planned step by more than :data:`MIN_GAIN`: twice the vLLM tensor parallelism,
the vLLM share that fills what the states leave, twice a trained engine's micro-batch, and
gradient checkpointing off (with the smallest SP size that then fits). The plan names them when
they cut the step by more than :data:`REPORT_SPEEDUP` in all.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

import yaml

from vcppo.config.placement import Placement
from vcppo.plan import memory as M
from vcppo.plan.advise import (Cluster, Plan, Shapes, builds_reference, plan_run, ranks, rollout_share,
                               sequence_parallel_problem, sequence_parallel_sizes)
from vcppo.config.schema import Config
from vcppo.methods import uses_critic

MAX_NODES = 64
MAX_ROUNDS = 24
CHUNK_SIZE = 1024  # the schema's default logprob_chunk_size
MIN_GAIN = 1.05        # a faster knob is kept when it cuts the planned step by more than this factor
REPORT_SPEEDUP = 1.5   # the plan names the faster knobs when together they cut it by more than this


@dataclass(frozen=True)
class Setting:
    cfg: Config
    cluster: Cluster

    @property
    def placement(self) -> Placement:
        """The setting's placement (its answers: which ranks sample, what it supports)."""
        return Placement.of(self.cfg)


def apply(setting: Setting, knob: list[str]) -> Setting:
    """``knob``: ``section.key=value`` overrides (values already in their schema type's spelling) and
    ``--nodes=N``."""
    cfg, cluster = copy.deepcopy(setting.cfg), setting.cluster
    for item in knob:
        key, value = item.split("=", 1)
        if key == "--nodes":
            cluster = replace(cluster, nodes=int(value))
            continue
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, yaml.safe_load(value))  # true / 2 / 0.55, as on a command line
    return Setting(cfg, cluster)


def trained_sections(cfg: Config) -> list[str]:
    return ["actor"] + (["critic"] if uses_critic(cfg.algorithm.advantage_estimator) else [])


def all_sections(cfg: Config) -> list[str]:
    return trained_sections(cfg) + (["reference"] if builds_reference(cfg) else []) \
        + (["reward_model"] if cfg.reward.model_path else [])


def _offload(s: Setting, plan: Plan, flag: str, sections: list[str]) -> list[str]:
    """``section.flag=true`` where it is off, with ZeRO-3 where the stage would not offload."""
    stages = {e.role: e.zero_stage for e in plan.engines}
    out = []
    for sec in sections:
        if not getattr(getattr(s.cfg, sec), flag, True):
            out.append(f"{sec}.{flag}=true")
            if stages.get(sec, 3) != 3:
                out.append(f"{sec}.zero_stage=3")
    return out


def smaller_micro_batch(s: Setting, plan: Plan) -> list[str]:
    """Halve the micro-batch of the trained engine with the largest working set."""
    longest = s.cfg.data.max_prompt_tokens + s.cfg.rollout.max_response_tokens
    for e in sorted((e for e in plan.engines if e.role in trained_sections(s.cfg)), key=lambda e: -e.working_bytes):
        ecfg = getattr(s.cfg, e.role)
        if ecfg.max_tokens_per_micro_batch > longest:
            return [f"{e.role}.max_tokens_per_micro_batch={max(longest, ecfg.max_tokens_per_micro_batch // 2)}"]
        if ecfg.max_tokens_per_micro_batch == 0 and ecfg.micro_batch_size > 1:
            return [f"{e.role}.micro_batch_size={ecfg.micro_batch_size // 2}"]
    return []


def chunked_logprobs(plan: Plan) -> list[str]:
    """``role.logprob_chunk_size=1024`` for every engine with an LM head on the full-logits path whose
    logits outweigh the rest of its activations."""
    return [f"{e.role}.logprob_chunk_size={CHUNK_SIZE}" for e in plan.engines
            if e.role in ("actor", "reference") and e.logprob_chunk_size == 0
            and e.logits_bytes > e.activations_bytes - e.logits_bytes]


def more_nodes(s: Setting) -> list[str]:
    return [f"--nodes={s.cluster.nodes * 2}"] if s.cluster.nodes * 2 <= MAX_NODES else []


def fitting_share(s: Setting, plan: Plan, shapes: Shapes) -> list[str]:
    """The largest gpu_memory_utilization (in steps of 0.05) that the resident states leave room for,
    if it differs from the current one and its KV cache holds a sequence of the maximum length."""
    hw = s.cluster.hardware
    resident = 0.0 if s.placement.rollout_apart else sum(e.states.resident_bytes for e in plan.engines)
    share = min(0.95, math.floor((hw.usable_bytes - resident) / hw.memory_bytes * 20) / 20)
    if share < 0.05 or abs(share - rollout_share(s.cfg, s.cluster)) < 1e-9:
        return []
    vllm = M.rollout_memory(shapes.policy, plan.dtype_bytes, s.cfg.rollout.tensor_parallel_size, share,
                            hw.memory_bytes, plan.rollout.max_sequence_tokens, on_cpu=hw.is_cpu)
    return [f"rollout.gpu_memory_utilization={share}"] if vllm.max_length_sequences >= 1 else []


def wider_tensor_parallel(s: Setting, shapes: Shapes) -> list[str]:
    tp = s.cfg.rollout.tensor_parallel_size * 2
    if s.placement.rollout_apart or s.cluster.gpus_per_node % tp or shapes.policy.num_heads % tp:
        return []
    return [f"rollout.tensor_parallel_size={tp}"]


def section_shape(section: str, shapes: Shapes):
    return shapes.critic if section == "critic" else shapes.policy


def next_sequence_parallel(s: Setting, section: str, shapes: Shapes, current: int) -> int | None:
    """The smallest SP size above ``current`` that ``section``'s model and the training ranks allow
    (None under split placement, which SP does not support yet, or when there is none)."""
    if not s.placement.sequence_parallel:
        return None
    train_ranks, _ = ranks(s.cfg, s.cluster)
    return next((n for n in sequence_parallel_sizes(section_shape(section, shapes), train_ranks) if n > current), None)


def wider_sequence_parallel(s: Setting, plan: Plan, shapes: Shapes) -> list[str]:
    """The next SP size for the trained engine with the largest working set (it decides the training
    phase's need); [] when it has none left."""
    trained = [e for e in plan.engines if e.role in trained_sections(s.cfg)]
    largest = max(trained, key=lambda e: e.working_bytes)
    size = next_sequence_parallel(s, largest.role, shapes, largest.sequence_parallel)
    return [f"{largest.role}.sequence_parallel_size={size}"] if size else []


def next_knob(s: Setting, plan: Plan, shapes: Shapes) -> list[str]:
    """The first knob of the first failing phase's ladder that changes anything ([] when none does)."""
    failing = next(c for c in plan.checks if not c.fits)
    trained, every = trained_sections(s.cfg), all_sections(s.cfg)
    offload = not s.cluster.hardware.is_cpu  # on a CPU "device", offloading moves nothing off it
    ladder = []
    if failing.kind == "train":
        ladder.append(lambda: chunked_logprobs(plan))
        ladder.append(lambda: [f"{sec}.gradient_checkpointing=true" for sec in trained
                               if not getattr(s.cfg, sec).gradient_checkpointing])
        ladder.append(lambda: smaller_micro_batch(s, plan))
        if offload:
            ladder.append(lambda: _offload(s, plan, "offload_optimizer", trained))
        ladder.append(lambda: wider_sequence_parallel(s, plan, shapes))
    else:
        ladder.append(lambda: fitting_share(s, plan, shapes))
        ladder.append(lambda: wider_tensor_parallel(s, shapes))
        if offload:
            ladder.append(lambda: _offload(s, plan, "offload_optimizer", trained))
    if offload:
        ladder.append(lambda: _offload(s, plan, "offload_params", every))
    ladder.append(lambda: more_nodes(s))
    for step in ladder:
        knob = step()
        if knob:
            return knob
    return []


def find_fit(setting: Setting, shapes: Shapes, mfu: float | None = None,
             lengths=None) -> tuple[list[str] | None, Plan]:
    """(the overrides that make the run fit, [] when it already does, None when no knob does; the
    plan of the last setting tried). ``mfu``, ``lengths``: as for plan_run."""
    knobs: list[str] = []
    plan = plan_run(setting.cfg, shapes, setting.cluster, mfu, lengths)
    for _ in range(MAX_ROUNDS):
        if plan.fits:
            return merged(knobs), plan
        knob = next_knob(setting, plan, shapes)
        if not knob:
            return None, plan
        knobs += knob
        setting = apply(setting, knob)
        plan = plan_run(setting.cfg, shapes, setting.cluster, mfu, lengths)
    return (merged(knobs), plan) if plan.fits else (None, plan)


def merged(knobs: list[str]) -> list[str]:
    """The overrides with only the last value of each key, in the order keys were first set."""
    last = {}
    for item in knobs:
        key, _ = item.split("=", 1)
        last[key] = item
    return list(last.values())


# ---------------------------------------------------------------------------------------------
# Faster settings that still fit

def larger_micro_batch(s: Setting, section: str) -> list[str]:
    """Twice ``section``'s token budget, or its micro-batch size when it has none."""
    ecfg = getattr(s.cfg, section)
    if ecfg.max_tokens_per_micro_batch > 0:
        return [f"{section}.max_tokens_per_micro_batch={ecfg.max_tokens_per_micro_batch * 2}"]
    return [f"{section}.micro_batch_size={ecfg.micro_batch_size * 2}"]


def without_checkpointing(s: Setting, section: str, shapes: Shapes, fits) -> list[str]:
    """``section.gradient_checkpointing=false`` (a third fewer training FLOPs), with the smallest SP
    size (the current one first) at which ``fits`` says the setting still fits; [] when none does."""
    ecfg = getattr(s.cfg, section)
    if not ecfg.gradient_checkpointing:
        return []
    knob, size = [f"{section}.gradient_checkpointing=false"], ecfg.sequence_parallel_size
    while size is not None:
        sized = knob + ([f"{section}.sequence_parallel_size={size}"] if size != ecfg.sequence_parallel_size else [])
        if fits(sized):
            return sized
        size = next_sequence_parallel(s, section, shapes, size)
    return []


def faster_candidates(s: Setting, plan: Plan, shapes: Shapes, fits) -> list[list[str]]:
    """The single moves :func:`find_faster` weighs (see the module docstring)."""
    out = [wider_tensor_parallel(s, shapes), fitting_share(s, plan, shapes)]
    for sec in trained_sections(s.cfg):
        out += [larger_micro_batch(s, sec), without_checkpointing(s, sec, shapes, fits)]
    return [k for k in out if k]


def find_faster(setting: Setting, shapes: Shapes, mfu: float | None = None,
                lengths=None) -> tuple[list[str], Plan]:
    """(the knobs, beyond ``setting``, of the fastest fitting setting a greedy search finds, [] when
    none cuts the step by more than MIN_GAIN; its plan). ``setting`` must fit. Each round plans every
    candidate move and keeps the one with the shortest step that fits."""
    plan = plan_run(setting.cfg, shapes, setting.cluster, mfu, lengths)
    knobs: list[str] = []
    for _ in range(MAX_ROUNDS):
        def fits(knob, base=setting):
            return plan_run(apply(base, knob).cfg, shapes, base.cluster, mfu, lengths).fits
        best = None
        for knob in faster_candidates(setting, plan, shapes, fits):
            tried = plan_run(apply(setting, knob).cfg, shapes, setting.cluster, mfu, lengths)
            if tried.fits and tried.time.step_s * MIN_GAIN < plan.time.step_s \
                    and (best is None or tried.time.step_s < best[1].time.step_s):
                best = (knob, tried)
        if best is None:
            break
        knobs += best[0]
        setting, plan = apply(setting, best[0]), best[1]
    return merged(knobs), plan


def sequence_parallel_limits(s: Setting, shapes: Shapes) -> str:
    """Which SP sizes the trained engines' models and training ranks allow, and why no larger one."""
    if not s.placement.sequence_parallel:
        return f"sequence parallelism does not run under placement.mode={s.placement.name} yet"
    train_ranks, _ = ranks(s.cfg, s.cluster)
    by_shape: dict = {}
    for sec in trained_sections(s.cfg):
        by_shape.setdefault(section_shape(sec, shapes), []).append(f"{sec}.sequence_parallel_size")
    out = []
    for shape, keys in by_shape.items():
        sizes = sequence_parallel_sizes(shape, train_ranks)
        above = next((n for n in range(sizes[-1] + 1, train_ranks + 1) if shape.num_heads % n == 0), None)
        why = f"; not {above}: {sequence_parallel_problem(above, shape, train_ranks)}" if above else ""
        out.append(f"{' and '.join(keys)} can be {', '.join(map(str, sizes))} ({shape.name}: {shape.num_heads} "
                   f"attention heads, {shape.num_kv_heads} KV heads; {train_ranks} training ranks){why}")
    return "; ".join(out)
