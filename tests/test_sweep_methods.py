"""The methods comparison as one command: per-preset overrides in a sweep, the chain_methods sweep
(7 methods x 3 seeds, the critic methods at lambda 0.8), its launch script's dry run, and the
PPO minutes and final entropy the results table adds."""
import copy
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ENV
from vcppo.errors import ConfigError
from vcppo.sweep import expand, load_sweep, ppo_time, seed_summary, with_overrides

REPO = Path(__file__).resolve().parents[1]


def test_preset_overrides_apply_to_that_preset_only():
    runs = expand({"output_root": "out", "overrides": ["trainer.total_steps=3"],
                   "preset_overrides": {"ppo": ["algorithm.lambda_critic=0.8"]},
                   "grid": {"preset": ["ppo", "grpo"], "trainer.seed": [0]},
                   "runs": [{"name": "late", "preset": "ppo", "algorithm.lambda_critic": 0.9}]})
    by_name = {r["name"]: r["overrides"] for r in runs}
    assert "algorithm.lambda_critic=0.8" in by_name["ppo-seed0"]
    assert not any("lambda_critic" in o for o in by_name["grpo-seed0"])
    # an explicit run's own keys come after the preset's, so they win
    late = by_name["late"]
    assert late.index("algorithm.lambda_critic=0.8") < late.index("algorithm.lambda_critic=0.9")
    with pytest.raises(ConfigError, match="preset_overrides"):
        expand({"preset_overrides": ["x"], "runs": [{"name": "a"}]})


def test_chain_methods_runs_seven_methods_on_three_seeds_with_lambda_08_critics():
    runs = expand(load_sweep("chain_methods")[1])
    presets = {r["preset"] for r in runs}
    assert presets == {"vcppo", "ppo", "grpo", "rloo", "reinforce_plus_plus_baseline", "drgrpo", "gspo"}
    assert len(runs) == 21
    for r in runs:
        o = r["overrides"]
        assert "trainer.total_steps=50" in o and "rollout.n_samples_per_prompt=4" in o
        assert ("algorithm.lambda_actor=0.8" in o) == (r["preset"] in ("vcppo", "ppo"))
        assert ("algorithm.lambda_critic=0.8" in o) == (r["preset"] == "ppo")


def test_ppo_time_and_entropy_in_the_seed_summary(tmp_path):
    records = [{"phase": "ppo", "step": s, "time/step_s": 1.5 + s, "actor/entropy": 0.1 * s} for s in range(1, 11)]
    records.append({"phase": "value_pretrain", "step": 1, "time/step_s": 99.0})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    t = ppo_time(tmp_path)
    assert t["ppo_minutes"] == pytest.approx(sum(1.5 + s for s in range(1, 11)) / 60)  # pretraining left out
    assert t["entropy_end"] == pytest.approx((0.9 + 1.0) / 2)  # the last fifth of the steps
    assert ppo_time(tmp_path / "missing") == {}
    rows = [{"name": f"rloo-seed{s}", "finished": True, "ppo_minutes": m} for s, m in enumerate((1.0, 2.0, 3.0))]
    assert "| rloo | 3 | 2.000 ± 1.000 |" in seed_summary(rows)


def test_command_line_settings_shorten_a_sweep():
    """`vcppo sweep chain_methods output_root=... grid.trainer.seed=[0,1] trainer.total_steps=20`:
    its own root, two seeds, 20 steps in every run; the file's sweep is unchanged."""
    _, spec = load_sweep("chain_methods")
    before = copy.deepcopy(spec)
    short = with_overrides(spec, ["output_root=runs/short", "grid.trainer.seed=[0, 1]", "trainer.total_steps=20"])
    runs = expand(short)
    assert len(runs) == 14 and all(r["run_dir"].startswith("runs/short/") for r in runs)
    assert all(r["overrides"].index("trainer.total_steps=20") > r["overrides"].index("trainer.total_steps=50")
               for r in runs)  # later wins
    assert spec == before and len(before["grid"]["trainer.seed"]) == 3  # (its 21 runs: the test above)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        with_overrides(spec, ["trainer.total_steps"])


