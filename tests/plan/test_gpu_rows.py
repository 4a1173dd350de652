"""`vcppo plan` against what one H100 80GB did: the five engine probes of the `vcppo` preset on the
Qwen2.5-0.5B shape, bf16, one rank (the JSON files in tests/plan/data/ are the probe's own output,
`plan_stdout_tail` holding the planner's printout of the time; docs/scaling.md has the table).

With ``logprob_chunk_size=0`` (the path those runs took: every response token's full-vocabulary
logits) each row's verdict must be what the GPU did: ran, or ran out of memory. The rows whose verdict
the chunked path changes are printed (`pytest -rP`) and pinned. The step's training time, planned
by the pass model (vcppo.plan.timing), is held to the updates the GPU timed."""
import json
from pathlib import Path

import pytest

from vcppo.config.load import load_config
from vcppo.plan.advise import Cluster, Shapes, plan_run
from vcppo.plan.hardware import HARDWARE, GiB
from vcppo.models.shapes import ModelShape

DATA = Path(__file__).parent / "data"
ROWS = ["vcppo", "long", "longckpt", "longfit", "longpacked"]


def probe(name: str) -> dict:
    return json.loads((DATA / f"engines_{name}.json").read_text())


def plan_for(row: dict, chunk: int):
    overrides = [o for o in row["overrides"] if not o.startswith("model.policy_path=")]
    cfg = load_config("vcppo", overrides + [f"actor.logprob_chunk_size={chunk}"])
    shape = ModelShape(**row["plan"]["shapes"]["policy"])
    return plan_run(cfg, Shapes(shape, shape, shape), Cluster(HARDWARE["h100"], gpus_per_node=1, nodes=1))


def ran(row: dict) -> bool:
    """Every phase ran (no OutOfMemoryError in the probe's errors)."""
    assert all("OutOfMemoryError" in e for e in row["errors"].values()), row["errors"].keys()
    return not row["errors"]


def peak_gib(row: dict) -> float:
    return max(p["peak_alloc_gib"] for p in row["phases"].values())


@pytest.mark.parametrize("name", ROWS)
def test_full_logits_verdict_is_what_the_gpu_did(name):
    row = probe(name)
    plan = plan_for(row, chunk=0)
    train = plan.checks[0]
    verdict = "fits" if plan.fits else "does not fit"
    print(f"{name}: GPU {'ran' if ran(row) else 'OOM'} (peak allocated {peak_gib(row):.1f} GiB); plan needs "
          f"{train.need_bytes / GiB:.1f} of {train.usable_bytes / GiB:.1f} GiB: {verdict}")
    assert plan.fits == ran(row)
    if ran(row):  # the memory figure itself: within 10% of the peak torch allocated
        assert train.need_bytes / GiB == pytest.approx(peak_gib(row), rel=0.10)


def test_the_chunked_path_changes_one_verdict():
    """On with its default chunk (1,024 rows), only `longckpt` (checkpointing, 16 sequences of 4,608
    tokens a micro-batch) turns from does-not-fit to fits: its actor's 93 GiB of logits become a
    2.5 GiB chunk working set. `long` still does not fit (the critic's layers without checkpointing);
    the rows that fitted fit with less."""
    changed = {}
    for name in ROWS:
        row = probe(name)
        full, chunked = plan_for(row, 0), plan_for(row, 1024)
        need = [p.checks[0].need_bytes / GiB for p in (full, chunked)]
        print(f"{name}: training need {need[0]:.1f} -> {need[1]:.1f} GiB with the chunked path; "
              f"{'fits' if full.fits else 'no'} -> {'fits' if chunked.fits else 'no'}")
        assert chunked.checks[0].need_bytes < full.checks[0].need_bytes
        if chunked.fits != full.fits:
            changed[name] = chunked.fits
    assert changed == {"longckpt": True}


@pytest.mark.parametrize("name", ["vcppo", "longfit", "longpacked"])
def test_planned_training_time_is_the_updates_the_gpu_timed(name):
    """The `vcppo` preset makes one optimizer step per update, so its step runs no forward passes of
    their own (pi_old and V_old come from the updates): the planned training time is the actor's and
    the critic's update, which the probe timed. Within 25% (the old constant 35% MFU planned 0.47 s
    for the `vcppo` row's 1.62 s)."""
    row = probe(name)
    plan = plan_for(row, chunk=0)
    measured = row["phases"]["actor_update"]["median_s"] + row["phases"]["critic_update"]["median_s"]
    print(f"{name}: planned {plan.time.training_s:.2f} s at {plan.time.training_mfu:.1%} MFU, GPU {measured:.2f} s")
    assert plan.time.training_s == pytest.approx(measured, rel=0.25)
