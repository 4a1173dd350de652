"""Checkpoint integrity: a manifest of sizes and SHA-256 sums; resume skips a truncated,
deleted or changed checkpoint for the previous intact one; kill -9 at any moment of a checkpoint
write or cleanup leaves only intact checkpoints and cleanable debris."""
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from vcppo.driver.durability import checkpoint as ckpt
from vcppo.driver.durability import manifest

SHARD = "actor/ds/zero_pp_rank_0_mp_rank_00_optim_states.pt"


def _checkpoint(run_dir, step, keep_last=3, shard_bytes=4096):
    stage = ckpt.staging_dir(run_dir, step)
    ckpt.write_rank_files(stage, rank=0)
    (stage / SHARD).parent.mkdir(parents=True, exist_ok=True)
    (stage / SHARD).write_bytes(os.urandom(shard_bytes))
    torch.save({"w": torch.ones(3)}, stage / "critic.pt")
    return ckpt.commit(stage, {"phase": "ppo", "step": step}, keep_last=keep_last)


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    final = _checkpoint(tmp_path, 1)
    files = json.loads((final / "manifest.json").read_text())["files"]
    assert set(files) == {SHARD, "critic.pt", "rng_rank0.json", "state.json"}
    for rel, entry in files.items():
        assert entry["size"] == (final / rel).stat().st_size
        assert entry["sha256"] == manifest.sha256_of(final / rel)
    assert ckpt.checkpoint_problems(final) == []


@pytest.mark.parametrize("damage,reported", [
    (lambda f: f.write_bytes(f.read_bytes()[:1000]), "has 1000 bytes, the manifest says 4096 (truncated?)"),
    (lambda f: f.unlink(), "is missing"),
    (lambda f: f.write_bytes(b"\0" * 4096), "does not match its checksum"),    # bit rot: same size
])
def test_a_damaged_checkpoint_is_reported_and_skipped_for_the_previous_one(tmp_path, caplog, damage, reported):
    _checkpoint(tmp_path, 1)
    newest = _checkpoint(tmp_path, 2)
    assert ckpt.find_resume_point(tmp_path, "auto") == newest
    damage(newest / SHARD)
    with caplog.at_level(logging.WARNING, logger="vcppo.driver.durability.checkpoint"):
        assert ckpt.find_resume_point(tmp_path, "auto").name == "step_000001"
    assert f"checkpoint {newest} is damaged" in caplog.text and reported in caplog.text
    with pytest.raises(ckpt.CheckpointError, match=f"{newest} is damaged.*{reported[:20]}"):
        ckpt.find_resume_point(tmp_path, str(newest))    # asked for by path: an error, not a fallback


def test_all_checkpoints_damaged_is_an_error_not_a_silent_fresh_start(tmp_path):
    for step in (1, 2):
        (_checkpoint(tmp_path, step) / SHARD).unlink()
    with pytest.raises(ckpt.CheckpointError, match="every checkpoint of .* is damaged.*trainer.resume=never"):
        ckpt.find_resume_point(tmp_path, "auto")


def test_a_deleted_manifest_or_state_makes_a_checkpoint_incomplete_and_cleanable(tmp_path):
    _checkpoint(tmp_path, 1)
    (_checkpoint(tmp_path, 2) / "manifest.json").unlink()
    half_deleted = _checkpoint(tmp_path, 3)      # what a kill mid-rmtree used to leave: shards, no state
    for name in ("manifest.json", "state.json"):
        (half_deleted / name).unlink()
    root = ckpt.checkpoint_root(tmp_path)
    (root / "step_000000.deleting").mkdir()
    assert [p.name for p in ckpt.list_complete(root)] == ["step_000001"]
    assert ckpt.find_resume_point(tmp_path, "auto").name == "step_000001"
    ckpt.clean_partial(root)
    assert sorted(p.name for p in root.iterdir()) == ["step_000001"]


def test_a_checkpoint_from_before_manifests_still_resumes(tmp_path, caplog):
    stage = ckpt.staging_dir(tmp_path, 5)
    stage.mkdir(parents=True)
    torch.save(ckpt.rng_state(), stage / "rng_rank0.pt")  # the old format: pickled RNG, no manifest
    (stage / "state.json").write_text(json.dumps({"phase": "ppo", "step": 5}))
    os.replace(stage, stage.with_suffix(""))
    with caplog.at_level(logging.WARNING, logger="vcppo.driver.durability.checkpoint"):
        assert ckpt.find_resume_point(tmp_path, "auto").name == "step_000005"
    assert "predates checkpoint manifests" in caplog.text


