"""`vcppo bench gae`: `make bench` on a clean clone (`runs/` does not exist yet; the reference loop is
timed like the fused calls, or its median is inflated); each row names what impl="auto" picks and
flags a faster implementation; on CUDA the chunked-scan Triton kernel is timed (its branch run here
under the Triton CPU interpreter)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from vcppo.algos import gae as gae_module
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


def test_row_names_autos_pick_and_flags_a_faster_one(tmp_path, monkeypatch, capsys):
    """Each row says what impl="auto" picks (the rule of `vcppo.algos.gae.auto_impl`) and whether
    another implementation beat it; a beaten pick prints a WARNING line."""
    gae_bench.main(["--shapes", "3x24", "--repeats", "1", "--device", "cpu", "--json", str(tmp_path / "a.json")])
    (row,) = json.loads((tmp_path / "a.json").read_text())["results"]
    assert row["fused_impl"] == row["fastest_impl"] == "torch" and row["auto_is_fastest"] is True
    assert "triton_chunk" not in row  # the interpreter is not timed
    # Make auto pick the Python loop next to the torch scan: the scan is faster, so it is flagged.
    monkeypatch.setattr(gae_bench, "_impls", lambda device: ["torch", "reference"])
    monkeypatch.setattr(gae_bench, "auto_impl", lambda device: "reference")
    capsys.readouterr()
    gae_bench.main(["--shapes", "3x64", "--repeats", "3", "--device", "cpu", "--json", str(tmp_path / "b.json")])
    (row,) = json.loads((tmp_path / "b.json").read_text())["results"]
    assert row["fused_impl"] == "reference" and row["fastest_impl"] == "torch" and row["auto_is_fastest"] is False
    assert "WARNING 3x64: impl='auto' picks reference, but torch was faster" in capsys.readouterr().out


def test_cuda_times_the_triton_kernel(monkeypatch):
    """On CUDA the bench times the chunked-scan kernel next to the torch scan, and auto picks it."""
    monkeypatch.setattr(gae_bench, "triton_available", lambda: True)
    monkeypatch.setattr(gae_module, "triton_available", lambda: True)
    assert gae_bench._impls(torch.device("cuda")) == ["torch", "triton"]
    assert gae_bench._impls(torch.device("cpu")) == ["torch"]
    assert gae_module.auto_impl("cuda") == "triton" and gae_module.auto_impl("cpu") == "torch"


_TRITON_BENCH = """
import json, sys
from vcppo.bench import gae as gae_bench
gae_bench._impls = lambda device: ["torch", "triton"]   # time the kernel under its CPU interpreter
assert gae_bench.main(["--shapes", "2x20", "--repeats", "1", "--device", "cpu", "--triton-chunks", "8,16",
                       "--json", sys.argv[1]]) == 0
"""


def test_triton_row_and_chunk_sweep_under_the_interpreter(tmp_path):
    """The CUDA-only branch of the bench (the kernel's row, its chunk, the --triton-chunks sweep),
    run on CPU with TRITON_INTERPRET=1 in a fresh interpreter (it must be set before triton loads)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    out = tmp_path / "t.json"
    proc = subprocess.run([sys.executable, "-c", _TRITON_BENCH, str(out)], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["results"]
    assert row["fused_triton"]["runs"] == 1 and row["triton_chunk"] == {"chunk": 256, "chunks_per_row": 1}
    assert set(row["triton_chunk_sweep"]) == {"8", "16"}
    assert "triton " in proc.stdout and "(1 chunk(s) of 256)" in proc.stdout and "c=8" in proc.stdout
