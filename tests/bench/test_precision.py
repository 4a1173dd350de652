"""`vcppo bench precision` on a tiny random model: every trainer runs for real, and a bf16 checkpoint's
masters (on the bf16 grid) move the policy less than masters seeded from the fp32 checkpoint."""
import json

import pytest

pytestmark = [pytest.mark.integration]


def test_precision_bench_shows_the_bf16_grid_stall(tmp_path):
    from vcppo.bench.precision import main
    out = tmp_path / "precision.json"
    assert main(["--size", "tiny", "--prompts", "4", "--n", "2", "--max-tokens", "16", "--epochs", "1",
                 "--lr", "1e-5", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert set(r["variants"]) == {"fp32", "bf16", "bf16-ckpt", "autocast"} and r["samples"] == 8
    dj = {v: rows[0]["dJ"] for v, rows in r["variants"].items()}
    assert dj["fp32"] > 0 and dj["autocast"] > 0
    # seeded masters follow fp32 closely; masters on the grid lose most of the first steps
    assert r["dJ_over_fp32"]["bf16"][0] > 0.6 and dj["bf16-ckpt"] < 0.6 * dj["bf16"]


def test_an_unknown_variant_is_one_line():
    from vcppo.bench.precision import main
    with pytest.raises(SystemExit, match="unknown --variants \\['bf17'\\]"):
        main(["--variants", "fp32,bf17"])
