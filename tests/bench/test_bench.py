"""`vcppo bench`: the dispatcher, the GAE bench's output and warm-up, and the rollout bench's model."""
import ast
import json

import pytest

import vcppo.bench as bench
from vcppo.bench import gae as gae_bench
from vcppo.bench import rollout as rollout_bench


def test_dispatcher_lists_benchmarks_and_rejects_unknown_ones(capsys):
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert "gae" in out and "rollout" in out
    assert bench.main(["rollot"]) == 2
    assert "did you mean 'rollout'?" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a benchmark's own -h
        bench.main(["gae", "-h"])
    assert e.value.code == 0 and "vcppo bench gae" in capsys.readouterr().out


def test_gae_bench_writes_json_into_a_missing_directory_and_warms_the_reference_up(tmp_path, monkeypatch):
    calls = []
    reference = gae_bench.gae_reference
    monkeypatch.setattr(gae_bench, "gae_reference", lambda *a, **k: calls.append(1) or reference(*a, **k))
    out = tmp_path / "not" / "there" / "bench_gae.json"
    assert bench.main(["gae", "--shapes", "4x16", "--repeats", "1", "--ref-repeats", "2", "--threads", "1",
                       "--device", "cpu", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = result["results"]
    assert row["ref_x2"]["runs"] == 2 and row["fused_impl"] == "torch"
    assert row["speedup_vs_ref_x2"] > 0
    assert len(calls) == 2 * (1 + 2)  # two lambdas x (one warm-up + two timed runs)


def test_rollout_bench_builds_its_model_with_the_factory_not_the_tests(tmp_path):
    tree = ast.parse(open(rollout_bench.__file__).read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m.split(".")[0] in ("tests", "conftest") for m in imported), imported
    assert "sys.path" not in ast.unparse(tree)
    model_dir = rollout_bench._factory_model("tiny")
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(model_dir)
    assert cfg.model_type == "qwen2" and cfg.hidden_size == 128  # the factory's `tiny`
    assert cfg.vocab_size >= len(AutoTokenizer.from_pretrained(model_dir))


@pytest.mark.slow
@pytest.mark.integration
def test_rollout_bench_stops_hf_where_vllm_stops(tmp_path):
    """HF generate is stopped (and counted) at every id of the generation config's EOS list, the ids
    vLLM ends a response on, not only at config.eos_token_id."""
    from transformers import AutoModelForCausalLM
    model_dir = rollout_bench._factory_model("tiny")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config.eos_token_id == 4 and rollout_bench.stop_token_ids(model) == [4, 1]
    model.generation_config.eos_token_id = None
    assert rollout_bench.stop_token_ids(model) == [4]


def run_rollout_bench(tmp_path, *extra) -> dict:
    from tests.conftest import vcppo
    res = vcppo("bench", "rollout", "--sizes", "tiny", "--rounds", "1", "--warmup", "0", "--train-step", *extra,
                "--prompts", "4", "--n", "2",
                "--max-tokens", "16", "--micro-batch-size", "4", "--json", tmp_path / "out" / "rollout.json",
                cwd=tmp_path, check=False, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads((tmp_path / "out" / "rollout.json").read_text())["tiny"]
    for key in ("engine_tok_per_s", "logprobs_tok_per_s", "seeded_tok_per_s", "hf_tok_per_s",
                "fwd_logprobs_s", "fwd_values_s", "actor_step_s", "critic_step_s", "sync_s"):
        assert figures[key] > 0, key
    assert figures["train_tokens"] == figures["engine_tokens"]  # one round: the batch that trained
    return figures


@pytest.mark.slow
@pytest.mark.integration
def test_rollout_bench_runs_the_real_engines(tmp_path):
    """vLLM (eager), HF generate, the DeepSpeed actor / critic steps with the PPO losses, and the weight
    sync."""
    assert "compiled_tok_per_s" not in run_rollout_bench(tmp_path)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.extended
def test_rollout_bench_also_times_compiled_vllm(tmp_path):
    """``--compiled``: a second vLLM engine, compiled, against HF generate."""
    figures = run_rollout_bench(tmp_path, "--compiled")
    assert figures["compiled_tok_per_s"] > 0 and figures["compiled_over_hf"] > 0


def test_reward_bench_compares_serial_and_pool_on_the_same_batch(tmp_path):
    from vcppo.bench import reward as reward_bench
    texts, truths, finish, hostile = reward_bench.make_batch(64, 2)
    assert len(texts) == 64 and len(hostile) == 2
    assert all(reward_bench.HOSTILE in texts[i] for i in hostile)
    out = tmp_path / "sub" / "bench_reward.json"
    result = reward_bench.main(["--samples", "24", "--hostile", "0", "--workers", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    (row,) = result["pool"]
    assert row["same_rewards_on_the_rest"] and row["timeouts"] == 0 and result["serial_s"] > 0


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.extended
def test_mismatch_bench_measures_both_dtypes(tmp_path):
    """vLLM and the DeepSpeed actor in fp32 agree to ~1e-6 on CPU (anything larger is a bug);
    in bf16 they differ by far more, and every figure is written."""
    from tests.conftest import vcppo
    res = vcppo("bench", "mismatch", "--size", "tiny", "--prompts", "4", "--n", "2", "--max-tokens", "16",
                "--json", tmp_path / "mm.json", cwd=tmp_path, check=False, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    fp32, bf16 = json.loads((tmp_path / "mm.json").read_text())["results"]
    assert (fp32["dtype"], bf16["dtype"]) == ("float32", "bfloat16") and fp32["tokens"] > 0
    assert fp32["logprob_abs_max"] < 1e-4 and fp32["tis_weight_max"] < 1.001
    assert bf16["logprob_abs_mean"] > 10 * fp32["logprob_abs_mean"] and bf16["kl_k3"] >= 0


# ---------------------------------------------------------------------------------------------
# `vcppo bench step` (vcppo/bench/step.py, trl_step.py)

def test_step_bench_is_listed_and_its_workload_is_a_valid_train_config(tmp_path, capsys):
    from vcppo.bench import step as step_bench
    from vcppo.config.load import load_config

    assert bench.main([]) == 0 and "step" in capsys.readouterr().out
    args = step_bench._parse(["--micro-batch", "64", "--kl-coef", "0.05", "--max-tokens", "128"])
    cfg = load_config("vcppo", step_bench.train_overrides(args, tmp_path, 64))  # strict: a typo raises
    assert cfg.rollout.max_response_tokens == 128 and cfg.rollout.n_samples_per_prompt == 4
    assert cfg.trainer.prompts_per_step == 16 and cfg.algorithm.kl_coef == 0.05  # KL on: a reference pass
    assert cfg.actor.micro_batch_size == cfg.critic.micro_batch_size == cfg.reference.micro_batch_size == 64
    assert (cfg.actor.ppo_epochs, cfg.actor.ppo_mini_batches) == (1, 1) and cfg.model.dtype == "float32"
    assert not cfg.value_pretrain.enabled and cfg.data.val_files is None
    assert cfg.model.policy_path == f"{tmp_path}/model-small"


def test_step_bench_medians_skip_the_warm_up_step():
    from vcppo.bench.step import _merge, summarize

    def run(*walls):
        return {"steps": [{"step_s": w, "phases": {"rollout": w / 2, "actor_update": w / 4},
                           "response_tokens": 100.0} for w in walls]}

    s = summarize(run(50.0, 2.0, 4.0, 3.0))  # step 1 (50 s, warm-up) is left out
    assert s["step_s"] == 3.0 and s["steps_timed"] == 3
    assert s["phases"] == {"rollout": 1.5, "actor_update": 0.75}
    assert s["tokens_per_s"] == 100.0 / 3.0 and s["s_per_token"] == 3.0 / 100.0
    merged = _merge([run(50.0, 2.0, 2.0), run(40.0, 6.0, 6.0, 6.0)])  # each round's warm-up dropped
    assert merged["step_s"] == 6.0 and merged["steps_timed"] == 5 and len(merged["rounds"]) == 2


def test_trl_phase_clock_splits_a_step_into_timed_calls_and_the_rest():
    import time

    from vcppo.bench.trl_step import PhaseClock, _per_step_tokens

    clock = PhaseClock()
    slow = clock.wrap(lambda model, x: time.sleep(0.02) or x, lambda model, *_: f"fwd_{model}")
    assert slow("ref", 7) == 7 and slow("ref", 1) == 1 and slow("value", 2) == 2
    time.sleep(0.01)
    clock.end_step(0.0)
    (step,) = clock.steps
    assert step["phases"]["fwd_ref"] >= 0.04 and step["phases"]["fwd_value"] >= 0.02
    assert step["phases"]["update_and_rest"] >= 0.01
    assert abs(sum(step["phases"].values()) - step["step_s"]) < 1e-9
    assert _per_step_tokens([10.0, 20.0, 30.0], 3) == [10.0, 20.0, 30.0]
    assert _per_step_tokens([10.0, 20.0, 30.0, 40.0], 2) == [30.0, 70.0]


def run_step_bench(tmp_path, *extra):
    from tests.conftest import vcppo
    out = tmp_path / "out" / "step.json"
    res = vcppo("bench", "step", "--size", "tiny", "--steps", "2", "--prompts", "2", "--n", "2", "--max-tokens", "8",
                "--micro-batch", "4", "--profile", "5", *extra, "--workdir", tmp_path / "w", "--json", out,
                cwd=tmp_path, check=False, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    row = json.loads(out.read_text())["settings"]["mb4"]
    ours = row["vcppo"]
    assert ours["step_s"] > 0 and ours["tokens_per_s"] > 0 and 0 < ours["response_tokens"] <= 2 * 2 * 8
    for phase in ("rollout", "old_logprobs", "ref_logprobs", "critic_update", "actor_update"):
        assert ours["phases"][phase] > 0, phase
    assert "values" not in ours["phases"]  # lambda_critic 1, one critic step: V_old from the update
    assert "Self CPU" in ours["profile"]  # --profile: torch.profiler's table of the last step
    return row, res


@pytest.mark.slow
@pytest.mark.integration
def test_step_bench_runs_the_driver_rl_step_with_the_real_engines(tmp_path):
    """vLLM + DeepSpeed actor / critic / reference through the driver's rl_step."""
    row, _ = run_step_bench(tmp_path)
    assert "trl" not in row


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.extended
def test_step_bench_also_runs_trl_on_the_same_workload(tmp_path):
    """``--trl``: TRL's PPOTrainer on the same workload, and the ratios."""
    pytest.importorskip("trl")
    row, res = run_step_bench(tmp_path, "--trl")
    assert row["trl"]["step_s"] > 0 and row["trl"]["phases"]["rollout"] > 0 and row["ratio_step"] > 0
    assert 0 < row["trl"]["response_tokens"] <= 2 * 2 * 8 and "vcppo / TRL" in res.stdout


@pytest.mark.slow
@pytest.mark.integration
def test_train_bench_times_padded_and_packed_passes(tmp_path):
    """`vcppo bench train`: both layouts in their own processes, forward and train step timed, the
    packed one on fewer tokens of padding; figures and ratios in the JSON."""
    from tests.conftest import vcppo
    out = tmp_path / "out" / "train.json"
    res = vcppo("bench", "train", "--models", "tiny", "--batch", "4", "--min-len", "8", "--max-len", "64",
                "--micro-batch", "2", "--budget", "256", "--repeats", "1", "--rounds", "1", "--threads", "1",
                "--json", out, cwd=tmp_path, check=False, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    row = json.loads(out.read_text())["models"]["tiny"]
    for layout in ("padded", "packed"):
        for phase in ("forward", "train_step"):
            assert row[layout][phase]["tokens_per_s"] > 0, (layout, phase)
    assert row["padded"]["padded_tokens"] > row["padded"]["real_tokens"]  # a long tail pads
    assert row["forward_speedup"] > 0 and row["train_step_speedup"] > 0


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.extended
def test_train_bench_compares_full_fine_tuning_with_lora(tmp_path):
    """`vcppo bench train --lora-ranks`: full and LoRA in their own processes; the adapters train a
    small share of the parameters, and the ratios against full fine-tuning are in the JSON."""
    from tests.conftest import vcppo
    out = tmp_path / "lora.json"
    res = vcppo("bench", "train", "--models", "tiny", "--batch", "4", "--min-len", "8", "--max-len", "64",
                "--budget", "256", "--repeats", "1", "--rounds", "1", "--threads", "1", "--lora-ranks", "4",
                "--json", out, cwd=tmp_path, check=False, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    row = json.loads(out.read_text())["models"]["tiny"]
    assert set(row) >= {"packed", "lora4", "lora4_vs_full"} and "padded" not in row
    assert row["lora4"]["trainable_params"] < row["packed"]["trainable_params"] / 10
    ratios = row["lora4_vs_full"]
    assert ratios["train_step_speedup"] > 0 and ratios["train_step_memory_ratio"] > 0
    assert "lora4" in res.stdout and "vs full" in res.stdout


@pytest.mark.slow
@pytest.mark.integration
def test_lora_bench_syncs_both_ways_and_both_engines_sample_the_actor(tmp_path):
    """`vcppo bench lora`: merged-weight and adapter syncs timed, both vLLM engines decode, and each
    samples exactly the updated LoRA actor (fp32)."""
    from tests.conftest import vcppo
    out = tmp_path / "lora.json"
    res = vcppo("bench", "lora", "--sizes", "tiny", "--prompts", "8", "--n", "2", "--max-tokens", "32", "--syncs", "1",
                "--rounds", "1", "--rank", "4", "--json", out, cwd=tmp_path, check=False, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    r = json.loads(out.read_text())["tiny"]
    assert r["adapter_sync_bytes"] < r["merged_sync_bytes"] / 10
    for mode in ("merged", "adapter"):
        assert r[f"{mode}_sync_s"] > 0 and r[f"{mode}_decode_tok_per_s"] > 0
        assert r[f"{mode}_max_logprob_gap"] < 1e-4, mode
    assert r["adapter_over_merged_decode"] > 0 and "ratio" in res.stdout


def test_shape_bench_runs_a_valid_train_config_and_asks_the_planner_about_the_same_one(tmp_path):
    """`vcppo bench shape` (the real-size run itself is too slow for the suite: docs/scaling.md has its
    figures): its overrides are a valid `vcppo train` config, and the planner reads them unchanged."""
    from vcppo.bench import shape
    from vcppo.config.load import load_config
    args = shape._parse(["--workdir", str(tmp_path), "--steps", "3"])
    cfg = load_config("vcppo", shape.overrides(args, tmp_path / "runs", 3))  # strict: a typo raises
    assert cfg.actor.lora.rank == cfg.critic.lora.rank == 16 and cfg.trainer.save_every == 1
    assert cfg.model.policy_path == f"{tmp_path}/model" and cfg.model.dtype == "float32"
    (tmp_path / "model").mkdir()
    from vcppo.models.factory import model_config
    from vcppo.models.tokenizer import build_tokenizer
    model_config(shape.SIZE, build_tokenizer()).save_pretrained(tmp_path / "model")
    plan = shape.planned(args, tmp_path / "runs")
    assert plan and json.dumps(plan)


def test_logprobs_bench_head_only_writes_both_paths(tmp_path):
    """The head-only sweep runs the full-logits path (chunk 0) and a chunked one on the same inputs."""
    from vcppo.bench import logprobs as logprobs_bench
    out = tmp_path / "lp.json"
    res = bench.main(["logprobs", "--head-only", "24", "--size", "tiny", "--chunks", "0,8", "--rounds", "1",
                      "--threads", "1", "--json", str(out)])
    assert res == 0
    rows = json.loads(out.read_text())["head_only"]
    assert set(rows) == {"0", "8"}
    for row in rows.values():
        for phase in ("forward", "train_step"):
            assert row[phase]["tokens_per_s"] > 0 and len(row[phase]["s"]) == 1
    assert logprobs_bench.parse_shape("16x512+4096") == (16, 512, 4096)
    with pytest.raises(SystemExit, match="NxP\\+R"):
        logprobs_bench.parse_shape("16x512")


def test_peak_rss_segments_follow_the_live_tensors():
    """Each marked segment holds its own peak: a freed tensor's memory does not count in the next one
    (the resident set tracks the live tensors), and one name keeps the highest of its segments."""
    import torch

    from vcppo.bench.train import PeakRSS, resident_is_live
    resident_is_live()
    with PeakRSS() as mem:
        big = torch.ones(50_000_000)  # 191 MiB
        mem.mark("big")
        del big
        mem.mark("free")  # a segment starts at the level its mark found
        small = torch.ones(2_000_000)  # 8 MiB
        mem.mark("small")
        mem.mark("small")
        del small
    assert mem.segments["big"] > 150 and mem.segments["small"] < 100 and mem.mib >= mem.segments["big"]
    assert set(mem.segments) == {"big", "free", "small"}


def test_train_segments_mark_forward_backward_and_optimizer():
    """:func:`train_segments` marks around the engine's backward and step, and puts them back."""
    from vcppo.bench.train import train_segments

    class Engine:
        def backward(self, loss):
            return "b"

        def step(self):
            return "s"

    class Marks:
        def __init__(self):
            self.names = []

        def mark(self, name):
            self.names.append(name)

    actor, mem = type("Actor", (), {})(), Marks()
    actor.engine = engine = Engine()
    restore = train_segments(actor, mem)
    assert engine.backward(1.0) == "b" and engine.backward(1.0) == "b" and engine.step() == "s"
    assert mem.names == ["forward", "backward", "forward", "backward", "backward", "optimizer"]
    restore()
    assert engine.backward(1.0) == "b" and len(mem.names) == 6


def test_sp_bench_summary_takes_the_worst_rank_and_the_host_rate(capsys):
    from vcppo.bench import sp
    rank = lambda peak, s: {"step_s": s, "peak_rss_gib": peak, "step_rss_gib": peak - 1,  # noqa: E731
                            "segments_gib": {"forward": peak - 2, "backward": peak - 1, "optimizer": 0.1}}
    one, two = sp.summary(1, [rank(10.0, 100.0)], 1000), sp.summary(2, [rank(6.0, 150.0), rank(6.5, 160.0)], 1000)
    assert two["peak_rss_gib"] == 6.5 and two["step_s"] == 160.0 and two["host_tokens_per_s"] == 2 * 1000 / 160
    assert two["segments_gib"]["forward"] == 4.5 and one["tokens_per_s_per_rank"] == 10.0
    sp._print([one, two], sp._parse(["--layers", "2"]))
    assert "0.65x" in capsys.readouterr().out  # 6.5 / 10 GiB per rank


@pytest.mark.extended
@pytest.mark.distributed
def test_sp_bench_runs_both_sizes_on_cpu_ranks(tmp_path):
    """The real thing, tiny: one 1-layer model of the 0.5B shape, SP 1 on one rank and SP 2 on two."""
    out = tmp_path / "sp.json"
    assert bench.main(["sp", "--sizes", "1,2", "--layers", "1", "--tokens", "64", "--prompt", "8", "--chunk", "32",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["sizes"]
    assert [r["sp"] for r in rows] == [1, 2] and [len(r["ranks"]) for r in rows] == [1, 2]
    for r in rows:
        assert r["peak_rss_gib"] > r["step_rss_gib"] > 0 and r["host_tokens_per_s"] > 0
        assert set(r["segments_gib"]) == {"forward", "backward", "optimizer"}
