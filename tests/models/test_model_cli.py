"""`vcppo model make` through the real dispatcher."""
from vcppo.cli import main


def test_model_make_cli(tmp_path, capsys):
    assert main(["model", "make", "--size", "tiny", "--out", str(tmp_path / "m")]) == 0
    assert "tiny" in capsys.readouterr().out
    assert (tmp_path / "m" / "config.json").exists() and (tmp_path / "m" / "tokenizer.json").exists()
