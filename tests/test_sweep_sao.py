"""The sweep regimes_sao: `sao` and VC-PPO at 64 x 1 against Dr. GRPO at 16 x 4 and `sao` with the full
critic, 64 responses a step for everyone, regimes_samples' `chain` setting; the launcher's dry run lists
every run and builds nothing."""
import subprocess
from pathlib import Path

from tests.conftest import ENV
from vcppo.sweep import expand, load_sweep

REPO = Path(__file__).resolve().parents[1]


def last(overrides, key, default=None):
    return ([x for x in overrides if x.startswith(key + "=")] or [f"={default}"])[-1].split("=", 1)[1]


def test_regimes_sao_gives_every_setting_64_responses_and_sao_its_own_critic_steps():
    runs = expand(load_sweep("regimes_sao")[1])
    seen = {}
    for r in runs:
        o = r["overrides"]
        prompts, n = int(last(o, "trainer.prompts_per_step")), int(last(o, "rollout.n_samples_per_prompt"))
        assert prompts * n == 64 and last(o, "trainer.total_steps") == "50"
        if r["preset"] == "sao":
            assert last(o, "value_pretrain.steps") == "10" and last(o, "algorithm.lambda_actor") == "0.8"
        full = last(o, "critic.freeze") == "[]"
        seen.setdefault((r["preset"], prompts, n, full), set()).add(last(o, "trainer.seed"))
    assert seen == {s: {"0", "1", "2"} for s in [("sao", 64, 1, False), ("vcppo", 64, 1, False),
                                                 ("drgrpo", 16, 4, False), ("sao", 64, 1, True)]}
    assert [r["name"] for r in runs][:6] == [f"{p}-64x1-seed{s}" for s in "012" for p in ("sao", "vcppo")]


def test_regimes_sao_dry_run_lists_every_run_and_builds_nothing(tmp_path):
    res = subprocess.run([str(REPO / "launch/regimes_sao.sh"), "--dry-run"], cwd=tmp_path, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len([line for line in res.stdout.splitlines() if " train " in line]) == 12
    assert not any(tmp_path.iterdir())


def test_regimes_sao_warm_starts_each_sao_run_from_the_exported_pretrained_critic():
    first, *warm = expand(load_sweep("regimes_sao_warm")[1])
    assert first["preset"] == "vcppo" and last(first["overrides"], "trainer.total_steps") == "0"
    assert [last(r["overrides"], "trainer.seed") for r in warm] == ["0", "1", "2"]
    assert all(last(r["overrides"], "critic.init_from") == "runs/regimes_sao_warm/critic80" for r in warm)


def test_regimes_sao_tools_gives_both_critics_the_same_start_and_grpo_its_groups():
    runs = expand(load_sweep("regimes_sao_tools")[1])
    critics = [r for r in runs if r["preset"] in ("sao", "vcppo")]
    assert len(critics) == 9 and len(runs) == 12
    full = [r["name"] for r in critics if last(r["overrides"], "critic.freeze") == "[]"]
    assert full == [f"sao-full-64x1-seed{s}" for s in "012"]  # after the comparison's 9 runs
    assert [r["name"] for r in runs[-3:]] == full
    for r in critics:  # one lambda, one count of critic-only steps, one episode a prompt
        o = r["overrides"]
        assert last(o, "algorithm.lambda_actor") == "0.99" and last(o, "value_pretrain.steps") == "10"
        assert (last(o, "trainer.prompts_per_step"), last(o, "rollout.n_samples_per_prompt")) == ("64", "1")
        assert last(o, "model.policy_path") == "chain_tools/sft"
    grpo = [r for r in runs if r["preset"] == "grpo"]
    assert [last(r["overrides"], "rollout.n_samples_per_prompt") for r in grpo] == ["4"] * 3  # a group to mean over
