"""scripts/guess_headroom.py: the oracle critic's explained variance on `guess` (docs/results.md)."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "guess_headroom.py"


def _module():
    spec = importlib.util.spec_from_file_location("guess_headroom", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_oracle_value_and_its_headroom():
    mod = _module()
    v = mod.oracle(16, 1.0)  # pure bisection: 15 of 16 numbers within 4 turns
    assert v(1, 16, 4) == pytest.approx(15 / 16) and v(5, 5, 1) == 1.0 and v(1, 2, 0) == 0.0
    out = mod.headroom(episodes=3000)
    assert 0.6 < out["found_rate"] < 0.8 and 0.05 < out["oracle_ev"] < 0.35
    assert mod.headroom(midpoint=1.0, episodes=2000)["found_rate"] > 0.9
