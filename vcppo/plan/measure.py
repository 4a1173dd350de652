"""`vcppo plan --measure`: the step's training phases timed with the real engines on this machine.

The FLOP model of :mod:`vcppo.plan.timing` says how fast a pass runs on a datasheet GPU; this
module asks the machine instead. It builds the config's :class:`~vcppo.engines.actor.ActorEngine`
and :class:`~vcppo.engines.critic.CriticEngine` on one rank (as the driver builds them: the
config's engine sections, dtype and temperature; no vLLM), makes a batch of random token ids at the
plan's lengths (prompts of the mean prompt length, responses spread evenly around the mean response
length, up to ``rollout.max_response_tokens``: :func:`step_lengths`), and times the passes the
driver's step plan runs (vcppo.driver.step.step_plan.ppo_plan), each through the driver's own code:

    old_logprobs   actor.forward_logprobs with entropies     (pi_old from a pass)
    ref_logprobs   the policy's forward again                (a KL term; the actor stands in for
                                                              the reference: the same model)
    values         critic.forward_values                     (V_old from a pass)
    critic_update  vcppo.driver.step.update.run_update, ValueLoss (PPO epochs x mini-batches)
    actor_update   run_update with PolicyLoss                (the same, with the step plan's loss)

each after one untimed warm-up call, the fastest of ``repeats`` calls (vcppo.bench.train.timed):
as ``timeit`` does, since on a machine shared with other work the slower calls measure that work.
A call's time is its wall-clock seconds, or with one torch thread its CPU seconds when fewer: on the
2-core development machines, loaded 4-9x over by other jobs, one phase's calls took 0.24-1.0 s of
wall time for ~0.27 s of CPU time, while a real `vcppo train` beside them ran that phase in
0.25-0.29 s. With several threads the wall time stands (they need not all be busy), and a CPU share
well under the threads' is printed as a warning: the machine was busy, and the rates may be low. The
timed batch is the step's whole share of one training rank when it holds at most ``max_micro_batches``
micro-batches, else that many micro-batches' worth of its sequences (every k-th by length, so the
spread is kept); a phase's planned seconds are its measured seconds x the rank's real tokens over
the timed ones (the optimizer steps of a scaled-up update are then counted that many times over:
an upper bound). Phase names are the driver's ``time/<phase>_s`` keys, so a run's metrics compare
phase by phase (tests/plan/test_measure.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from vcppo.plan.advise import Lengths
from vcppo.config.schema import Config
from vcppo.errors import ConfigError


@dataclass(frozen=True)
class MeasuredPhase:
    """One phase of the step on this machine: what was timed and what the step's share needs."""
    phase: str               # the driver's time/<phase>_s key
    role: str
    kind: str                # "forward" | "update"
    timed_tokens: float      # real tokens of the timed batch
    seconds: float           # the fastest timed call's seconds over the timed batch (see the module docstring)
    planned_s: float         # seconds for one rank's share of the step
    cpu_seconds: float = 0.0  # CPU seconds of this process (all its threads) in that call
    wall_seconds: float = 0.0  # wall seconds of that call

    @property
    def tokens_per_s(self) -> float:
        return self.timed_tokens / self.seconds


@dataclass(frozen=True)
class Measurement:
    device: str
    threads: int
    sequences: int           # one rank's sequences a step
    timed_sequences: int
    rank_tokens: float       # one rank's real tokens a step
    phases: list[MeasuredPhase]

    @property
    def training_s(self) -> float:
        return sum(p.planned_s for p in self.phases)


def step_lengths(n: int, lengths: Lengths, max_prompt: int, max_response: int) -> tuple[list[int], list[int]]:
    """``n`` (prompt, response) lengths: prompts of the mean prompt length (at most ``max_prompt``),
    responses evenly spread over [2 m - R, R] (or [0, 2 m] when m <= R / 2), mean m = the mean
    response length, R = ``max_response``; at least one token each."""
    m, R = min(lengths.response, max_response), max_response
    lo, hi = (2 * m - R, R) if m > R / 2 else (0, 2 * m)
    prompt = max(1, min(max_prompt, round(lengths.prompt)))
    responses = [max(1, min(R, round(lo + (hi - lo) * (i + 0.5) / n))) for i in range(n)]
    return [prompt] * n, responses


