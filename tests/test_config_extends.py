"""``extends:`` in a user's own YAML file: a shipped preset's name (with or without .yaml), a path
relative to the file, or an absolute path, in that order; chains across them; a missing parent is
"not found" with the paths tried; a cycle is an error. For `vcppo train` (its config loader) and
`vcppo plan` alike, and the README's example."""
import logging

import pytest

from vcppo.cli import main as cli_main
from vcppo.commands import plan as plan_cmd
from vcppo.config.load import CONFIG_DIR, load_config
from vcppo.preflight import load_command_config
from vcppo.config.extends import extends_candidates
from vcppo.errors import ConfigError


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["vcppo", "vcppo.yaml"])
def test_a_user_file_extends_a_shipped_preset_by_name(tmp_path, name):
    mine = _write(tmp_path / "elsewhere" / "mine.yaml", f"extends: {name}\nalgorithm:\n  lambda_actor: 0.5\n")
    cfg = load_config(str(mine))
    preset = load_config("vcppo")
    assert cfg.algorithm.lambda_actor == 0.5
    assert cfg.actor.lr == preset.actor.lr and cfg.algorithm.lambda_critic == preset.algorithm.lambda_critic


def test_relative_and_absolute_paths(tmp_path):
    _write(tmp_path / "common" / "shared.yaml", "extends: vcppo\nactor:\n  lr: 3.0e-6\n")
    rel = _write(tmp_path / "exp" / "rel.yaml", "extends: ../common/shared.yaml\ncritic:\n  lr: 4.0e-6\n")
    cfg = load_config(str(rel))
    assert (cfg.actor.lr, cfg.critic.lr) == (3e-6, 4e-6)
    absolute = _write(tmp_path / "abs.yaml", f"extends: {tmp_path / 'common' / 'shared.yaml'}\n")
    assert load_config(str(absolute)).actor.lr == 3e-6


def test_a_chain_of_user_files_and_presets(tmp_path):
    _write(tmp_path / "a.yaml", "extends: grpo.yaml\ntrainer:\n  total_steps: 7\n")
    _write(tmp_path / "b.yaml", "extends: ./a.yaml\ntrainer:\n  prompts_per_step: 8\n")
    c = _write(tmp_path / "sub" / "c.yaml", "extends: ../b.yaml\ntrainer:\n  seed: 3\n")
    cfg = load_config(str(c))
    assert cfg.algorithm.advantage_estimator == "grpo"
    assert (cfg.trainer.total_steps, cfg.trainer.prompts_per_step, cfg.trainer.seed) == (7, 8, 3)
    assert cfg.preset == "c"  # the run is named after the file given (c-seed3)


def test_a_bare_name_is_the_preset_first_and_a_dotted_path_the_users_file(tmp_path):
    _write(tmp_path / "vcppo.yaml", "trainer:\n  total_steps: 5\n")  # a user's file named like a preset
    first = _write(tmp_path / "x.yaml", "extends: vcppo\n")
    assert load_config(str(first)).trainer.total_steps == load_config("vcppo").trainer.total_steps
    beside = _write(tmp_path / "y.yaml", "extends: ./vcppo.yaml\n")
    assert load_config(str(beside)).trainer.total_steps == 5
    assert extends_candidates("vcppo", first, CONFIG_DIR) == [CONFIG_DIR / "vcppo.yaml", tmp_path / "vcppo"]


def test_a_missing_parent_is_not_found_with_the_paths_tried(tmp_path):
    mine = _write(tmp_path / "mine.yaml", "extends: vcpo\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(mine))
    msg = str(e.value)
    assert "not found" in msg and "not valid YAML" not in msg
    assert str(CONFIG_DIR / "vcpo.yaml") in msg and str(tmp_path / "vcpo") in msg and "vcppo" in msg
    broken = _write(tmp_path / "broken.yaml", "extends: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(broken))


def test_a_cycle_is_an_error(tmp_path):
    _write(tmp_path / "a.yaml", "extends: ./b.yaml\n")
    b = _write(tmp_path / "b.yaml", "extends: ./a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(str(b))
    own = _write(tmp_path / "self.yaml", "extends: ./self.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(str(own))


def test_vcppo_train_loads_a_file_that_extends_a_preset(tmp_path):
    """The train command's loader (paths checked too): the file's preset settings and paths apply."""
    (tmp_path / "policy").mkdir()
    (tmp_path / "train.jsonl").write_text("")
    mine = _write(tmp_path / "mine.yaml", f"extends: vcppo\nmodel:\n  policy_path: {tmp_path / 'policy'}\n"
                  f"data:\n  train_files: {tmp_path / 'train.jsonl'}\n  val_files: null\ntrainer:\n  output_root: {tmp_path / 'runs'}\n")
    cfg = load_command_config([str(mine), "algorithm.lambda_actor=0.9"], "train", default_config=None)
    assert cfg.algorithm.lambda_actor == 0.9 and cfg.model.policy_path == str(tmp_path / "policy")
    assert cfg.actor.lr == load_config("vcppo").actor.lr


def test_vcppo_train_names_a_missing_parent_in_one_line(tmp_path, capsys):
    mine = _write(tmp_path / "mine.yaml", "extends: nope\n")
    assert cli_main(["train", str(mine)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'extends: nope' not found" in err


def test_vcppo_plan_reads_a_file_that_extends_a_preset(tmp_path, capsys):
    mine = _write(tmp_path / "mine.yaml", "extends: vcppo.yaml\nrollout:\n  max_response_tokens: 1024\n")
    assert plan_cmd.main([str(mine), "--model-shape", "qwen2.5-0.5b", "--gpus-per-node", "1"]) == 0
    assert "GiB" in capsys.readouterr().out


def test_the_readme_example(tmp_path):
    """README: CONFIG is a preset or your own YAML file (`extends:` a preset)."""
    readme = (CONFIG_DIR.parents[1] / "README.md").read_text()
    assert "(`extends: vcppo`" in readme
    mine = _write(tmp_path / "my_run.yaml", "extends: vcppo\ntrainer:\n  total_steps: 50\n")
    assert load_config(str(mine), ["actor.lr=2e-6"]).trainer.total_steps == 50


def test_extends_a_file_that_is_not_a_config_is_refused_without_echoing_it(tmp_path):
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
    child = tmp_path / "exp.yaml"
    child.write_text(f"extends: {secret}\n")
    with pytest.raises(ConfigError) as err:
        load_config(child)
    assert f"config file {secret} is not a vcppo config" in str(err.value) and "root:x" not in str(err.value)
    secret.write_text("token: [abc123\nmore: secret-value\n")  # not YAML at all: the line, not its text
    with pytest.raises(ConfigError) as err:
        load_config(child)
    assert "is not valid YAML" in str(err.value) and "abc123" not in str(err.value)


def test_a_same_named_file_beside_the_child_is_named_when_the_preset_is_taken(tmp_path, caplog):
    (tmp_path / "base.yaml").write_text("trainer:\n  seed: 3\n")
    child = tmp_path / "exp.yaml"
    child.write_text("extends: base.yaml\n")
    with caplog.at_level(logging.WARNING, logger="vcppo.config.extends"):
        cfg = load_config(child)
    assert cfg.trainer.seed == 0  # the shipped preset, as documented
    (line,) = [r.getMessage() for r in caplog.records]
    assert "reads the shipped preset base" in line and str(tmp_path / "base.yaml") in line and "./base.yaml" in line
    child.write_text("extends: ./base.yaml\n")
    assert load_config(child).trainer.seed == 3
