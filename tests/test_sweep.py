import csv
from pathlib import Path

import pytest
import yaml

from tests.conftest import vcppo
from vcppo import sweep
from vcppo.commands import sweep as sweep_cli
from vcppo.errors import ConfigError
from vcppo.sweep import SWEEP_DIR, expand, load_sweep, resolve_sweep, shipped_sweeps


def test_grid_and_list_expand_to_named_validated_runs():
    runs = expand({"output_root": "out", "preset": "vcppo", "overrides": ["trainer.total_steps=3"],
                   "grid": {"preset": ["vcppo", "grpo"], "trainer.seed": [0, 1]},
                   "runs": [{"name": "lam1", "algorithm.lambda_actor": 1.0}]})
    assert [r["name"] for r in runs] == ["vcppo-seed0", "vcppo-seed1", "grpo-seed0", "grpo-seed1", "lam1"]
    assert "trainer.seed=1" in runs[1]["overrides"] and "trainer.total_steps=3" in runs[1]["overrides"]
    assert runs[4]["preset"] == "vcppo" and "algorithm.lambda_actor=1.0" in runs[4]["overrides"]
    assert all(f"trainer.run_name={r['name']}" in r["overrides"] for r in runs)


def test_sweep_typos_fail_before_running():
    with pytest.raises(ConfigError, match="algorithm.lamda_actor"):
        expand({"grid": {"algorithm.lamda_actor": [0.9]}})
    with pytest.raises(ConfigError, match="gird"):
        expand({"gird": {"trainer.seed": [0]}})
    with pytest.raises(ConfigError, match="collide"):
        expand({"runs": [{"name": "a"}, {"name": "a"}]})


def test_sweeps_ship_inside_the_package():
    """The sweeps the docs and launch/ablation.sh run by name live in vcppo/configs/sweeps/."""
    assert SWEEP_DIR == Path(sweep.__file__).resolve().parent / "configs" / "sweeps"
    assert {"ablation", "lambda_actor", "slow_critic"} <= set(shipped_sweeps())
    assert not (Path(__file__).resolve().parents[1] / "configs").exists()  # no stale top-level copy


@pytest.mark.parametrize("name", shipped_sweeps())
def test_shipped_sweeps_expand_with_three_seeds_per_setting(name):
    """Every sweep the docs cite validates against the schema and runs each setting on >= 3 seeds (a run of
    0 RL steps, which only pretrains a critic for the others to start from, is set-up, not a setting)."""
    runs = expand(load_sweep(name)[1])
    settings = {}
    for r in runs:
        if "trainer.total_steps=0" in r["overrides"]:
            continue
        seed = next((o for o in r["overrides"] if o.startswith("trainer.seed=")), None)
        rest = tuple(sorted(o for o in r["overrides"] if o != seed and not o.startswith("trainer.run_name=")))
        settings.setdefault((r["preset"], rest), set()).add(seed)
    assert all(len(seeds) >= 3 for seeds in settings.values()), settings


def test_sweep_resolves_a_bare_shipped_name_or_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_sweep("slow_critic") == SWEEP_DIR / "slow_critic.yaml"
    own = tmp_path / "mine.yaml"
    own.write_text(yaml.safe_dump({"runs": [{"name": "a"}]}))
    assert resolve_sweep(str(own)) == own and resolve_sweep("mine.yaml") == Path("mine.yaml")
    assert load_sweep("mine.yaml")[1] == {"runs": [{"name": "a"}]}
    # A file in the working directory named like a shipped sweep is that file, not the shipped one.
    (tmp_path / "ablation").write_text(yaml.safe_dump({"runs": [{"name": "local"}]}))
    assert resolve_sweep("ablation") == Path("ablation")


def test_unknown_sweep_names_the_shipped_ones_and_suggests(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"shipped sweep named 'slow_critc'.*ablation.*did you mean 'slow_critic'"):
        resolve_sweep("slow_critc")
    # The old in-repo path: a missing file, with the shipped name it meant.
    with pytest.raises(ConfigError, match=r"no such sweep file: configs/sweeps/ablation.yaml.*did you mean 'ablation'"):
        resolve_sweep("configs/sweeps/ablation.yaml")
    with pytest.raises(ConfigError, match="no sweep file or shipped sweep named 'zzz'") as e:
        resolve_sweep("zzz")
    assert "did you mean" not in str(e.value)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_sweep("list.yaml")


def test_sweep_cli_dry_run_by_name_and_unknown_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert sweep_cli.main(["slow_critic", "--dry-run", "--launcher", "vcppo"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 6 and all(l.startswith("vcppo train ") for l in lines)
    assert "trainer.run_name=vcppo-seed0" in lines[1]
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
    assert sweep_cli.main(["slow_critc", "--dry-run"]) == 2
    assert "did you mean 'slow_critic'" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.slow
def test_grid_runs_collects_rows_groups_seeds_and_skips_finished_runs(tiny_artifacts, tmp_path):
    """A grid of two runs (one setting x two seeds; the grid's product is expanded and checked
    without engines above, so two real runs cover what four did at half the time)."""
    art = tiny_artifacts
    sweep = {
        "name": "grid", "output_root": str(tmp_path / "runs"), "preset": "grpo",
        "overrides": [f"model.policy_path={art / 'tiny'}", f"data.train_files={art / 'data/train.parquet'}",
                      f"data.val_files={art / 'data/val.parquet'}", "trainer.total_steps=1",
                      "trainer.prompts_per_step=2", "rollout.max_response_tokens=32", "trainer.val_max_prompts=2",
                      "trainer.val_n_samples=2", "trainer.val_k=[1,2]", "logging.wandb=false",
                      "logging.progress_bar=false", "rollout.engine=hf"],  # the sweep's path, not vLLM's start-up
        "grid": {"rollout.n_samples_per_prompt": [2], "trainer.seed": [0, 1]},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    res = vcppo("sweep", path, cwd=tmp_path, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "runs" / "sweep_results.csv")))
    assert len(rows) == 2 and all(r["finished"] == "True" for r in rows)
    assert {r["name"] for r in rows} == {"grpo-nsamplesperprompt2-seed0", "grpo-nsamplesperprompt2-seed1"}
    assert all(r["final_pass@1_greedy"] != "" for r in rows)
    per_run, per_group = (tmp_path / "runs" / "sweep_results.md").read_text().strip().split("\n\n")
    assert len(per_run.splitlines()) == 2 + 2
    # Seeds grouped: the configuration's mean +- std over its 2 seeds.
    groups = per_group.splitlines()[2:]
    assert [g.split(" | ")[0].strip("| ") for g in groups] == ["grpo-nsamplesperprompt2"]
    assert all(" | 2 | " in g and "±" in g for g in groups)
    # Re-running skips the finished runs.
    again = vcppo("sweep", path, cwd=tmp_path, timeout=120, check=False)
    assert again.returncode == 0 and again.stdout.count("finished, skipped") == 2
