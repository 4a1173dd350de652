"""`vcppo plan CONFIG [key=value ...] [--gpu h100] [--gpus-per-node 8] [--nodes 1] [--measure]`: before a
run is queued, whether it fits its GPUs, and roughly how long a step takes.

Reads the config exactly as `vcppo train` does (no path needs to exist) and the model's shape from
``model.policy_path/config.json``, or a built-in Qwen2.5 shape (``--model-shape``). Prints a
markdown table of memory per GPU for every role, a verdict per phase and, when the run does not
fit, the first setting that does (vcppo.plan.knobs), then an estimated step time, and the knobs
that would cut it by more than 1.5x where the setting that fits leaves that much. ``--json PATH``
writes the same numbers. Memory is arithmetic from shapes; training time comes from a pass model
fitted to measurements on one H100 (vcppo.plan.timing), rollout time from datasheet bandwidth.
``--measure`` also times the config's actor and critic passes with the real engines on this machine
(CPU or GPU, no vLLM; vcppo.plan.measure) and plans the step's training phases from those rates.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from vcppo.config.placement import Placement
from vcppo.config.load import load_config, split_command_line
from vcppo.models.hub import resolve_model_keys
from vcppo.plan.advise import Cluster, Lengths, Plan, Shapes, gib, plan_run, ranks
from vcppo.plan import timing as T
from vcppo.plan.knobs import REPORT_SPEEDUP, Setting, apply, find_faster, find_fit, sequence_parallel_limits
from vcppo.models.shapes import BUILTIN_SHAPES, builtin_shape, read_shape
from vcppo.plan.hardware import HARDWARE
from vcppo.config.schema import Config
from vcppo.errors import ConfigError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vcppo plan", description=__doc__.split("\n\n")[0])
    p.add_argument("args", nargs="*", metavar="CONFIG [key=value ...]",
                   help="a preset or YAML file, then overrides, as for `vcppo train`")
    p.add_argument("--gpu", choices=sorted(HARDWARE), default="h100", help="accelerator (default h100)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--model-shape", choices=list(BUILTIN_SHAPES),
                   help="a built-in shape instead of model.policy_path/config.json")
    p.add_argument("--mfu", type=float, default=None,
                   help="a constant model-FLOPs utilisation for training and rollout compute instead of the pass "
                        "model fitted to H100 measurements (vcppo/plan/timing.py)")
    p.add_argument("--prompt-tokens", type=float, default=None,
                   help="mean prompt tokens of a step's sequences (default: data.max_prompt_tokens)")
    p.add_argument("--response-tokens", type=float, default=None,
                   help="mean response tokens (default: half of rollout.max_response_tokens)")
    p.add_argument("--measure", action="store_true",
                   help="also time the actor's and critic's passes with the real engines on this machine and plan "
                        "the step's training phases from them (needs model.policy_path)")
    p.add_argument("--measure-repeats", type=int, default=3,
                   help="timed calls per phase after a warm-up; the fastest counts (default 3)")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    return p


def resolve_shapes(cfg: Config, model_shape: str | None) -> Shapes:
    """The policy's shape (built in, or its config.json); critic and reward model from their own
    directories when those hold a config.json, else the policy's."""
    if model_shape:
        policy = builtin_shape(model_shape)
    else:
        policy = read_shape(cfg.model.policy_path, "model.policy_path")
        if policy is None:
            raise ConfigError(f"config key 'model.policy_path': no config.json in {cfg.model.policy_path!r} to read "
                              f"the model's shape from; point it at a model directory or pass --model-shape "
                              f"({', '.join(BUILTIN_SHAPES)})")
    critic = policy
    if cfg.model.critic_init != "policy" and cfg.model.critic_path:
        critic = read_shape(cfg.model.critic_path, "model.critic_path") or policy
    reward_model = read_shape(cfg.reward.model_path, "reward.model_path") if cfg.reward.model_path else None
    return Shapes(policy, critic, reward_model or policy)


