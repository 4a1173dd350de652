"""Multi-turn episodes through `vcppo train` with the real engines (vLLM CPU, DeepSpeed on gloo):
the `guess` env answers every turn, the critic reads the observations and is fit at model tokens,
the fp32 sampler/trainer mismatch on model tokens stays at the single-turn level, and a run
killed with SIGKILL resumes to the uninterrupted records. The tiny random policy is made to take
turns by stopping each turn at its first digit (rollout.stop): its guess."""
import pytest

from tests.conftest import vcppo
from tests.driver.test_exact_resume_e2e import assert_same, records, sigkill_after_checkpoint
from tests.driver.test_train_e2e import train
from vcppo.driver.durability.checkpoint import list_complete

pytestmark = [pytest.mark.integration]

DIGITS = "[" + ",".join(f"'{d}'" for d in "0123456789") + "]"


@pytest.fixture(scope="module")
def guess_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("guess")
    vcppo("data", "make", "--task", "guess", "--out", "data", "--n", "64", "--n-eval", "8", cwd=root)
    return root / "data"


def overrides(art, data, out, **extra) -> list[str]:
    o = {"model.policy_path": art / "tiny", "data.train_files": data / "train.parquet",
         "data.val_files": data / "val.parquet", "trainer.output_root": out, "trainer.total_steps": 3,
         "trainer.prompts_per_step": 4, "rollout.n_samples_per_prompt": 2, "rollout.env": "guess",
         "rollout.stop": DIGITS, "rollout.max_response_tokens": 96, "rollout.turn_max_tokens": 12,
         "rollout.sampler_logprobs": True, "value_pretrain.steps": 2, "trainer.val_max_prompts": 4,
         "trainer.val_n_samples": 2, "trainer.val_k": "[1,2]", "trainer.save_every": 1, "actor.lr": 1e-4,
         "critic.lr": 1e-4, "logging.progress_bar": False, "logging.wandb": False, "actor.micro_batch_size": 4,
         "critic.micro_batch_size": 4}
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