def timed_rows(n: int, keep: int) -> list[int]:
    """``keep`` of ``n`` rows, evenly spaced (every k-th), all when ``keep >= n``."""
    if keep >= n:
        return list(range(n))
    return sorted({min(n - 1, int((i + 0.5) * n / keep)) for i in range(keep)})


def sequences_for(engine_cfg, micro_batches: int, lengths: Lengths) -> int:
    """Sequences that fill ``micro_batches`` micro-batches of an engine."""
    if engine_cfg.max_tokens_per_micro_batch > 0:
        return max(1, math.ceil(micro_batches * engine_cfg.max_tokens_per_micro_batch
                                / max(1.0, lengths.prompt + lengths.response)))
    return micro_batches * max(1, engine_cfg.micro_batch_size)


def _vocab(model_dir: str) -> int:
    import json
    from pathlib import Path
    return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])


@dataclass
class _Workload:
    """One rank's share of the step and the part of it that is timed."""
    sequences: int
    timed_sequences: int
    rank_tokens: float
    batch: object            # the timed ActorBatch, on the device
    timed_tokens: float

    @property
    def scale(self) -> float:
        return self.rank_tokens / self.timed_tokens


def _workload(cfg: Config, lengths: Lengths, train_ranks: int, max_micro_batches: int, device) -> _Workload:
    from vcppo.bench.train import batch_of_lengths

    responses = cfg.trainer.prompts_per_step * cfg.rollout.n_samples_per_prompt
    sequences = math.ceil(responses / max(1, train_ranks))
    prompts, answers = step_lengths(sequences, lengths, cfg.data.max_prompt_tokens, cfg.rollout.max_response_tokens)
    keep = max(sequences_for(cfg.actor, max_micro_batches, lengths),
               sequences_for(cfg.critic, max_micro_batches, lengths))
    rows = timed_rows(sequences, keep)
    # one rank's whole share, and the timed part of it (the same batch when it is small enough)
    batch = batch_of_lengths([prompts[i] for i in rows], [answers[i] for i in rows], cfg.trainer.seed,
                             vocab=min(90, _vocab(cfg.model.policy_path)))
    batch = batch.to(device) if hasattr(batch, "to") else batch
    return _Workload(sequences, len(rows), float(sum(prompts) + sum(answers)), batch,
                     float(batch.attention_mask.sum()))


class _PhaseTimer:
    """Times one phase's calls (see the module docstring for which seconds count) into ``phases``."""

    def __init__(self, work: _Workload, repeats: int, threads: int):
        self.work, self.repeats, self.threads = work, repeats, threads
        self.phases: list[MeasuredPhase] = []

    def __call__(self, phase: str, role: str, kind: str, fn) -> None:
        import time

        from vcppo.bench.train import timed
        cpu = []

        def call():
            start = time.process_time()
            fn()
            cpu.append(time.process_time() - start)
        walls, cpus = timed(call, self.repeats), cpu[1:]
        # one thread: the CPU seconds are the call's time on a core of its own; several threads
        # may not all be busy, so their wall time stands (see the module docstring)
        busy = [min(w, c) if self.threads == 1 else w for w, c in zip(walls, cpus)]
        best = min(range(len(busy)), key=busy.__getitem__)
        self.phases.append(MeasuredPhase(phase, role, kind, self.work.timed_tokens, busy[best],
                                         busy[best] * self.work.scale, cpus[best], walls[best]))