def test_ranks_share_the_hashing_and_every_rank_sees_the_verdict(tmp_path):
    final = _checkpoint(tmp_path, 1)
    shares = [manifest.hash_share(final, r, 2) for r in (0, 1)]
    assert not set(shares[0]) & set(shares[1])
    whole = {k: v for k, v in manifest.hash_share(final, 0, 1).items() if k != "manifest.json"}
    assert {**shares[0], **shares[1]} == whole
    files = sorted(manifest.read_manifest(final))
    victim = files[1]                                          # hashed by rank 1 only
    data = bytearray((final / victim).read_bytes())
    data[0] ^= 0xFF
    (final / victim).write_bytes(bytes(data))
    assert manifest.problems(final, 0, 2) == [] and manifest.problems(final, 1, 2)
    verdicts = [manifest.problems(final, r, 2) for r in (0, 1)]
    gather = lambda mine: verdicts                             # what all_gather_object returns
    assert ckpt.checkpoint_problems(final, 0, 2, gather) == [f"{victim} does not match its checksum (damaged on disk)"]


WRITER = textwrap.dedent('''
    import os, sys
    from pathlib import Path
    from vcppo.driver.durability import checkpoint as ckpt
    run, step = Path(sys.argv[1]), 0
    while True:
        step += 1
        stage = ckpt.staging_dir(run, step)
        ckpt.write_rank_files(stage, 0)
        (stage / "actor").mkdir(parents=True, exist_ok=True)
        for i in range(3):
            with open(stage / "actor" / f"shard{i}.pt", "wb") as f:
                for _ in range(6):
                    f.write(os.urandom(256 << 10))
        ckpt.commit(stage, {"phase": "ppo", "step": step}, keep_last=2)
        print(step, flush=True)
''')


# Each offset is a fresh interpreter importing torch (~5 s); `make test` kills at three of them (the
# crash-at-every-line test below reaches each line of sealing and pruning in this process), `make
# test-extended` at the other five.
KILL_DELAYS_S = [0.0, 0.08, 0.4]
MORE_KILL_DELAYS_S = [0.03, 0.15, 0.25, 0.6, 0.9]


@pytest.mark.parametrize("delay_s", KILL_DELAYS_S + [pytest.param(d, marks=pytest.mark.extended)
                                                     for d in MORE_KILL_DELAYS_S])
def test_kill_9_during_checkpoint_writes_leaves_only_intact_checkpoints(tmp_path, delay_s):
    """Checkpoints of 4.5 MiB are written back to back (keep_last=2, so cleanup runs too); the
    writer is killed at an offset after its first checkpoint, somewhere in a write, a manifest,
    a rename or a deletion."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    child = subprocess.Popen([sys.executable, str(script), str(run)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "1"  # one sealed checkpoint exists
        time.sleep(delay_s)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    root = ckpt.checkpoint_root(run)
    complete = ckpt.list_complete(root)
    assert complete and all(ckpt.checkpoint_problems(p) == [] for p in complete), complete
    assert ckpt.find_resume_point(run, "auto") == complete[-1]
    ckpt.clean_partial(root)
    assert sorted(p.name for p in root.iterdir()) == [p.name for p in complete]


class _Crash(BaseException):
    """Stands for a kill: nothing after it runs (not an Exception, so no handler catches it)."""


def _crash_at_line(k: int):
    """A trace function that raises _Crash at the k-th line executed in the checkpoint modules."""
    watched = {ckpt.__file__, manifest.__file__}
    seen = [0]

    def local(frame, event, arg):
        if event == "line":
            seen[0] += 1
            if seen[0] == k:
                raise _Crash
        return local

    return lambda frame, event, arg: local if frame.f_code.co_filename in watched else None


def test_a_crash_at_every_line_of_sealing_and_pruning_leaves_only_intact_checkpoints(tmp_path):
    """Deterministic complement of the kill -9 test: the commit of step 3 (state, manifest, rename,
    pruning step 1) is interrupted after each of its lines in turn."""
    k = 0
    while True:
        k += 1
        run = tmp_path / f"run{k}"
        for step in (1, 2):
            _checkpoint(run, step, keep_last=2)
        stage = ckpt.staging_dir(run, 3)
        ckpt.write_rank_files(stage, rank=0)
        (stage / SHARD).parent.mkdir(parents=True)
        (stage / SHARD).write_bytes(os.urandom(4096))
        sys.settrace(_crash_at_line(k))
        try:
            ckpt.commit(stage, {"phase": "ppo", "step": 3}, keep_last=2)
            finished = True
        except _Crash:
            finished = False
        finally:
            sys.settrace(None)
        root = ckpt.checkpoint_root(run)
        complete = ckpt.list_complete(root)
        assert all(ckpt.checkpoint_problems(p) == [] for p in complete), (k, complete)
        assert ckpt.find_resume_point(run, "auto").name in ("step_000002", "step_000003"), k
        ckpt.clean_partial(root)
        assert sorted(p.name for p in root.iterdir()) == [p.name for p in complete], k
        if finished:
            break
    assert k > 20 and [p.name for p in ckpt.list_complete(ckpt.checkpoint_root(run))] == ["step_000002",
                                                                                         "step_000003"]


def test_a_run_state_counts_the_steps_of_its_own_phase():
    from vcppo.driver.state import Phase, RunState
    assert RunState(phase=Phase.VALUE_PRETRAIN, step=0, pretrain_step=7).phase_step == 7
    assert RunState(phase="ppo", step=3, pretrain_step=7).phase_step == 3  # a checkpoint's text too
