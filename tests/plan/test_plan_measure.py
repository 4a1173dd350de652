"""`vcppo plan --measure` against a real `vcppo train` of the same config on this CPU: the planned
training phases (old logprobs, reference, values, critic and actor updates: the driver's time/*_s
keys) within 25% of a real step's at two model sizes. Both sides take their least disturbed
sample, as a machine shared with other work slows some calls and some steps several-fold: the
measure its fastest call of each phase (vcppo.plan.measure), the run its fastest step after the
first; the planned figure is the mean of a measure taken just before and one just after the run.
`pytest -rP` prints the figures (with the steps' median beside them)."""
import json
import statistics

import pytest

from tests.conftest import vcppo
from vcppo.tracking import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRAINING_PHASES = ("old_logprobs", "ref_logprobs", "values", "critic_update", "actor_update")
STEPS = 6


def config(art, model_dir) -> list[str]:
    return [f"model.policy_path={model_dir}", "trainer.prompts_per_step=8", "rollout.n_samples_per_prompt=4",
            "rollout.max_response_tokens=128", "data.max_prompt_tokens=64", "actor.micro_batch_size=8",
            "critic.micro_batch_size=8", f"data.train_files={art / 'data/train.parquet'}",
            f"data.val_files={art / 'data/val.parquet'}"]


def mean_prompt_tokens(overrides: list[str], model_dir) -> float:
    """The run's prompts as its loader tokenizes them (template included)."""
    from transformers import AutoTokenizer

    from vcppo.config import load_config
    from vcppo.driver.context import load_prompt_set
    cfg = load_config("vcppo", overrides)
    prompts = load_prompt_set(cfg, cfg.data.train_files, AutoTokenizer.from_pretrained(str(model_dir)),
                              max_prompt_tokens=cfg.data.max_prompt_tokens, shuffle_seed=None)
    return statistics.mean(len(ids) for ids in prompts.dataset["prompt_ids"])


def measure(overrides, prompt, response, cwd, name) -> dict:
    out = cwd / f"{name}.json"
    vcppo("plan", "vcppo", *overrides, "--gpu", "cpu24", "--gpus-per-node", "1", "--measure",
          "--measure-repeats", "5", "--prompt-tokens", str(prompt), "--response-tokens", str(response),
          "--json", str(out), cwd=cwd, timeout=600)
    return json.loads(out.read_text())["measure"]["phases_s"]


@pytest.mark.parametrize("size,extra", [("tiny", []), ("small", []),
                                        ("tiny", ["actor.ppo_epochs=2", "critic.ppo_epochs=2"])],
                         ids=["tiny", "small", "tiny-2-epochs"])
def test_measured_training_phases_match_a_real_run(size, extra, tiny_artifacts, tmp_path):
    """The `vcppo` preset's step plan (one optimizer step: the updates give pi_old and V_old) at two
    model sizes, and with two PPO epochs, whose step runs the old-logprobs and values passes too."""
    art = tiny_artifacts
    model_dir = art / size
    if not (model_dir / "config.json").exists():
        vcppo("model", "make", "--size", size, "--out", size, cwd=art)
    overrides = config(art, model_dir) + extra
    prompt = mean_prompt_tokens(overrides, model_dir)
    # the run's mean response length is not known before it: the first measure uses the maximum's
    # three quarters (what a random tiny model's responses average here), the second the run's own
    before = measure(overrides, prompt, 96, tmp_path, "before")
    res = vcppo("train", "vcppo", *overrides, f"trainer.output_root={tmp_path}", f"trainer.total_steps={STEPS}",
                "value_pretrain.steps=1", "trainer.val_every=0", "trainer.save_every=0", "logging.wandb=false",
                "logging.progress_bar=false", cwd=tmp_path, check=False, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    steps = [r for r in read_metrics(tmp_path / "vcppo-seed0", "ppo") if r["step"] > 1]  # step 1 warms up
    assert len(steps) == STEPS - 1
    response = statistics.mean(r["response/length_mean"] for r in steps)
    after = measure(overrides, prompt, response, tmp_path, "after")
    phases = [p for p in TRAINING_PHASES if f"time/{p}_s" in steps[0]]
    fastest = min(steps, key=lambda r: sum(r[f"time/{p}_s"] for p in phases))
    real = {p: fastest[f"time/{p}_s"] for p in phases}
    median = statistics.median(sum(r[f"time/{p}_s"] for p in phases) for r in steps)
    # the first measure's lengths were a guess: scale it to the run's tokens (time ~ tokens here)
    scale = (prompt + response) / (prompt + 96)
    planned = {p: (before[p] * scale + after[p]) / 2 for p in after}
    assert set(planned) == set(real), (planned, real)
    total_real, total_planned = sum(real.values()), sum(planned.values())
    print(f"{size} {' '.join(extra)}: prompt {prompt:.0f} + response {response:.1f} tokens a sequence, 32 a step; "
          f"real phases (fastest of steps 2-{STEPS}) {json.dumps({k: round(v, 3) for k, v in real.items()})} "
          f"= {total_real:.3f} s (median step {median:.3f} s); planned before {sum(before.values()) * scale:.3f}, after "
          f"{sum(after.values()):.3f}, mean {total_planned:.3f} s ({total_planned / total_real - 1:+.0%})")
    assert total_planned == pytest.approx(total_real, rel=0.25)