def _time_phases(cfg: Config, plan, info, batch, run: _PhaseTimer, steps: int) -> None:
    """The passes the step plan runs, each through the driver's own code."""
    import torch

    from vcppo.driver.run_engines import critic_source
    from vcppo.driver.step.step_plan import Source
    from vcppo.driver.step.update import PolicyLoss, ValueLoss, norm_constant, run_update
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.critic import CriticEngine
    from vcppo.experience import CriticBatch

    alg = cfg.algorithm
    actor = ActorEngine(cfg.model.policy_path, cfg.actor, info, total_optimizer_steps=steps, dtype=cfg.model.dtype,
                        temperature=cfg.rollout.temperature)
    with torch.no_grad():
        batch.old_logprobs, _ = actor.forward_logprobs(batch)
    batch.ref_logprobs = batch.old_logprobs if plan.kl_in_loss else None
    if plan.pi_old is Source.PASS:
        run("old_logprobs", "actor", "forward", lambda: actor.forward_logprobs(batch, with_entropy=True))
    if plan.reference_pass:
        run("ref_logprobs", "reference", "forward", lambda: actor.forward_logprobs(batch))
    if plan.v_old is not Source.NONE:
        init, path = critic_source(cfg)
        critic = CriticEngine(init, path, cfg.critic, info, total_optimizer_steps=steps, dtype=cfg.model.dtype)
        values = critic.forward_values(batch)
        if plan.v_old is Source.PASS and not plan.critic_remote:
            run("values", "critic", "forward", lambda: critic.forward_values(batch))
        fields = {k: v for k, v in vars(batch).items() if k not in ("advantages", "old_logprobs", "ref_logprobs")}
        cbatch = CriticBatch(**fields, returns=torch.randn_like(values) * batch.policy_mask, old_values=values)
        loss = ValueLoss(cfg.critic, alg.loss_agg, old_from_update=plan.v_old is Source.UPDATE,
                         norm=norm_constant(cfg))
        run("critic_update", "critic", "update",
            lambda: run_update(critic, loss, cfg.critic, cbatch, cfg.trainer.seed, 1, "critic"))
    policy_loss = PolicyLoss(alg, old_from_update=plan.pi_old is Source.UPDATE,
                             keep_outputs=plan.entropy is Source.UPDATE, kl_coef=alg.kl_coef,
                             norm=norm_constant(cfg))
    run("actor_update", "actor", "update",
        lambda: run_update(actor, policy_loss, cfg.actor, batch, cfg.trainer.seed, 1, "actor"))


def measure(cfg: Config, lengths: Lengths, train_ranks: int = 1, repeats: int = 3, max_micro_batches: int = 4,
            device: str = "auto") -> Measurement:
    """Time the step's training phases of ``cfg`` on this machine (see the module docstring).
    ``train_ranks``: the step's sequences are shared out over that many ranks; one is timed."""
    import os
    from pathlib import Path

    import torch

    from vcppo.driver.step.step_plan import ppo_plan
    from vcppo.runtime import dist as D

    policy = cfg.model.policy_path
    if not policy or not (Path(policy) / "config.json").is_file():
        raise ConfigError(f"config key 'model.policy_path': --measure builds the real engines and needs a model "
                          f"directory (config.json and weights), got {policy!r}; `vcppo model make` writes one")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    info = D.init_distributed(device)
    try:
        plan = ppo_plan(cfg, info.device)
        work = _workload(cfg, lengths, train_ranks, max_micro_batches, info.device)
        timer = _PhaseTimer(work, repeats, torch.get_num_threads())
        steps = 4 * (repeats + 1) * cfg.actor.ppo_epochs * cfg.actor.ppo_mini_batches + 8
        _time_phases(cfg, plan, info, work.batch, timer, steps)
        return Measurement(str(info.device), torch.get_num_threads(), work.sequences, work.timed_sequences,
                           work.rank_tokens, timer.phases)
    finally:
        D.shutdown()


def measured_mfu(phase: MeasuredPhase, n_params: int, peak: float, checkpointing: bool) -> float:
    """The phase's model-FLOPs utilisation against ``peak`` (2 N per token forward, 6 N / 8 N update)."""
    per_token = 2 if phase.kind == "forward" else (8 if checkpointing else 6)
    return per_token * n_params * phase.tokens_per_s / peak
