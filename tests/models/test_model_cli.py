"""`vcppo model make` through the real dispatcher."""
import json

import pytest

from vcppo.cli import main


def test_model_make_cli(tmp_path, capsys):
    assert main(["model", "make", "--size", "tiny", "--out", str(tmp_path / "m")]) == 0
    assert "tiny" in capsys.readouterr().out
    assert (tmp_path / "m" / "config.json").exists() and (tmp_path / "m" / "tokenizer.json").exists()


@pytest.mark.parametrize("flag,tied", [([], True), (["--untied"], False)])
def test_model_make_tied_or_untied(tmp_path, capsys, flag, tied):
    assert main(["model", "make", "--size", "tiny", "--out", str(tmp_path / "m"), *flag]) == 0
    assert ("untied embeddings" if not tied else "tied embeddings") in capsys.readouterr().out
    assert json.loads((tmp_path / "m" / "config.json").read_text())["tie_word_embeddings"] is tied
    assert main(["model", "info", str(tmp_path / "m")]) == 0
    assert f"embeddings={'tied' if tied else 'untied'}" in capsys.readouterr().out