def last_override(overrides: list[str], key: str, default=None) -> str:
    """The value a run's overrides give ``key`` (the later wins), else ``default`` as text."""
    return ([x for x in overrides if x.startswith(key + "=")] or [f"={default}"])[-1].split("=", 1)[1]


def test_regimes_samples_gives_every_setting_64_responses_and_the_critics_no_groups():
    runs = expand(load_sweep("regimes_samples")[1])
    assert len(runs) == 18
    shapes = {}
    for r in runs:
        last = lambda key: last_override(r["overrides"], key)  # noqa: E731
        prompts, n = int(last("trainer.prompts_per_step")), int(last("rollout.n_samples_per_prompt"))
        assert prompts * n == 64 and last("trainer.total_steps") == "50"
        shapes.setdefault((r["preset"], prompts, n), set()).add(last("trainer.seed"))
    assert shapes == {s: {"0", "1", "2"} for s in [("vcppo", 64, 1), ("ppo", 64, 1), ("vcppo", 16, 4),
                                                   ("grpo", 16, 4), ("rloo", 16, 4), ("drgrpo", 16, 4)]}
    assert [r["name"].rsplit("seed", 1)[1] for r in runs] == [s for s in "012" for _ in range(6)]  # seed-major


def test_regimes_length_runs_the_samples_settings_on_the_long_chain():
    runs = expand(load_sweep("regimes_length")[1])
    shapes = {}
    for r in runs:
        last = lambda key: last_override(r["overrides"], key)  # noqa: E731
        prompts, n = int(last("trainer.prompts_per_step")), int(last("rollout.n_samples_per_prompt"))
        assert prompts * n == 64 and last("trainer.total_steps") == "50"
        assert last("data.train_files") == "chain_long/data/train.parquet" and last("model.policy_path") == "chain_long/sft"
        assert int(last("rollout.max_response_tokens")) >= 217  # the longest training trace of 24 operands
        lam = last("algorithm.lambda_actor") if r["preset"] == "vcppo" else None
        shapes.setdefault((r["preset"], prompts, n, lam), set()).add(last("trainer.seed"))
    assert shapes == {s: {"0", "1", "2"} for s in [("vcppo", 64, 1, "0.8"), ("vcppo", 16, 4, "0.8"),
                                                   ("vcppo", 64, 1, "0.95"), ("vcppo", 64, 1, "1.0"),
                                                   ("grpo", 16, 4, None)]}


