"""The planner's models, without an engine: the pass model fitted to the H100 probe, the step's passes
against the driver's own step plan, the chunked LM head's memory, and the knob that turns it on."""
import pytest
import torch

from vcppo.config.load import load_config
from vcppo.driver.step.step_plan import Source, ppo_plan
from vcppo.plan import memory as M
from vcppo.plan import timing as T
from vcppo.plan.advise import Cluster, Shapes, plan_run
from vcppo.plan.knobs import Setting, find_fit
from vcppo.models.shapes import BUILTIN_SHAPES
from vcppo.plan.hardware import HARDWARE, GiB

LONG_COT = ["rollout.max_response_tokens=8192", "data.max_prompt_tokens=1024"]


@pytest.mark.parametrize("point", T.H100_MEASURED, ids=lambda p: f"{p.workload}-{p.role}-{p.kind}")
def test_the_pass_model_reproduces_every_measured_phase(point):
    """Two constants per kind (a fixed cost per micro-batch, a FLOP efficiency) for fifteen phases of
    1-41k tokens per micro-batch: each measured MFU within 20%."""
    model = T.PASS_MODELS[point.kind]
    predicted = model.mfu(point.flops, T.REFERENCE_LAYERS, T.H100_BF16_PEAK)
    print(f"{point.workload} {point.role} {point.kind}: measured MFU {point.mfu:.3f}, model {predicted:.3f}")
    assert predicted == pytest.approx(point.mfu, rel=0.20)


def test_the_fitted_constants_are_the_documented_ones():
    fwd, upd = T.PASS_MODELS["forward"], T.PASS_MODELS["update"]
    assert fwd.overhead_s == pytest.approx(0.054, abs=0.002) and fwd.efficiency == pytest.approx(0.36, abs=0.01)
    assert upd.overhead_s == pytest.approx(0.158, abs=0.002) and upd.efficiency == pytest.approx(0.30, abs=0.01)


def test_larger_models_and_micro_batches_reach_higher_mfu_but_never_the_asymptote():
    """The extrapolation's shape: MFU grows with tokens per micro-batch and with model size (the fixed
    cost grows with layers only), and stays below the fitted efficiency."""
    peak = T.H100_BF16_PEAK
    for kind, mult in (("forward", 2), ("update", 8)):
        model = T.PASS_MODELS[kind]
        mfus = [model.mfu(mult * s.params * t, s.num_layers, peak)
                for s in (BUILTIN_SHAPES["qwen2.5-0.5b"], BUILTIN_SHAPES["qwen2.5-7b"], BUILTIN_SHAPES["qwen2.5-32b"])
                for t in (4096, 16384)]
        assert mfus[0] < mfus[1] and mfus[2] < mfus[3] and mfus[4] < mfus[5]
        assert mfus[0] < mfus[2] < mfus[4] and max(mfus) < model.efficiency


CONFIGS = [("vcppo", []), ("ppo", []), ("grpo", []), ("vapo", []), ("vcppo_no_dgae", []),
           ("vcppo", ["actor.ppo_epochs=2"]), ("vcppo", ["critic.ppo_mini_batches=2"]),
           ("vcppo", ["algorithm.kl_coef=0.1"]), ("vcppo", ["algorithm.kl_coef=0.1", "algorithm.kl_in=loss"]),
           ("ppo", ["algorithm.old_logprobs_from_sampler=true", "actor.ppo_epochs=2"]),
           ("vcppo", ["placement.mode=split", "placement.rollout_ranks=1", "placement.critic_ranks=1"]),
           ("vcppo_paper_32b_8k", []), ("vcppo_7b_1node", [])]


@pytest.mark.parametrize("preset,overrides", CONFIGS, ids=[f"{p}:{' '.join(o)}" for p, o in CONFIGS])
def test_the_planned_passes_are_the_driver_step_plans(preset, overrides):
    """timing.step_passes reads vcppo.driver.step.step_plan.ppo_plan: the passes of the plan a run on a device builds."""
    cfg = load_config(preset, overrides)
    plan = ppo_plan(cfg, torch.device("cpu"))
    passes = T.step_passes(cfg)
    assert passes["actor"] == (int(plan.pi_old is Source.PASS), cfg.actor.ppo_epochs)
    if plan.v_old is Source.NONE:
        assert "critic" not in passes
    else:
        assert passes["critic"] == (int(plan.v_old is Source.PASS), cfg.critic.ppo_epochs)
    assert ("reference" in passes) == plan.reference_pass


def test_chunked_head_memory_follows_its_derivation():
    """7B, 8,192 response tokens, bf16: the full path holds 8192 x 152064 x 10 bytes (11.6 GiB);
    the chunked path one 1,024-row chunk: forward 1024 V (2 + 4 + 4), backward 1024 V (2 + 4 + 4 + 4)
    plus the fp32 weight gradient 4 V H, and 8 bytes a token."""
    s = BUILTIN_SHAPES["qwen2.5-7b"]
    V, H, n = s.vocab_size, s.hidden_size, 8192
    full = M.activations(s, n + 1024, n, 2, checkpointing=True).logits_bytes
    assert full == n * V * 10 and full / GiB == pytest.approx(11.6, abs=0.05)
    train = M.activations(s, n + 1024, n, 2, checkpointing=True, logprob_chunk_size=1024).logits_bytes
    assert train == 8 * n + 1024 * V * 14 + 4 * V * H
    forward = M.activations(s, n + 1024, n, 2, checkpointing=False, backward=False, logprob_chunk_size=1024)
    assert forward.logits_bytes == 8 * n + 1024 * V * 10
    frozen = M.activations(s, n + 1024, n, 2, checkpointing=True, logprob_chunk_size=1024, head_trained=False)
    assert frozen.logits_bytes == 8 * n + 1024 * V * 14
    short = M.activations(s, 600, 100, 2, checkpointing=True, logprob_chunk_size=1024, head_trained=False)
    assert short.logits_bytes == 8 * 100 + 100 * V * 14  # a chunk is at most the response tokens
    fp32 = M.chunked_head_bytes(s, 4, n, 1024, backward=False)  # no upcast: the logits are fp32 already
    assert fp32 == 8 * n + 1024 * V * 8
    # the layers do not change with the head
    assert forward.layers_bytes == M.activations(s, n + 1024, n, 2, checkpointing=False, backward=False).layers_bytes