@dataclasses.dataclass(frozen=True)
class Faster:
    """The knobs that cut the planned step of the setting that fits (``before``), and the plan with them."""
    knobs: list[str]
    plan: Plan
    before: Plan

    @property
    def speedup(self) -> float:
        after = self.plan.time.step_s
        return self.before.time.step_s / after if after > 0 and math.isfinite(after) else 1.0

    @property
    def reported(self) -> bool:
        return bool(self.knobs) and self.speedup > REPORT_SPEEDUP


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_intermixed_args(argv)
    config, overrides = split_command_line(args.args, None)
    if config is None:
        raise ConfigError("a CONFIG (preset name or YAML file) is required: vcppo plan CONFIG [key=value ...]")
    if args.gpus_per_node < 1 or args.nodes < 1 or not (args.mfu is None or 0 < args.mfu <= 1):
        raise ConfigError("--gpus-per-node and --nodes must be >= 1, --mfu in (0, 1]")
    if any(x is not None and x < 0 for x in (args.prompt_tokens, args.response_tokens)) or args.measure_repeats < 1:
        raise ConfigError("--prompt-tokens and --response-tokens must be >= 0, --measure-repeats >= 1")
    cfg = load_config(config, overrides)
    if not args.model_shape:  # a hub id: its config.json (the weights too for --measure's real engines)
        resolve_model_keys(cfg, "plan", allow_patterns=None if args.measure else ["*.json"])
    shapes = resolve_shapes(cfg, args.model_shape)
    cluster = Cluster(HARDWARE[args.gpu], args.gpus_per_node, args.nodes)
    lengths = Lengths.of(cfg, args.prompt_tokens, args.response_tokens)
    plan = plan_run(cfg, shapes, cluster, args.mfu, lengths)
    knobs, fitted = find_fit(Setting(cfg, cluster), shapes, args.mfu, lengths)
    faster = None
    if knobs is not None:
        faster = Faster(*find_faster(apply(Setting(cfg, cluster), knobs), shapes, args.mfu, lengths), fitted)
    limits = sequence_parallel_limits(Setting(cfg, cluster), shapes)
    measured = None
    if args.measure:
        from vcppo.plan.measure import measure
        measured = measure(cfg, lengths, train_ranks=ranks(cfg, cluster)[0], repeats=args.measure_repeats)
    print(render(cfg, shapes, plan, knobs, fitted, args.mfu, measured, faster, limits))
    if args.json:
        out = as_json(cfg, shapes, plan, knobs, fitted, args.mfu, measured, faster, limits)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------
# Output

