"""`vcppo plan CONFIG [key=value ...] [--gpu h100] [--gpus-per-node 8] [--nodes 1]`: before a run is
queued, whether it fits its GPUs, and roughly how long a step takes.

Reads the config exactly as `vcppo train` does (no path needs to exist) and the model's shape from
``model.policy_path/config.json``, or a built-in Qwen2.5 shape (``--model-shape``). Prints a
markdown table of memory per GPU for every role, a verdict per phase and, when the run does not
fit, the first setting that does (vcppo.plan.knobs), then an estimated step time. ``--json PATH``
writes the same numbers. All figures are estimates from shapes and datasheets (vcppo/plan/).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from vcppo.config import load_config, split_command_line
from vcppo.plan.advise import Cluster, Plan, Shapes, gib, plan_run
from vcppo.plan.knobs import Setting, find_fit
from vcppo.plan.shape import BUILTIN_SHAPES, HARDWARE, builtin_shape, read_shape
from vcppo.schema import Config, ConfigError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vcppo plan", description=__doc__.split("\n\n")[0])
    p.add_argument("args", nargs="*", metavar="CONFIG [key=value ...]",
                   help="a preset or YAML file, then overrides, as for `vcppo train`")
    p.add_argument("--gpu", choices=sorted(HARDWARE), default="h100", help="accelerator (default h100)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--model-shape", choices=list(BUILTIN_SHAPES),
                   help="a built-in shape instead of model.policy_path/config.json")
    p.add_argument("--mfu", type=float, default=0.35, help="training model-FLOPs utilisation (default 0.35)")
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


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_intermixed_args(argv)
    config, overrides = split_command_line(args.args, None)
    if config is None:
        raise ConfigError("a CONFIG (preset name or YAML file) is required: vcppo plan CONFIG [key=value ...]")
    if args.gpus_per_node < 1 or args.nodes < 1 or not 0 < args.mfu <= 1:
        raise ConfigError("--gpus-per-node and --nodes must be >= 1, --mfu in (0, 1]")
    cfg = load_config(config, overrides)
    shapes = resolve_shapes(cfg, args.model_shape)
    cluster = Cluster(HARDWARE[args.gpu], args.gpus_per_node, args.nodes)
    plan = plan_run(cfg, shapes, cluster, args.mfu)
    knobs, fitted = find_fit(Setting(cfg, cluster), shapes, args.mfu)
    print(render(cfg, shapes, plan, knobs, fitted, args.mfu))
    if args.json:
        Path(args.json).write_text(json.dumps(as_json(cfg, shapes, plan, knobs, fitted, args.mfu), indent=2) + "\n")
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
    lines = ["| role | ranks | ZeRO | weights | grads | optimizer | gather | activations (ckpt off / on) "
             "| micro-batch tokens | CPU per rank |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in plan.engines:
        s = e.states
        lines.append(f"| {e.role} | {e.ranks} | {e.zero_stage} | {_g(s.params_bytes)} | {_g(s.grads_bytes)} "
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


def render(cfg: Config, shapes: Shapes, plan: Plan, knobs: list[str] | None, fitted: Plan, mfu: float) -> str:
    cl, policy = plan.cluster, shapes.policy
    dtype = {2: "bf16", 4: "fp32"}[plan.dtype_bytes]
    out = [f"## vcppo plan: {cfg.preset} on {cl.nodes} x {cl.gpus_per_node} {cl.hardware.name} "
           f"({cfg.placement.mode}); {policy.name}, {_params(policy.params)} params, {dtype}", "",
           "Estimates from shapes and datasheet figures, not measurements (formulas: vcppo/plan/). GiB.", ""]
    out += memory_table(plan) + [""] + check_table(plan)
    out += ["", f"CPU memory per node: {_g(plan.cpu_bytes_per_node)} GiB (offloaded states; vLLM's weights "
                "while it sleeps)."]
    if knobs == []:
        out += ["", "**Verdict: fits as configured.**"]
    elif knobs is None:
        out += ["", "**Verdict: does not fit, and no knob of vcppo/plan/knobs.py makes it fit.**"]
    else:
        out += ["", f"**Verdict: does not fit; the first setting that fits adds** `{' '.join(knobs)}`"]
    out += ["", "| step time (s) | rollout | training | step |", "|---|---:|---:|---:|", time_rows("as configured", plan)]
    if knobs:
        out.append(time_rows("with the knobs above", fitted))
    t = plan.time
    out += ["", f"{t.responses:,} responses a step; response lengths spread evenly up to "
                f"{cfg.rollout.max_response_tokens:,} tokens (the step lasts as long as the longest); decode "
                f"at peak memory bandwidth over {t.rollout_gpus} GPUs; training {t.train_tokens:,.0f} tokens at "
                f"{mfu:.0%} MFU over {t.training_gpus} GPUs."]
    out += [f"Note: {n}" for n in plan.notes]
    return "\n".join(out)


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


def as_json(cfg: Config, shapes: Shapes, plan: Plan, knobs: list[str] | None, fitted: Plan, mfu: float) -> dict:
    return {"preset": cfg.preset, "shapes": dataclasses.asdict(shapes), "mfu": mfu,
            "params": {"policy": shapes.policy.params, "critic": shapes.critic.value_model_params},
            "plan": plan_json(plan), "knobs": knobs, "fitted": plan_json(fitted) if knobs else None}