@pytest.fixture(scope="module")
def uninterrupted(tiny_artifacts, guess_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("episodes")
    res = train("vcppo", overrides(tiny_artifacts, guess_data, root), cwd=root, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return root, records(root / "vcppo-seed0")


def test_a_multi_turn_run_reads_and_trains_on_episodes(uninterrupted):
    _, full = uninterrupted
    ppo = [r for r in full if r["phase"] == "ppo"]
    assert len(ppo) == 3
    assert max(r["env/turns_mean"] for r in ppo) > 1.2  # the env answered and the policy replied
    assert all(0 < r["env/obs_token_frac"] < 1 for r in ppo) and all(r["env/failures"] == 0 for r in ppo)
    # fp32 on CPU: vLLM's logprobs of the model tokens equal the trainer's (~1e-7), as single-turn
    assert all(r["mismatch/logprob_abs_max"] < 1e-4 for r in ppo)
    assert all("critic/explained_variance" in r for r in ppo)
    vals = [r for r in full if r["phase"] == "val"]
    assert vals and all("val/pass@1_greedy" in r for r in vals)


@pytest.mark.extended
def test_a_sigkilled_multi_turn_run_resumes_exactly(uninterrupted, tiny_artifacts, guess_data, tmp_path):
    """Env seeds are fixed per sample and step, so the resumed run replays the same episodes."""
    _, full = uninterrupted
    over = overrides(tiny_artifacts, guess_data, tmp_path)
    ckpts = sigkill_after_checkpoint(over, tmp_path, "step_000003")  # PPO step 1's checkpoint (tag 2 + 1)
    assert list_complete(ckpts)[-1].name < "step_000005"
    res = train("vcppo", over, cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from" in res.stderr
    assert_same(records(tmp_path / "vcppo-seed0"), full)


@pytest.mark.extended
@pytest.mark.distributed
def test_split_synchronous_episodes_log_what_colocated_logs(tiny_artifacts, guess_data, tmp_path):
    """The rollout rank runs the env pool and the episodes; at staleness 0 the training rank gets the
    batch a colocated rank would have made, so every logged figure matches."""
    from tests.conftest import run_ranks
    from tests.driver.test_split_e2e import ONE_THREAD, comparable
    colocated, split = tmp_path / "colocated", tmp_path / "split"
    extra = {"trainer.total_steps": 2, "trainer.save_every": 0}
    run_ranks("train", "vcppo", *overrides(tiny_artifacts, guess_data, colocated, **extra), cwd=tmp_path,
              world_size=1, env=ONE_THREAD)
    run_ranks("train", "vcppo", *overrides(tiny_artifacts, guess_data, split, **extra), "placement.mode=split",
              cwd=tmp_path, env=ONE_THREAD)
    want, got = records(colocated / "vcppo-seed0"), records(split / "vcppo-seed0")
    assert any(r.get("env/turns_mean", 0) > 1 for r in want)
    assert_same(comparable(got), comparable(want))


@pytest.mark.extended
def test_episodes_with_dynamic_sampling_lora_and_packing(tiny_artifacts, guess_data, tmp_path):
    """GRPO on episodes with DAPO's dynamic sampling (the tiny policy's groups are mostly all -1, so it
    resamples), a LoRA actor whose adapters vLLM samples with, the KL against the actor with its
    adapters off, and packed rows: the policy still trains on model tokens only."""
    from tests.driver.test_train_e2e import for_preset
    over = for_preset("grpo", overrides(tiny_artifacts, guess_data, tmp_path, **{
        "trainer.total_steps": 2, "trainer.save_every": 0, "trainer.dynamic_sampling": True,
        "trainer.dynamic_sampling_max_tries": 2, "actor.lora.rank": 4, "actor.lora.alpha": 8, "actor.lr": 1e-3,
        "rollout.lora_sync": "adapter", "actor.packed": True, "algorithm.kl_coef": 0.05, "algorithm.kl_in": "loss"}))
    res = train("grpo", over, cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "reference policy: the actor with its LoRA adapters off" in res.stderr
    ppo = [r for r in records(tmp_path / "grpo-seed0") if r["phase"] == "ppo"]
    assert len(ppo) == 2 and all(r["dynamic_sampling/sampled_groups"] >= 4 for r in ppo)
    assert sum(r["dynamic_sampling/tries"] for r in ppo) > 2  # at least one step resampled
    assert max(r["env/turns_mean"] for r in ppo) > 1.2 and all(0 < r["env/obs_token_frac"] < 1 for r in ppo)
    assert all(r["mismatch/logprob_abs_max"] < 1e-4 for r in ppo)  # vLLM samples with the training adapters
    assert ppo[0]["actor/kl_loss"] == 0.0 and ppo[1]["actor/kl_loss"] > 0  # the adapters moved the policy


@pytest.mark.extended  # make test runs the same check on a scripted sampler (tests/driver/test_multi_turn.py)
def test_real_vllm_episodes_are_the_sampled_ids_plus_the_observation_ids(tiny_artifacts, info):
    """With the real vLLM engine: every turn's context is exactly the prompt, the ids vLLM returned for
    the earlier turns and the observation frames of the env's answers (replayed here), and the
    episode's tokens and logprobs are those ids and vLLM's logprobs, nothing decoded and re-encoded."""
    from vcppo.data.dataset import encode_prompt
    from vcppo.driver.step.multi_turn import EpisodeRunner, ObservationEncoder
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.envs.guess import GuessEnv
    from vcppo.envs.worker import EnvRunner
    from vcppo.config.schema import Config, RolloutConfig

    cfg = Config()
    r = cfg.rollout
    r.env, r.env_args, r.stop = "guess", {"n": 16, "max_turns": 4}, list("0123456789")
    r.turn_max_tokens, r.max_response_tokens = 12, 96
    engine = RolloutEngine(str(tiny_artifacts / "tiny"), RolloutConfig(gpu_memory_utilization=0.02), info, seed=0,
                           max_model_len=256)
    calls, generate = [], engine.generate
    engine.generate = lambda prompts, **kw: calls.append((prompts, out := generate(prompts, **kw))) or out
    try:
        prompt = encode_prompt(engine.tokenizer, "guess 1-16 in 4", use_chat_template=True)
        rows = [{"prompt_ids": prompt, "answer": str(a)} for a in (3, 11)]
        done = EpisodeRunner(cfg, engine, EnvRunner(0, 5.0), max_model_len=256).run(rows, 2, 7, "ppo", 1.0, True)
    finally:
        engine.close()
    tok, encode = engine.tokenizer, ObservationEncoder(engine.tokenizer)
    assert max(e.turns for e in done) >= 2
    contexts = [list(e.prompt_ids) for e in done]
    sampled = [[] for _ in done]
    envs = [GuessEnv(16, 4) for _ in done]
    for env, e in zip(envs, done):
        env.reset(rows[e.prompt_index], 0)
    for t, (prompts, samples) in enumerate(calls):
        live = [k for k, e in enumerate(done) if e.turns > t]
        assert len(live) == len(prompts)
        for i, k in enumerate(live):
            assert prompts[i] == contexts[k], (t, k)  # exactly what the episode holds so far
            ids = samples[i].response_ids
            contexts[k] += ids
            sampled[k] += samples[i].logprobs
            if t + 1 < done[k].turns:  # the env answered this turn: its observation frame follows
                observation = envs[k].step(tok.decode(ids, skip_special_tokens=True))[0]
                contexts[k] += encode(observation, "user", closed=ids[-1] == tok.eos_token_id)
    for k, e in enumerate(done):
        assert contexts[k][len(e.prompt_ids):] == e.tokens
        assert [lp for lp, p in zip(e.logprobs, e.policy) if p] == sampled[k]