def _g(n: float) -> str:
    """GiB: one decimal, or two significant digits below 1 GiB (the CPU-scale models)."""
    x = gib(n)
    return f"{x:,.1f}" if abs(x) >= 1 or x == 0 else f"{x:.2g}"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def memory_table(plan: Plan) -> list[str]:
    lines = ["| role | ranks | ZeRO | SP | weights | grads | optimizer | gather | activations per rank (ckpt off / on) "
             "| micro-batch tokens | CPU per rank |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in plan.engines:
        s = e.states
        lines.append(f"| {e.role} | {e.ranks} | {e.zero_stage} | {e.sequence_parallel} | {_g(s.params_bytes)} "
                     f"| {_g(s.grads_bytes)} "
                     f"| {_g(s.optimizer_bytes)} | {_g(s.gather_bytes)} | {_g(e.activations_no_ckpt_bytes)} / "
                     f"{_g(e.activations_ckpt_bytes)} | {e.micro_batch_tokens:,} | {_g(s.cpu_bytes)} |")
    v = plan.rollout
    lines += ["", "| vLLM | ranks | budget | weights | workspace | KV cache | KV tokens | max-length sequences |",
              "|---|---:|---:|---:|---:|---:|---:|---:|",
              f"| rollout | {plan.time.rollout_gpus} | {_g(v.budget_bytes)} | {_g(v.weights_bytes)} "
              f"| {_g(v.workspace_bytes)} | {_g(v.kv_cache_bytes)} | {v.kv_tokens:,} "
              f"| {v.max_length_sequences:,} of {v.max_sequence_tokens:,} tokens |"]
    return lines


def check_table(plan: Plan) -> list[str]:
    lines = ["| phase | needs per GPU | usable per GPU | verdict |", "|---|---:|---:|---|"]
    for c in plan.checks:
        verdict = "fits" if c.fits else "**does not fit**"
        if c.kv_sequences is not None and c.kv_sequences < 1:
            verdict += " (the KV cache holds no sequence of the maximum length)"
        lines.append(f"| {c.phase} | {_g(c.need_bytes)} | {_g(c.usable_bytes)} | {verdict} |")
    return lines


def _s(seconds: float) -> str:
    return f"{seconds:,.0f}" if math.isfinite(seconds) else "- (no room for a sequence)"


def time_rows(label: str, plan: Plan) -> str:
    t = plan.time
    return f"| {label} | {_s(t.rollout_s)} | {_s(t.training_s)} | {_s(t.step_s)} |"


def _mfu_source(plan: Plan, mfu: float | None) -> str:
    if mfu is not None:
        return f"at {mfu:.0%} MFU (--mfu)"
    if plan.cluster.hardware.is_cpu:
        return f"at {T.CPU_MFU:.0%} MFU (a guess: nothing measured on a CPU device; --measure times this machine)"
    return (f"at {plan.time.training_mfu:.0%} MFU (the pass model fitted to one H100's measurements, "
            f"vcppo/plan/timing.py)")


def render(cfg: Config, shapes: Shapes, plan: Plan, knobs: list[str] | None, fitted: Plan, mfu: float | None,
           measured=None, faster: "Faster | None" = None, limits: str = "") -> str:
    cl, policy = plan.cluster, shapes.policy
    dtype = {2: "bf16", 4: "fp32"}[plan.dtype_bytes]
    chunks = {e.role: e.logprob_chunk_size for e in plan.engines if e.role in ("actor", "reference")}
    head = ", ".join(f"{r} {'chunked by ' + format(c, ',') if c else 'full logits'}" for r, c in chunks.items())
    out = [f"## vcppo plan: {cfg.preset} on {cl.nodes} x {cl.gpus_per_node} {cl.hardware.name} "
           f"({Placement.of(cfg).name}); {policy.name}, {_params(policy.params)} params, {dtype}", "",
           f"Estimates: memory from shapes (LM head: {head}), time from a fitted pass model and datasheet "
           "bandwidth (formulas: vcppo/plan/). GiB.", ""]
    out += memory_table(plan) + [""] + check_table(plan)
    out += ["", f"CPU memory per node: {_g(plan.cpu_bytes_per_node)} GiB (offloaded states; vLLM's weights "
                "while it sleeps)."]
    if knobs == []:
        out += ["", "**Verdict: fits as configured.**"]
    elif knobs is None:
        out += ["", "**Verdict: does not fit, and no knob of vcppo/plan/knobs.py makes it fit.**"]
    else:
        out += ["", f"**Verdict: does not fit; the first setting that fits adds** `{' '.join(knobs)}`"]
    if knobs is None or any("sequence_parallel_size" in k for k in knobs):
        out += ["", f"Sequence parallelism: {limits}."]
    if faster is not None and faster.reported:
        out += ["", f"**Faster: adding** `{' '.join(faster.knobs)}` **cuts the planned step from "
                    f"{_s(faster.before.time.step_s)} s to {_s(faster.plan.time.step_s)} s ({faster.speedup:.2f}x)**, "
                    "and the run still fits (vcppo/plan/knobs.py: find_faster)."]
    out += ["", "| step time (s) | rollout | training | step |", "|---|---:|---:|---:|", time_rows("as configured", plan)]
    if knobs:
        out.append(time_rows("with the knobs above", fitted))
    if faster is not None and faster.reported:
        out.append(time_rows("with the faster knobs too" if knobs else "with the faster knobs", faster.plan))
    t = plan.time
    out += ["", f"{t.responses:,} responses a step; response lengths spread evenly up to "
                f"{cfg.rollout.max_response_tokens:,} tokens (the step lasts as long as the longest); decode "
                f"at peak memory bandwidth over {t.rollout_gpus} GPUs; training {t.train_tokens:,.0f} tokens "
                f"(mean prompt {t.mean_prompt_tokens:,.0f}, response {t.mean_response_tokens:,.0f}) "
                f"{_mfu_source(plan, mfu)} over {t.training_gpus} GPUs."]
    if t.exchange_s > 0:
        sps = ", ".join(f"{e.role} {e.sequence_parallel}" for e in plan.engines if e.sequence_parallel > 1)
        out.append(f"Of the training time, {_s(t.exchange_s)} s is sequence parallelism's all-to-all (SP {sps}; "
                   "at the datasheet link bandwidth, vcppo/plan/timing.py).")
    out += [f"Note: {n}" for n in plan.notes]
    if measured is not None:
        out += ["", measured_table(measured)]
    return "\n".join(out)


def measured_table(m) -> str:
    """The --measure section: each phase's timed rate and the step's planned seconds on this machine."""
    lines = [f"### Training phases measured on this machine ({m.device}, {m.threads} threads, one rank)", "",
             f"One rank's share of a step: {m.sequences:,} sequences, {m.rank_tokens:,.0f} tokens; timed: "
             f"{m.timed_sequences:,} of them (the fastest of the timed calls after a warm-up).", "",
             "| phase (time/<phase>_s) | role | pass | timed tokens | tokens/s | CPU s / wall s | planned s a step |",
             "|---|---|---|---:|---:|---:|---:|"]
    for p in m.phases:
        lines.append(f"| {p.phase} | {p.role} | {p.kind} | {p.timed_tokens:,.0f} | {p.tokens_per_s:,.0f} "
                     f"| {p.cpu_seconds / p.wall_seconds:.2f} | {p.planned_s:.3f} |")
    lines += [f"| **training phases** | | | | | | **{m.training_s:.3f}** |"]
    share = min(p.cpu_seconds / p.wall_seconds / m.threads for p in m.phases)
    if share < 0.8:
        lines += ["", f"Note: this process had as little as {share:.0%} of its {m.threads} thread(s)' time in a phase: "
                      "the machine is busy with other work. "
                      + ("With one thread the planned seconds are its CPU seconds (its time on a core of its own)."
                         if m.threads == 1 else "With several threads these wall-clock rates may be low.")]
    return "\n".join(lines)


def plan_json(plan: Plan) -> dict:
    """The plan's fields, with every byte figure also in GiB and the derived verdicts."""
    d = dataclasses.asdict(plan)
    d["time"] = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in d["time"].items()}
    d["fits"] = plan.fits
    d["checks"] = [{**dataclasses.asdict(c), "fits": c.fits, "need_gib": gib(c.need_bytes),
                    "usable_gib": gib(c.usable_bytes)} for c in plan.checks]
    d["rollout"].update(kv_tokens=plan.rollout.kv_tokens, max_length_sequences=plan.rollout.max_length_sequences)
    for e, out in zip(plan.engines, d["engines"]):
        out["resident_gib"] = gib(e.states.resident_bytes)
        out["working_gib"] = gib(e.working_bytes)
    return d


def as_json(cfg: Config, shapes: Shapes, plan: Plan, knobs: list[str] | None, fitted: Plan, mfu: float | None,
            measured=None, faster: Faster | None = None, limits: str = "") -> dict:
    out = {"preset": cfg.preset, "shapes": dataclasses.asdict(shapes), "mfu": mfu,
           "params": {"policy": shapes.policy.params, "critic": shapes.critic.value_model_params},
           "plan": plan_json(plan), "knobs": knobs, "fitted": plan_json(fitted) if knobs else None,
           "sequence_parallel_limits": limits, "faster": None}
    if faster is not None and faster.knobs:
        out["faster"] = {"knobs": faster.knobs, "step_s_before": faster.before.time.step_s,
                         "step_s_after": faster.plan.time.step_s, "speedup": faster.speedup,
                         "reported": faster.reported, "plan": plan_json(faster.plan)}
    if measured is not None:
        out["measure"] = {**dataclasses.asdict(measured), "training_s": measured.training_s,
                          "phases_s": {p.phase: p.planned_s for p in measured.phases}}
    return out
