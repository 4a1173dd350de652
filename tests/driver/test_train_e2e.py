"""End-to-end `vcppo train` runs on CPU with a tiny local model and the real engines (vLLM CPU,
DeepSpeed ZeRO-3 on gloo, datasets, wandb offline in the `vcppo` preset's run). Each run is its own process, as a user runs it."""
import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from vcppo.algos.kl import adaptive_kl_coef
from vcppo.tracking import read_metrics

pytestmark = [pytest.mark.integration]

from tests.conftest import vcppo

def base_overrides(art: Path, out: Path, **extra) -> list[str]:
    o = {"model.policy_path": art / "tiny", "model.critic_path": art / "rm",
         "data.train_files": art / "data/train.parquet", "data.val_files": art / "data/val.parquet",
         "trainer.output_root": out, "trainer.total_steps": 2, "trainer.prompts_per_step": 4,
         "rollout.n_samples_per_prompt": 2, "rollout.max_response_tokens": 48, "value_pretrain.steps": 2,
         "trainer.val_max_prompts": 4, "trainer.val_n_samples": 2, "trainer.val_k": "[1,2]",
         "trainer.save_every": 0, "actor.lr": 1e-4, "critic.lr": 1e-4, "logging.progress_bar": False,
         "actor.micro_batch_size": 4, "critic.micro_batch_size": 4,
         # wandb (offline) costs a process ~3 s: on in the `vcppo` preset's run, which checks its files
         "logging.wandb": False}
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


def for_preset(preset: str, overrides: list[str]) -> list[str]:
    """``overrides`` without the critic's keys (base_overrides sets them) for a preset without a critic,
    where setting them is an error."""
    from vcppo.config.load import CRITIC_KEYS, load_config
    from vcppo.methods import uses_critic
    if uses_critic(load_config(preset).algorithm.advantage_estimator):
        return overrides
    estimator = [o for o in overrides if o.startswith("algorithm.advantage_estimator=")]
    if estimator and uses_critic(estimator[-1].partition("=")[2]):
        return overrides
    return [o for o in overrides if o.partition("=")[0] not in CRITIC_KEYS]


