"""vcppo.config.placement: each placement's answers (the rank roles, the ranks each part gets, the checks)
from the config alone, and the table that names the implementations."""
import re

import pytest

from vcppo.config.load import load_config
from vcppo.config.placement import BOTH, CRITIC, PLACEMENTS, ROLLOUT, TRAIN, Placement
from vcppo.errors import ConfigError


def test_colocated_ranks_do_everything():
    cfg = load_config("vcppo", [])
    p = Placement.of(cfg)
    assert p.name == "colocated" and type(p).__name__ == "Colocated"
    assert not p.rollout_apart and not p.critic_apart and not p.overlapped and p.rollout_beside_training
    assert p.reshards and p.sequence_parallel and p.serves() == {}
    assert p.ranks(8) == (8, 8) and p.remote_critic(None) is None
    assert p.samples_on(BOTH)
    p.check_ranks(cfg, 4)
    with pytest.raises(ConfigError, match=r"'trainer.prompts_per_step' \(16\) must be divisible by the number of ranks \(3\)"):
        p.check_ranks(cfg, 3)


def test_split_gives_the_last_ranks_to_sampling_and_the_middle_to_the_critic():
    p = Placement.of(load_config("vcppo", ["placement.mode=split", "placement.critic_ranks=2",
                                           "trainer.max_staleness=1", "algorithm.rollout_is_cap=2"]))
    assert p.name == "split" and type(p).__name__ == "Split"
    assert p.rollout_apart and p.critic_apart and p.overlapped and not p.rollout_beside_training
    assert not p.reshards and not p.sequence_parallel
    assert p.ranks(5) == (2, 1)  # 2 actor ranks, 2 critic ranks, 1 rollout rank
    assert [p.roles(5).role_of(r) for r in range(5)] == [TRAIN, TRAIN, CRITIC, CRITIC, ROLLOUT]
    assert p.samples_on(ROLLOUT) and not p.samples_on(TRAIN) and not p.samples_on(CRITIC)
    assert p.describe() == "split placement: 1 rollout rank(s) sample, 2 critic rank(s) hold the critic"
    with pytest.raises(ConfigError, match=r"config key 'placement.critic_ranks' \(2\) must equal the number of actor ranks"):
        p.ranks(6)
    assert not Placement.of(load_config("vcppo", ["placement.mode=split"])).overlapped  # staleness 0


def test_a_split_run_serves_on_its_other_ranks():
    """What a rollout rank and a critic rank do instead of training (ppo.train asks the placement)."""
    from vcppo.driver.placement.critic_ranks import serve_critic
    from vcppo.driver.placement.rollout_ranks import serve_rollouts
    serves = Placement.of(load_config("vcppo", ["placement.mode=split"])).serves()
    assert serves == {ROLLOUT: serve_rollouts, CRITIC: serve_critic}


def test_the_schema_offers_the_rows_of_the_table(monkeypatch):
    """placement.mode's choices are PLACEMENTS' rows, read when a config loads: a new row is a new choice."""
    with pytest.raises(ConfigError, match=r"'placement.mode' must be one of \['colocated', 'split'\]"):
        load_config("vcppo", ["placement.mode=pinned"])
    monkeypatch.setitem(PLACEMENTS, "pinned", "vcppo.driver.placement.colocated:Colocated")
    assert Placement.of(load_config("vcppo", ["placement.mode=pinned"])).samples_on(BOTH)


def test_the_config_and_the_planner_read_the_placements_without_torch():
    """A placement's module imports its parts only where they are asked for: loading a config (which
    builds its placement for the rules) imports no torch."""
    import subprocess
    import sys
    code = ("import sys\nfrom vcppo.config.load import load_config\nfrom vcppo.config.placement import Placement\n"
            "for mode in ('colocated', 'split'):\n    Placement.of(load_config('vcppo', [f'placement.mode={mode}']))\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nprint('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


BUILDERS = {"driver/phases.py", "config/rules.py", "plan/advise.py", "plan/knobs.py", "commands/plan.py", "bench/step.py",
            "driver/step/step_plan.py"}  # a run, a config's checks, a plan (and its knobs), a bench; step_plan: None given


def test_the_placement_is_built_where_a_config_becomes_a_run_a_check_or_a_plan_and_handed_on():
    """Placement.of(cfg) only where a config becomes a run, its checks or a plan; every other module is
    handed the placement, and none tells placements apart by name or class (it asks their answers)."""
    from pathlib import Path
    pkg = Path(__file__).resolve().parent.parent / "vcppo"
    built = {str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if "Placement.of(" in p.read_text()
             and str(p.relative_to(pkg)) != "config/placement.py"}
    assert built <= BUILDERS and "driver/phases.py" in built, built - BUILDERS
    told_apart = re.compile(r"placement\.name\s*[!=]=|isinstance\([^)]*(placement|Split|Colocated)")
    hits = [str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if told_apart.search(p.read_text())]
    assert not hits, hits
    assert told_apart.search("if placement.name == 'split':") and told_apart.search("isinstance(p, Split)")
