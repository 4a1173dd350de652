"""End-to-end `vcppo train` runs on CPU with a tiny local model and the real engines (vLLM CPU,
DeepSpeed ZeRO-3 on gloo, datasets, wandb offline). Each run is its own process, as a user runs it."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vcppo.driver.checkpoint import checkpoint_root, list_complete
from vcppo.tracking import read_metrics

pytestmark = [pytest.mark.integration]

from tests.conftest import ENV

def base_overrides(art: Path, out: Path, **extra) -> list[str]:
    o = {"model.policy_path": art / "tiny", "model.critic_path": art / "rm",
         "data.train_files": art / "data/train.parquet", "data.val_files": art / "data/val.parquet",
         "trainer.output_root": out, "trainer.total_steps": 2, "trainer.prompts_per_step": 4,
         "rollout.n_samples_per_prompt": 2, "rollout.max_response_tokens": 48, "value_pretrain.steps": 2,
         "trainer.val_max_prompts": 4, "trainer.val_n_samples": 2, "trainer.val_k": "[1,2]",
         "trainer.save_every": 0, "actor.lr": 1e-4, "critic.lr": 1e-4, "logging.progress_bar": False,
         "actor.micro_batch_size": 4, "critic.micro_batch_size": 4}
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


def train(preset: str, overrides: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vcppo.cli", "train", preset, *overrides], cwd=cwd, env=ENV,
                          capture_output=True, text=True, **kw)


def phases_in_file_order(run_dir: Path) -> list[str]:
    return [json.loads(line)["phase"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["vcppo", "ppo", "vcppo_no_dgae", "grpo", "vapo"])
def test_preset_runs_end_to_end(preset, tiny_artifacts, tmp_path):
    res = train(preset, base_overrides(tiny_artifacts, tmp_path), cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    run_dir = tmp_path / f"{preset}-seed0"
    assert (run_dir / "final_metrics.json").exists() and (run_dir / "final" / "actor" / "config.json").exists()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["preset"] == preset
    assert list((run_dir / "wandb").glob("offline-run-*")), "wandb offline run missing"
    ppo = sorted(read_metrics(run_dir, "ppo"), key=lambda r: r["step"])
    pre = read_metrics(run_dir, "value_pretrain")
    assert [r["step"] for r in ppo] == [1, 2]
    for r in ppo:
        for key in ("reward/mean", "reward/accuracy", "response/length_mean", "response/length_p90",
                    "response/truncated_frac", "adv/mean", "adv/std", "adv/position_profile",
                    "actor/pg_loss", "actor/clip_frac_low", "actor/clip_frac_high", "actor/approx_kl",
                    "actor/grad_norm", "actor/lr",
                    "mismatch/logprob_abs_mean", "actor/entropy", "time/rollout_s", "perf/tokens_per_s"):
            assert key in r, f"{key} missing from step {r['step']}"
        # the sampler (vLLM) and the trainer (DeepSpeed) agree on logprobs of the same weights
        assert r["mismatch/logprob_abs_mean"] < 1e-3
    val = read_metrics(run_dir, "val")
    assert {r["step"] for r in val} == {0, 2} and all("val/pass@2" in r for r in val)

    has_critic = preset != "grpo"
    assert all(("critic/grad_norm" in r) == has_critic for r in ppo)
    assert all(("critic/explained_variance" in r and "critic/value_loss" in r) == has_critic for r in ppo)
    if preset in ("vcppo", "vcppo_no_dgae", "vapo"):
        # Critic-only steps first: every pretraining record comes before the first PPO record.
        order = [p for p in phases_in_file_order(run_dir) if p in ("value_pretrain", "ppo")]
        assert order == ["value_pretrain"] * 2 + ["ppo"] * 2
        assert all(not any(k.startswith("actor/grad") for k in r) for r in pre)
        assert all("critic/explained_variance" in r and "critic/value_loss" in r for r in pre)
        assert list((tmp_path / "critic_cache").iterdir())
    else:
        assert pre == []
    if preset == "vapo":
        assert "actor/num_positive" in ppo[0]


@pytest.mark.slow
def test_same_seed_runs_repeat_exactly(tiny_artifacts, tmp_path):
    """Two runs of one command with one seed, on one machine: every logged figure (bar wall times)
    and the final weights are identical, value pretraining included (each run pretrains its own
    critic: the caches are separate)."""
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        root.mkdir()
        res = train("vcppo", base_overrides(tiny_artifacts, root, **{"trainer.total_steps": 3}), cwd=root,
                    timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]

    def records(root):
        return [{k: v for k, v in r.items() if k != "time" and not k.startswith(("time/", "perf/"))}
                for r in read_metrics(root / "vcppo-seed0")]

    first, second = records(roots[0]), records(roots[1])
    assert [r["phase"] for r in first].count("ppo") == 3 and [r["phase"] for r in first].count("value_pretrain") == 2
    assert first == second
    weights = [(root / "vcppo-seed0" / "final" / "actor" / "model.safetensors").read_bytes() for root in roots]
    assert weights[0] == weights[1]


@pytest.mark.slow
def test_every_loss_option_runs(tiny_artifacts, tmp_path):
    """KL penalty (reference engine), dual-clip, entropy bonus, sequence-level aggregation, several
    PPO epochs and mini-batches, cosine schedule with warm-up, gradient checkpointing."""
    extra = {"algorithm.kl_coef": 0.05, "algorithm.kl_estimator": "k2", "algorithm.dual_clip_c": 3.0,
             "algorithm.entropy_coef": 0.01, "algorithm.loss_agg": "seq-mean-token-mean",
             "actor.ppo_epochs": 2, "actor.ppo_mini_batches": 2, "critic.ppo_mini_batches": 2,
             "actor.warmup_steps": 1, "actor.lr_schedule": "cosine", "actor.gradient_checkpointing": True,
             "value_pretrain.enabled": False, "trainer.total_steps": 1}
    res = train("vcppo", base_overrides(tiny_artifacts, tmp_path, **extra), cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    (rec,) = read_metrics(tmp_path / "vcppo-seed0", "ppo")
    assert rec["actor/kl_ref"] >= 0.0 and "time/ref_logprobs_s" in rec
    assert "actor/dual_clip_frac" in rec


@pytest.mark.slow
def test_dapo_and_mismatch_options_run(tiny_artifacts, tmp_path):
    """VAPO with DAPO's dynamic sampling, soft overlong punishment and overlong filtering, and
    truncated importance sampling against vLLM's logprobs, on the real engines."""
    extra = {"trainer.dynamic_sampling": True, "trainer.dynamic_sampling_max_tries": 3,
             "reward.overlong_buffer_tokens": 16, "algorithm.mask_truncated": True,
             "algorithm.rollout_is_cap": 2.0, "value_pretrain.steps": 1, "value_pretrain.reuse": False}
    res = train("vapo", base_overrides(tiny_artifacts, tmp_path, **extra), cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    (pre,) = read_metrics(tmp_path / "vapo-seed0", "value_pretrain")
    assert pre["reward/overlong_penalty_mean"] <= 0.0 and "dynamic_sampling/tries" not in pre
    for rec in read_metrics(tmp_path / "vapo-seed0", "ppo"):
        assert 1 <= rec["dynamic_sampling/tries"] <= 3
        assert rec["dynamic_sampling/sampled_groups"] == 4 * rec["dynamic_sampling/tries"]
        # fp32 on CPU: vLLM and the trainer agree to ~1e-5, so every weight is ~1 and none is cut
        assert rec["mismatch/logprob_abs_max"] < 1e-3 and rec["mismatch/kl_k3"] < 1e-6
        assert rec["mismatch/tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert rec["mismatch/tis_truncated_frac"] == 0.0


@pytest.mark.slow
def test_pretrained_critic_is_reused_across_runs(tiny_artifacts, tmp_path):
    first = train("vcppo", base_overrides(tiny_artifacts, tmp_path, **{"trainer.total_steps": 1}), cwd=tmp_path,
                  timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    # A different algorithm (shared lambda) and seed, same policy / data / critic config: reuse.
    second = train("vcppo_no_dgae", base_overrides(tiny_artifacts, tmp_path, **{"trainer.total_steps": 1,
                                                                           "trainer.seed": 5}),
                   cwd=tmp_path, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    run2 = tmp_path / "vcppo_no_dgae-seed5"
    assert read_metrics(run2, "value_pretrain") == []
    assert read_metrics(run2, "value_pretrain_reused")
    assert len(list((tmp_path / "critic_cache").iterdir())) == 1


@pytest.mark.slow
def test_killed_run_resumes_with_identical_metrics(tiny_artifacts, tmp_path):
    """Kill a run (SIGKILL) after its first checkpoint; rerunning the same command resumes from the
    last complete checkpoint and reproduces the uninterrupted run's metrics step for step."""
    over = lambda out: base_overrides(tiny_artifacts, out, **{"trainer.total_steps": 6, "trainer.save_every": 2,  # noqa: E731
                                                         "trainer.val_every": 0, "value_pretrain.steps": 2,
                                                         "rollout.temperature": 1.0,
                                                         # #17: the critic's schedule survives a PPO-phase resume
                                                         "critic.lr_schedule": "cosine",
                                                         "actor.lr_schedule": "cosine"})
    full_root, cut_root = tmp_path / "full", tmp_path / "cut"
    full_root.mkdir(), cut_root.mkdir()
    res = train("vcppo", over(full_root), cwd=full_root, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]

    proc = subprocess.Popen([sys.executable, "-m", "vcppo.cli", "train", "vcppo", *over(cut_root)], cwd=cut_root,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ckpts = checkpoint_root(cut_root / "vcppo-seed0")
    deadline = time.time() + 600
    # Wait for the first checkpoint of the PPO phase (global step 2 pretraining + 2 PPO = 4).
    while time.time() < deadline and proc.poll() is None:
        if any(p.name >= "step_000004" for p in list_complete(ckpts)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = list_complete(ckpts)[-1].name
    assert killed_at < "step_000008", killed_at  # it really was cut short

    res = train("vcppo", over(cut_root), cwd=cut_root, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from" in res.stderr

    def table(root):
        recs = {r["step"]: r for r in read_metrics(root / "vcppo-seed0", "ppo")}
        return {s: {k: v for k, v in r.items() if not k.startswith(("time", "perf"))} for s, r in recs.items()}

    full, resumed = table(full_root), table(cut_root)
    raw = [(json.loads(x)["phase"], json.loads(x)["step"])
           for x in (cut_root / "vcppo-seed0" / "metrics.jsonl").read_text().splitlines()]
    assert len(raw) == len(set(raw)), "a replayed step was recorded twice"
    assert sorted(resumed) == sorted(full) == [1, 2, 3, 4, 5, 6]
    first_resumed = int(killed_at.split("_")[1]) - 2 + 1  # PPO step after the checkpoint
    for step in range(first_resumed, 7):
        for key, value in full[step].items():
            if isinstance(value, float):
                assert resumed[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)
            else:
                assert resumed[step][key] == value, (step, key)


@pytest.mark.parametrize("override,needle", [
    (["algorithm.lamda_actor=0.9"], "algorithm.lambda_actor"),
    (["data.train_files=/nope/train.parquet"], "data.train_files"),
    (["model.policy_path=/nope/model"], "model.policy_path"),
])
def test_bad_config_fails_before_any_engine_starts(override, needle, tiny_artifacts, tmp_path):
    t0 = time.time()
    res = train("vcppo", base_overrides(tiny_artifacts, tmp_path) + override, cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert needle in res.stderr
    assert "starting vLLM" not in res.stderr and not (tmp_path / "vcppo-seed0").exists()
    assert time.time() - t0 < 60