def train(preset: str, overrides: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return vcppo("train", preset, *for_preset(preset, overrides), cwd=cwd, check=False, timeout=timeout)


def phases_in_file_order(run_dir: Path) -> list[str]:
    return [json.loads(line)["phase"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# Options a preset's run also exercises: each process costs ~35 s on the 2-core CI machine, so the
# option sets ride on the preset runs instead of starting runs of their own.
LOSS_OPTIONS = {  # KL penalty (reference engine), dual-clip, entropy bonus, sequence-level aggregation,
    # several PPO epochs and mini-batches, cosine schedule with warm-up, gradient checkpointing
    "algorithm.kl_coef": 0.05, "algorithm.kl_estimator": "k2", "algorithm.dual_clip_c": 3.0,
    "algorithm.entropy_coef": 0.01, "algorithm.loss_agg": "seq-mean-token-mean", "actor.ppo_epochs": 2,
    "actor.ppo_mini_batches": 2, "critic.ppo_mini_batches": 2, "actor.warmup_steps": 1,
    "actor.lr_schedule": "cosine", "actor.gradient_checkpointing": True,
    "rollout.sampler_logprobs": True,  # fp32 would leave them off (null = auto): the mismatch/* metrics
    # the adaptive KL controller, and a reward model's scores (normalised) beside the rule's
    "algorithm.kl_target": 0.01, "algorithm.kl_horizon": 100.0, "reward.combine": "weighted_sum",
    "reward.model_weight": 0.5, "reward.normalize_model_scores": True}
KL_IN_LOSS = {"algorithm.kl_coef": 0.01, "algorithm.kl_in": "loss", "algorithm.kl_estimator": "low_var_kl"}
DAPO_AND_MISMATCH = {  # DAPO's dynamic sampling, soft overlong punishment and overlong filtering,
    # and truncated importance sampling against vLLM's logprobs
    "trainer.dynamic_sampling": True, "trainer.dynamic_sampling_max_tries": 3,
    "reward.overlong_buffer_tokens": 16, "algorithm.mask_truncated": True, "algorithm.rollout_is_cap": 2.0}
# GSPO's sequence-level loss composes with any estimator: it rides on the `grpo` run (GSPO's own
# preset is that: GRPO's advantages). The critic-free estimators run the same driver code (the
# fake-engine step of each: tests/driver/test_estimators_step.py), so one of them, with its KL in the
# reward and Dr. GRPO's aggregation riding on it, stands for them here.
GSPO = {"algorithm.policy_loss": "gspo", "algorithm.loss_agg": "seq-mean-token-mean"}
DR_GRPO_AGG = {"algorithm.loss_agg": "seq-mean-token-sum-norm"}
PRESET_OPTIONS = {"ppo": LOSS_OPTIONS, "vapo": DAPO_AND_MISMATCH, "grpo": {**KL_IN_LOSS, **GSPO},
                  "reinforce_plus_plus_baseline": DR_GRPO_AGG}


@pytest.fixture(scope="module")
def vcppo_twice(tiny_artifacts, tmp_path_factory):
    """Two runs of one `vcppo` command with one seed, each in its own root (so each pretrains its
    own critic): the `vcppo` preset's end-to-end run, and the same-seed repeat."""
    roots = [tmp_path_factory.mktemp("vcppo_a"), tmp_path_factory.mktemp("vcppo_b")]
    for root in roots:
        res = train("vcppo", base_overrides(tiny_artifacts, root, **{"logging.wandb": True}), cwd=root, timeout=600)
        assert res.returncode == 0, res.stderr[-4000:]
    return roots


# The actor's and reference's logprobs a few positions at a time (several chunks per micro-batch
# here), so the `ppo` run's chunked path can be held against the full-logits path's.
SMALL_CHUNKS = {"actor.logprob_chunk_size": 7, "reference.logprob_chunk_size": 7}


def ppo_overrides(art: Path, root: Path, **extra) -> list[str]:
    options = {**LOSS_OPTIONS, "trainer.seed": 0, "reward.model_path": art / "rm_scored", **extra}
    return base_overrides(art, root, **options)


@pytest.fixture(scope="module")
def ppo_chunked(tiny_artifacts, tmp_path_factory):
    """The `ppo` preset's run (LOSS_OPTIONS: entropy bonus, KL to the reference, checkpointing)."""
    root = tmp_path_factory.mktemp("ppo_chunked")
    res = train("ppo", ppo_overrides(tiny_artifacts, root, **SMALL_CHUNKS), cwd=root, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return root


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["vcppo", "ppo", "vcppo_no_dgae", "grpo", "vapo", "reinforce_plus_plus_baseline"])
def test_preset_runs_end_to_end(preset, tiny_artifacts, tmp_path, request):
    seed, reuses = 0, preset == "vcppo_no_dgae"
    if preset == "vcppo":
        tmp_path = request.getfixturevalue("vcppo_twice")[0]
    elif preset == "ppo":
        tmp_path = request.getfixturevalue("ppo_chunked")
    else:
        if reuses:
            # In the root where the `vcppo` run pretrained and published its critic: a different
            # algorithm (shared lambda) and seed with the same policy / data / critic config reuses it.
            tmp_path, seed = request.getfixturevalue("vcppo_twice")[1], 5
        options = {**PRESET_OPTIONS.get(preset, {}), "trainer.seed": seed}
        res = train(preset, base_overrides(tiny_artifacts, tmp_path, **options), cwd=tmp_path, timeout=600)
        assert res.returncode == 0, res.stderr[-4000:]
    run_dir = tmp_path / f"{preset}-seed{seed}"
    assert (run_dir / "final_metrics.json").exists() and (run_dir / "final" / "actor" / "config.json").exists()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["preset"] == preset
    if preset == "vcppo":  # the one e2e run with wandb on (offline)
        assert list((run_dir / "wandb").glob("offline-run-*")), "wandb offline run missing"
    ppo = sorted(read_metrics(run_dir, "ppo"), key=lambda r: r["step"])
    pre = read_metrics(run_dir, "value_pretrain")
    assert [r["step"] for r in ppo] == [1, 2]
    for r in ppo:
        for key in ("reward/mean", "reward/accuracy", "response/length_mean", "response/length_p90",
                    "response/truncated_frac", "adv/mean", "adv/std", "adv/position_profile",
                    "actor/pg_loss", "actor/clip_frac_low", "actor/clip_frac_high", "actor/approx_kl",
                    "actor/grad_norm", "actor/lr", "actor/entropy", "time/rollout_s", "perf/tokens_per_s"):
            assert key in r, f"{key} missing from step {r['step']}"
        # fp32 with nothing that reads the sampler's logprobs: vLLM is not asked for them
        # (rollout.sampler_logprobs=null, auto); ppo asks (true), vapo's TIS needs them
        assert ("mismatch/logprob_abs_mean" in r) == (preset in ("ppo", "vapo"))
        if preset in ("ppo", "vapo"):
            # the sampler (vLLM) and the trainer (DeepSpeed) agree on logprobs of the same weights
            assert r["mismatch/logprob_abs_mean"] < 1e-3
    val = read_metrics(run_dir, "val")
    assert {r["step"] for r in val} == {0, 2} and all("val/pass@2" in r for r in val)

    has_critic = preset not in ("grpo", "reinforce_plus_plus_baseline")
    assert all(("critic/grad_norm" in r) == has_critic for r in ppo)
    assert all(("critic/explained_variance" in r and "critic/value_loss" in r) == has_critic for r in ppo)
    if reuses:
        assert pre == [] and read_metrics(run_dir, "value_pretrain_reused")
        assert len(list((tmp_path / "critic_cache").iterdir())) == 1
    elif preset in ("vcppo", "vapo"):
        # Critic-only steps first: every pretraining record comes before the first PPO record.
        order = [p for p in phases_in_file_order(run_dir) if p in ("value_pretrain", "ppo")]
        assert order == ["value_pretrain"] * 2 + ["ppo"] * 2
        assert all(not any(k.startswith("actor/grad") for k in r) for r in pre)
        assert all("critic/explained_variance" in r and "critic/value_loss" in r for r in pre)
        assert list((tmp_path / "critic_cache").iterdir())
    else:
        assert pre == []
    if preset == "ppo":  # LOSS_OPTIONS
        assert all("time/ref_logprobs_s" in r and "actor/dual_clip_frac" in r for r in ppo)
        for r in ppo:  # the penalty reached the returns advantage estimation got, at this step's coefficient
            assert r["reward/with_kl_mean"] == pytest.approx(r["reward/mean"] - r["reward/kl_penalty"], abs=1e-5)
            # kl_ref (each sample's token-mean KL, averaged) and the penalty (kl_coef x each sample's summed
            # KL, averaged) read the same per-token k2: mean <= sum <= 48 x mean (responses of 1..48 tokens)
            summed = r["reward/kl_penalty"] / r["actor/kl_coef"]
            assert r["actor/kl_ref"] * (1 - 1e-5) <= summed <= 48 * r["actor/kl_ref"] * (1 + 1e-5) + 1e-15
            assert "reward/model_score_mean" in r and "time/reward_model_s" in r
            assert r["reward/model_running_std"] > 0  # the scores of a random head differ
        # step 1 samples from the reference's own weights: KL 0 (to fp32 rounding: the actor and the
        # reference pass other micro-batches, so other chunks of rows reach the head's matmul), so
        # the controller lowers the coefficient
        assert abs(ppo[0]["reward/kl_penalty"]) < 1e-12 and ppo[1]["reward/kl_penalty"] > 1e-9
        assert ppo[0]["actor/kl_coef"] == 0.05
        assert ppo[1]["actor/kl_coef"] == pytest.approx(adaptive_kl_coef(0.05, ppo[0]["actor/kl_ref"], 0.01, 100.0, 8))
    if preset == "grpo":  # KL_IN_LOSS: a term of the actor's loss, the rewards untouched
        assert all("reward/kl_penalty" not in r for r in ppo)
        # every reward of the tiny random policy is the same (-1): GRPO's advantages and so the gradient are
        # 0 and the actor stays the reference; the KL term (the update's logprobs against the reference
        # pass's, tokens aligned, at the same temperature) must then be 0 as well
        assert all(r["adv/std"] == 0.0 and r["actor/grad_norm"] < 1e-6 for r in ppo)
        assert all(abs(r["actor/kl_loss"]) < 1e-9 for r in ppo), [r["actor/kl_loss"] for r in ppo]
        # GSPO: one optimizer step from the sampling weights, pi_old its own forward: every
        # sequence ratio is exactly 1
        assert all(r["actor/ratio_max"] == 1.0 and r["actor/clip_frac_high"] == 0.0 for r in ppo)
    if preset == "reinforce_plus_plus_baseline":  # its token-level KL in the reward (a reference pass)
        assert all("time/ref_logprobs_s" in r and "reward/kl_penalty" in r for r in ppo)
        assert all(abs(r["actor/pg_loss"]) < 10 for r in ppo)  # DR_GRPO_AGG: each sequence's sum / 48
    if preset == "vapo":  # DAPO_AND_MISMATCH
        assert "actor/num_positive" in ppo[0]
        assert all(r["reward/overlong_penalty_mean"] <= 0.0 and "dynamic_sampling/tries" not in r for r in pre)
        for r in ppo:
            assert 1 <= r["dynamic_sampling/tries"] <= 3
            assert r["dynamic_sampling/sampled_groups"] == 4 * r["dynamic_sampling/tries"]
            # fp32 on CPU: vLLM and the trainer agree to ~1e-5, so every weight is ~1 and none is cut
            assert r["mismatch/logprob_abs_max"] < 1e-3 and r["mismatch/kl_k3"] < 1e-6
            assert r["mismatch/tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
            assert r["mismatch/tis_truncated_frac"] == 0.0


@pytest.mark.slow
@pytest.mark.extended
def test_full_logits_path_logs_what_the_chunked_path_logs(ppo_chunked, tiny_artifacts, tmp_path):
    """`actor.logprob_chunk_size=0` (every response position's full logits at once) against the
    chunked path on the same seed: the same samples, rewards and every logged figure to float
    tolerance, through two PPO steps with an entropy bonus, a KL penalty (reference pass) and
    gradient checkpointing. Only wall times differ. `make test` keeps the two paths' equality in the
    engine (tests/engines/test_chunked_logprobs.py: logprobs, entropies, loss, gradient, weights) and
    the full-logits path on 2 SP ranks (tests/engines/test_sequence_parallel.py)."""
    full = {"actor.logprob_chunk_size": 0, "reference.logprob_chunk_size": 0}
    res = train("ppo", ppo_overrides(tiny_artifacts, tmp_path, **full), cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]

    def records(root):
        return [{k: v for k, v in r.items() if k != "time" and not k.startswith(("time/", "perf/"))}
                for r in read_metrics(root / "ppo-seed0") if r["phase"] in ("ppo", "val")]

    chunked, whole = records(ppo_chunked), records(tmp_path)
    assert [r["phase"] for r in chunked] == [r["phase"] for r in whole] and len(chunked) >= 3
    for a, b in zip(chunked, whole):
        assert set(a) == set(b)
        for k in a:
            if isinstance(a[k], (float, list)):  # lists: the advantage-vs-position profile
                assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), (a["phase"], a["step"], k)
            else:
                assert a[k] == b[k], (a["phase"], a["step"], k)


@pytest.mark.slow
def test_same_seed_runs_repeat_exactly(vcppo_twice):
    """Two runs of one command with one seed, on one machine: every logged figure (bar wall times)
    and the final weights are identical, value pretraining included (each run pretrains its own
    critic: the caches are separate)."""
    def records(root):
        return [{k: v for k, v in r.items() if k != "time" and not k.startswith(("time/", "perf/"))}
                for r in read_metrics(root / "vcppo-seed0")]

    first, second = records(vcppo_twice[0]), records(vcppo_twice[1])
    assert [r["phase"] for r in first].count("ppo") == 2 and [r["phase"] for r in first].count("value_pretrain") == 2
    assert first == second
    weights = [(root / "vcppo-seed0" / "final" / "actor" / "model.safetensors").read_bytes() for root in vcppo_twice]
    assert weights[0] == weights[1]


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
    assert "rollout engine:" not in res.stderr and not (tmp_path / "vcppo-seed0").exists()
    assert time.time() - t0 < 60
