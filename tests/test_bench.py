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
    assert row["ref_x2"]["runs"] == 2 and row["fused_impl"] in ("torch", "numba")
    assert row["speedup_vs_ref_x2"] > 0
    assert len(calls) == 2 * (1 + 2)  # two lambdas x (one warm-up + two timed runs)


def test_rollout_bench_builds_its_model_with_the_factory_not_the_tests(tmp_path):
    tree = ast.parse(open(rollout_bench.__file__).read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m.split(".")[0] in ("tests", "conftest") for m in imported), imported
    assert "sys.path" not in ast.unparse(tree)
    model_dir = rollout_bench._tiny_model(str(tmp_path / "tiny"))
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(model_dir)
    assert cfg.model_type == "qwen2" and cfg.hidden_size == 128  # the factory's `tiny`
    assert cfg.vocab_size >= len(AutoTokenizer.from_pretrained(model_dir))


@pytest.mark.slow
@pytest.mark.integration
def test_rollout_bench_runs_the_real_engines(tmp_path):
    """vLLM, HF generate, the DeepSpeed actor / critic steps with the PPO losses, and the weight sync."""
    from tests.conftest import vcppo
    res = vcppo("bench", "rollout", "--prompts", "4", "--n", "2", "--max-tokens", "16", "--micro-batch-size", "4",
                "--json", tmp_path / "out" / "rollout.json", cwd=tmp_path, check=False, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads((tmp_path / "out" / "rollout.json").read_text())
    for key in ("vllm_tok_per_s", "hf_tok_per_s", "fwd_logprobs_s", "fwd_values_s", "actor_step_s",
                "critic_step_s", "sync_s"):
        assert figures[key] > 0, key
    assert figures["train_tokens"] == figures["vllm_tokens"]


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