def test_chain_build_makes_the_directory_and_operand_count_it_is_given(tmp_path):
    """Every stage's command names the directory; data gets the operand count (a stand-in CLI records the calls)."""
    fake = tmp_path / "vcppo"
    fake.write_text('#!/bin/sh\necho "$@" >> calls.txt\n')
    fake.chmod(0o755)
    res = subprocess.run([str(REPO / "launch/chain_build.sh"), "chain_long", "24"], cwd=tmp_path,
                         env={**ENV, "VCPPO": str(fake)}, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert [c.split()[:2] for c in calls] == [["data", "make"], ["model", "make"], ["sft", "demo"], ["rm", "demo"]]
    assert "--out chain_long/data" in calls[0] and "--operands 24" in calls[0] and "--difficulty 1" in calls[0]
    assert "--out chain_long/init-small" in calls[1]
    assert all("demo.workdir=chain_long" in c for c in calls[2:])


def test_regimes_critic_updates_varies_only_the_critic_at_64_by_1():
    runs = expand(load_sweep("regimes_critic_updates")[1])
    assert len(runs) == 9
    settings = {}
    for r in runs:
        last = lambda key, default=None: last_override(r["overrides"], key, default)  # noqa: E731
        assert (r["preset"], last("trainer.prompts_per_step"), last("rollout.n_samples_per_prompt")) == ("vcppo", "64", "1")
        assert last("algorithm.lambda_actor") == "0.8" and last("trainer.total_steps") == "50"
        settings.setdefault((last("critic.ppo_epochs", 1), last("critic.lr", "base")), set()).add(last("trainer.seed"))
    assert settings == {s: {"0", "1", "2"} for s in [("2", "base"), ("4", "base"), ("1", "0.0009")]}


def test_regimes_reuse_splits_only_the_actors_update_into_4_and_8_steps():
    runs = expand(load_sweep("regimes_reuse")[1])
    settings = {}
    for r in runs:
        last = lambda key, default=None: last_override(r["overrides"], key, default)  # noqa: E731
        assert (last("trainer.prompts_per_step"), last("rollout.n_samples_per_prompt"), last("trainer.total_steps")) == \
            ("16", "4", "50")
        assert last("critic.ppo_epochs", 1) == "1" and last("critic.ppo_mini_batches", 1) == "1"
        steps = int(last("actor.ppo_mini_batches", 1)) * int(last("actor.ppo_epochs", 1))
        settings.setdefault((r["preset"], steps), set()).add(last("trainer.seed"))
    assert settings == {(p, k): {"0", "1", "2"} for p in ("vcppo", "grpo", "gspo") for k in (4, 8)}


@pytest.mark.parametrize("sweep,env,steps,settings", [
    ("regimes_episodes", "guess", "30", [("vcppo", 16, 4), ("vcppo", 64, 1), ("ppo", 16, 4), ("grpo", 16, 4),
                                         ("rloo", 16, 4), ("reinforce_plus_plus_baseline", 16, 4)]),
    ("regimes_tools", "tools", "20", [("vcppo", 16, 4), ("vcppo", 64, 1), ("grpo", 16, 4), ("rloo", 16, 4)]),
    ("regimes_sao_tools", "tools", "20", [("sao", 64, 1), ("vcppo", 64, 1), ("grpo", 16, 4)])])
def test_regimes_episode_sweeps_run_every_method_at_64_episodes_a_step(sweep, env, steps, settings):
    runs = expand(load_sweep(sweep)[1])
    seen = {}
    for r in runs:
        last = lambda key, default=None: last_override(r["overrides"], key, default)  # noqa: E731
        prompts, n = int(last("trainer.prompts_per_step")), int(last("rollout.n_samples_per_prompt"))
        assert prompts * n == 64 and last("rollout.env") == env and last("rollout.max_turns") == "4"
        assert last("trainer.total_steps") == steps
        assert last("model.critic_init", "policy") == "policy"  # no reward model for episodes
        seen.setdefault((r["preset"], prompts, n), set()).add(last("trainer.seed"))
    assert seen == {s: {"0", "1", "2"} for s in settings}


# Each launch script's dry run, and how many `vcppo train` lines it lists.
DRY_RUNS = {"chain_methods": 21, "regimes_samples": 18, "regimes_critic_updates": 9, "regimes_reuse": 18,
            "regimes_episodes": 30, "regimes_length": 15, "regimes_sao_tools": 12}
# A `vcppo` that only writes down its command line (the script's part), so that every script's `vcppo
# sweep` runs in this process (what `vcppo sweep NAME --dry-run` does), not in one interpreter each.
RECORDING_VCPPO = '#!/bin/sh\nprintf "%s\\0" "$@" >> "$VCPPO_CALLS"\nprintf "\\n" >> "$VCPPO_CALLS"\n'


def test_launch_scripts_dry_run_lists_every_run_and_builds_nothing(tmp_path, monkeypatch, capsys):
    from vcppo.commands import sweep as sweep_command
    stub = tmp_path / "bin" / "vcppo"
    stub.parent.mkdir()
    stub.write_text(RECORDING_VCPPO)
    stub.chmod(0o755)
    for script, runs in DRY_RUNS.items():
        work, calls = tmp_path / script, tmp_path / f"{script}.calls"
        work.mkdir()
        res = subprocess.run([str(REPO / f"launch/{script}.sh"), "--dry-run"], cwd=work, capture_output=True,
                             text=True, timeout=60, env=dict(ENV, VCPPO=str(stub), VCPPO_CALLS=str(calls)))
        assert res.returncode == 0, (script, res.stderr[-3000:])
        listed = 0
        monkeypatch.chdir(work)
        for line in calls.read_text().splitlines():
            argv = line.split("\0")[:-1]
            assert argv[0] == "sweep" and argv[-1] == "--dry-run", (script, argv)
            assert sweep_command.main(argv[1:]) == 0, (script, argv)
            listed += sum(" train " in out for out in capsys.readouterr().out.splitlines())
        assert listed == runs, script
        assert not any(work.iterdir()), script  # neither the script nor the sweep built anything