def test_the_engines_read_their_chunk_size():
    """The actor (and a reference) count the configured chunk; the critic has no LM head."""
    cfg = load_config("vcppo", LONG_COT + ["algorithm.kl_coef=0.01", "actor.logprob_chunk_size=512",
                                           "reference.logprob_chunk_size=0"])
    shapes = Shapes(*[BUILTIN_SHAPES["qwen2.5-7b"]] * 3)
    plan = plan_run(cfg, shapes, Cluster(HARDWARE["h100"]))
    chunks = {e.role: e.logprob_chunk_size for e in plan.engines}
    assert chunks == {"actor": 512, "critic": 0, "reference": 0}


def test_the_knob_turns_the_chunked_path_on_when_logits_dominate():
    """7B at 8k on 8 x H100 with the full-logits path: the layers' activations dominate until
    checkpointing is on, then the logits do, and the chunked path comes before halving micro-batches.
    With the path on (the default) the planner never names it."""
    shapes = Shapes(*[BUILTIN_SHAPES["qwen2.5-7b"]] * 3)
    cluster = Cluster(HARDWARE["h100"])
    off = load_config("vcppo", LONG_COT + ["actor.logprob_chunk_size=0"])
    knobs, fitted = find_fit(Setting(off, cluster), shapes)
    assert knobs[:3] == ["actor.gradient_checkpointing=true", "critic.gradient_checkpointing=true",
                         "actor.logprob_chunk_size=1024"] and fitted.fits
    ckpt = load_config("vcppo", LONG_COT + ["actor.logprob_chunk_size=0", "actor.gradient_checkpointing=true",
                                            "critic.gradient_checkpointing=true"])
    assert find_fit(Setting(ckpt, cluster), shapes)[0][0] == "actor.logprob_chunk_size=1024"
    on = load_config("vcppo", LONG_COT)
    knobs_on, _ = find_fit(Setting(on, cluster), shapes)
    assert knobs_on and not any("logprob_chunk_size" in k for k in knobs_on)
    assert plan_run(load_config("vcppo", LONG_COT + knobs_on), shapes, cluster).fits


def test_the_cpu_device_keeps_a_constant_and_mfu_overrides_the_curve():
    cfg = load_config("vcppo", [])
    shapes = Shapes(*[BUILTIN_SHAPES["qwen2.5-0.5b"]] * 3)
    cpu = plan_run(cfg, shapes, Cluster(HARDWARE["cpu24"], 1, 1))
    assert cpu.time.training_mfu == pytest.approx(T.CPU_MFU)
    gpu = plan_run(cfg, shapes, Cluster(HARDWARE["h100"], 1, 1))
    constant = plan_run(cfg, shapes, Cluster(HARDWARE["h100"], 1, 1), mfu=0.35)
    assert constant.time.training_mfu == pytest.approx(0.35)
    assert gpu.time.training_s > 3 * constant.time.training_s  # ~7% measured at this micro-batch


def test_the_planner_reads_the_step_plans_of_every_preset_without_torch():
    """`vcppo plan` asks the driver's step plan which passes run; the plan imports without torch."""
    import subprocess
    import sys
    code = ("import sys\nfrom vcppo.config.load import CONFIG_DIR, load_config\nfrom vcppo.plan import timing\n"
            "for p in sorted(CONFIG_DIR.glob('*.yaml')):\n    assert timing.step_passes(load_config(p.stem))['actor']\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nprint('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_a_frozen_critic_module_carries_no_optimizer_state():
    """critic.freeze: only the trainable parameters get gradients and Adam states in the plan; a frozen
    attention takes its q/k/v/o weights out of them (with LoRA: their adapters)."""
    shape = BUILTIN_SHAPES["qwen2.5-7b"]
    shapes = Shapes(*[shape] * 3)

    def critic(*overrides):
        plan = plan_run(load_config("vcppo", LONG_COT + list(overrides)), shapes, Cluster(HARDWARE["h100"]))
        return next(e for e in plan.engines if e.role == "critic").states

    full, frozen = critic(), critic("critic.freeze=[attention]")
    h, q, kv = shape.hidden_size, shape.q_dim, shape.kv_dim
    attention = shape.num_layers * (2 * h * q + 2 * h * kv + q + 2 * kv)
    assert full.optimizer_bytes - frozen.optimizer_bytes == pytest.approx(attention * 12 / 8)  # ZeRO-3 over 8
    assert frozen.params_bytes == full.params_bytes  # the weights are all still there
    lora, lora_frozen = critic("critic.lora.rank=8"), critic("critic.lora.rank=8", "critic.freeze=[attention]")
    adapters = shape.num_layers * 8 * (h + q + 2 * (h + kv) + q + h)
    assert lora.optimizer_bytes - lora_frozen.optimizer_bytes == pytest.approx(adapters * 12 / 8)
