"""`make bench` on a clean clone: `runs/` does not exist yet, and the reference loop must be timed
like the fused calls (same warm-up, same number of runs), or its median is inflated."""
import json

from vcppo.bench import gae as gae_bench


def test_make_bench_command_from_a_clean_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs/ here, as in a fresh clone
    calls = []
    reference = gae_bench.gae_reference
    monkeypatch.setattr(gae_bench, "gae_reference", lambda *a, **k: calls.append(1) or reference(*a, **k))
    assert gae_bench.main(["--shapes", "4x16", "--repeats", "3", "--threads", "1", "--device", "cpu",
                           "--json", "runs/bench_gae.json"]) == 0
    (row,) = json.loads((tmp_path / "runs" / "bench_gae.json").read_text())["results"]
    assert row["ref_x2"]["runs"] == row["fused_torch"]["runs"] == 3
    assert len(calls) == 2 * (1 + 3)  # two lambdas x (one warm-up + three timed runs)
