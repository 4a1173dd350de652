"""`vcppo sft`, `vcppo rm` and `vcppo eval`: bad input named before any engine starts. The commands
themselves run with the real engines as stages of the demo (tests/test_demo.py)."""
import pytest

from tests.conftest import vcppo

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_eval_refuses_a_k_above_its_samples(tiny_artifacts, tmp_path):
    art = tiny_artifacts
    bad = vcppo("eval", f"eval.model_path={art / 'tiny'}", f"eval.data_files={art / 'data/test.parquet'}",
                "eval.n_samples=2", "eval.k=[4]", cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "eval.k" in bad.stderr


@pytest.mark.parametrize("command,override,needle", [
    ("sft", "sft.init_model=/nope/model", "sft.init_model"),
    ("sft", "sft.stpes=3", "sft.steps"),
    ("rm", "data.train_files=/nope.parquet", "data.train_files"),
    ("eval", "eval.data_files=/nope.parquet", "eval.data_files"),
    ("demo", "demo.modle_size=tiny", "demo.model_size"),
])
def test_every_command_names_the_bad_key_before_starting(command, override, needle, tiny_artifacts, tmp_path):
    art = tiny_artifacts
    paths = [f"sft.init_model={art / 'tiny'}", f"rm.policy_path={art / 'tiny'}", f"rm.output_dir={tmp_path / 'rm'}",
             f"eval.model_path={art / 'tiny'}", f"eval.data_files={art / 'data/test.parquet'}",
             f"data.train_files={art / 'data/train.parquet'}", f"demo.workdir={tmp_path / 'w'}"]
    res = vcppo(command, *paths, override, cwd=tmp_path, check=False, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert needle in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "rm").exists() and not (tmp_path / "w").exists()
