"""`vcppo plan --measure` against a real `vcppo train` of the same config on this CPU: the measure
times exactly the training phases the run logs (the driver's time/*_s keys: old logprobs, values,
critic and actor updates at two PPO epochs), and plans them at the run's order of magnitude.

Not a timing test: on a machine shared with other work (CI runs two test files at once) a real step
can take several times its machine-alone time, which is what `--measure` plans (its fastest call of
each phase, CPU seconds with one thread: vcppo.plan.measure). The bound here only catches a pass
missing or counted twice, or a unit slip. How close the plan comes on an idle host is a measurement,
with its command and figures in docs/scaling.md. `pytest -rP` prints this run's figures."""
import json
import statistics

import pytest

from tests.conftest import vcppo
from vcppo.tracking import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRAINING_PHASES = ("old_logprobs", "ref_logprobs", "values", "critic_update", "actor_update")
STEPS = 3  # step 1 warms up; the fastest of steps 2-3 is compared (the bound is 10x either way)


def config(art, model_dir) -> list[str]:
    return [f"model.policy_path={model_dir}", "trainer.prompts_per_step=8", "rollout.n_samples_per_prompt=4",
            "rollout.max_response_tokens=128", "data.max_prompt_tokens=64", "actor.micro_batch_size=8",
            "critic.micro_batch_size=8", f"data.train_files={art / 'data/train.parquet'}",
            f"data.val_files={art / 'data/val.parquet'}"]


def mean_prompt_tokens(overrides: list[str], model_dir) -> float:
    """The run's prompts as its loader tokenizes them (template included)."""
    from transformers import AutoTokenizer

    from vcppo.config.load import load_config
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


def test_measure_plans_the_phases_a_real_run_logs(tiny_artifacts, tmp_path):
    """The `vcppo` preset's step plan with two PPO epochs, whose step runs the old-logprobs and values
    passes beside both updates."""
    art = tiny_artifacts
    model_dir = art / "tiny"
    extra = ["actor.ppo_epochs=2", "critic.ppo_epochs=2"]
    overrides = config(art, model_dir) + extra
    prompt = mean_prompt_tokens(overrides, model_dir)
    res = vcppo("train", "vcppo", *overrides, f"trainer.output_root={tmp_path}", f"trainer.total_steps={STEPS}",
                "value_pretrain.steps=1", "trainer.val_every=0", "trainer.save_every=0", "logging.wandb=false",
                "logging.progress_bar=false", cwd=tmp_path, check=False, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    steps = [r for r in read_metrics(tmp_path / "vcppo-seed0", "ppo") if r["step"] > 1]  # step 1 warms up
    assert len(steps) == STEPS - 1
    response = statistics.mean(r["response/length_mean"] for r in steps)
    planned = measure(overrides, prompt, response, tmp_path, "after")
    phases = [p for p in TRAINING_PHASES if f"time/{p}_s" in steps[0]]
    assert set(planned) == set(phases) == {"old_logprobs", "values", "critic_update", "actor_update"}
    fastest = min(steps, key=lambda r: sum(r[f"time/{p}_s"] for p in phases))
    total_real, total_planned = sum(fastest[f"time/{p}_s"] for p in phases), sum(planned.values())
    print(f"tiny, 2 epochs: prompt {prompt:.0f} + response {response:.1f} tokens a sequence, 32 a step; real phases "
          f"(fastest of steps 2-{STEPS}) {total_real:.3f} s, planned {total_planned:.3f} s "
          f"({total_planned / total_real - 1:+.0%})")
    for p in phases:
        assert planned[p] > 0
    assert 0.1 < total_planned / total_real < 10
