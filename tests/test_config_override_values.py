"""Any ``key=value`` on the command line of train / plan / eval / sft is either taken or refused in one
line with exit 2 (config.parse_overrides): never a traceback, whatever the value holds."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vcppo import cli
from vcppo.config.load import all_keys, load_config

NOT_YAML = ["trainer.val_k=[1,2", "actor.lr={a", "trainer.run_name=@x", "model.policy_path=@main",
            "trainer.run_name=`x", "actor.lr=%x", "trainer.run_name=a: b: c", "actor.lr=\t!!python/name:os.system"]


@pytest.mark.parametrize("item", NOT_YAML)
def test_a_value_that_is_not_yaml_is_named_with_its_key(item):
    key, _, value = item.partition("=")
    with pytest.raises(cli.ConfigError) as err:
        load_config("vcppo", [item])
    message = str(err.value)
    assert f"config key '{key}'" in message and repr(value) in message and "\n" not in message


@pytest.fixture
def commands(monkeypatch, tmp_path):
    """The commands as the CLI runs them, with the work itself (training, evaluating) replaced: only
    how the command line is read is under test. Offline, in an empty directory."""
    import vcppo.commands.evaluate as evaluate
    import vcppo.commands.sft as sft
    import vcppo.commands.train as train
    monkeypatch.setattr(train, "train", lambda cfg: None)
    monkeypatch.setattr(sft, "run_sft", lambda cfg: None)
    monkeypatch.setattr(evaluate, "evaluate_policy", lambda cfg: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)


KEYS = st.one_of(st.sampled_from(all_keys()), st.text(max_size=12))
VALUES = st.text(st.characters(exclude_categories=("Cs",)), max_size=24)
ARGV = {"train": ["vcppo"], "plan": ["vcppo"], "eval": ["base"], "sft": ["base"]}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(ARGV)), key=KEYS, value=VALUES)
def test_no_override_ever_gives_a_traceback(commands, capsys, command, key, value):
    argv = [command, *ARGV[command], f"{key}={value}"]
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own usage error (plan reads '-x' as an option)
        code = e.code
    err = capsys.readouterr().err
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err
    if code == 2 and not err.startswith("usage:"):
        assert err.startswith(f"vcppo {command}: "), (argv, err)
