"""`python -m tests.kill_at RANK POINT STEP -- train PRESET key=value ...`: the vcppo CLI, except that
the process with global rank RANK SIGKILLs itself at a named point of PPO step STEP (a real
SIGKILL: no handler, no flush, as the OOM killer or a lost node ends a process); STEP written
``value_pretrain:N`` names value-pretraining step N instead. Every other rank runs the plain CLI. It
runs under torchrun, `deepspeed --module`, or no launcher. The points, each reached from the
driver's own calls:

  rollout     the step's first vLLM generate call (its peer is sampling, or waiting in a collective)
  update      the actor's first optimizer step of the step (its peer waits in ZeRO-3's collectives)
  shards      the checkpoint after the step: this rank's engine shards written, before the manifest
              hashes are gathered (the directory is still a staging ``.tmp``)
  seal        the same checkpoint on the main rank: the manifest written, the rename not yet done
  full        not a kill: writing that checkpoint's manifest fails with ENOSPC, as on a full disk
              (the run then ends with its own error)

Test-only: it patches the driver's functions in this process before the CLI starts."""
from __future__ import annotations

import errno
import functools
import os
import signal
import sys
import time

MARK = "killed_at"  # written into the working directory just before the kill
POINTS = ("rollout", "update", "shards", "seal", "full")
_now: dict = {"step": None, "checkpoint": None}  # (phase, step) running / being checkpointed


def _die() -> None:
    with open(MARK, "w") as f:  # when it died, for the test to time the others' exit by
        f.write(f"{time.time()}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _tracking_step(rl_step):
    @functools.wraps(rl_step)
    def wrapped(ctx, source, plan, state, step):
        _now["step"] = (str(plan.phase), step)
        try:
            return rl_step(ctx, source, plan, state, step)
        finally:
            _now["step"] = None
    return wrapped


def _tracking_checkpoint(save):
    @functools.wraps(save)
    def wrapped(ctx, state, source):
        _now["checkpoint"] = (str(state.phase), state.phase_step)
        try:
            return save(ctx, state, source)
        finally:
            _now["checkpoint"] = None
    return wrapped


def _kill_before(fn, when):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if when():
            _die()
        return fn(*args, **kwargs)
    return wrapped


def _kill_after(fn, when):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        if when():
            _die()
        return out
    return wrapped


def _disk_full_after(fn, when):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        if when():
            raise OSError(errno.ENOSPC, "No space left on device")
        return out
    return wrapped


def parse_step(text: str) -> tuple[str, int]:
    """``N`` -> ("ppo", N); ``PHASE:N`` -> (PHASE, N)."""
    phase, _, n = text.rpartition(":")
    return phase or "ppo", int(n)


def install(point: str, step: tuple[str, int]) -> None:
    from vcppo.driver.durability import manifest
    from vcppo.driver import phases as loops
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.rollout import RolloutEngine

    loops.rl_step = _tracking_step(loops.rl_step)  # the phase loops' own names for them
    loops.save_checkpoint = _tracking_checkpoint(loops.save_checkpoint)
    if point == "rollout":
        RolloutEngine.generate = _kill_before(RolloutEngine.generate, lambda: _now["step"] == step)
    elif point == "update":
        ActorEngine.train_step = _kill_before(ActorEngine.train_step, lambda: _now["step"] == step)
    elif point == "shards":
        manifest.hash_share = _kill_before(manifest.hash_share, lambda: _now["checkpoint"] == step)
    elif point == "seal":
        manifest.write_manifest = _kill_after(manifest.write_manifest, lambda: _now["checkpoint"] == step)
    elif point == "full":
        manifest.write_manifest = _disk_full_after(manifest.write_manifest, lambda: _now["checkpoint"] == step)
    else:
        raise SystemExit(f"unknown point {point!r}: one of {', '.join(POINTS)}")


def main(argv: list[str]) -> None:
    argv = [a for a in argv if not a.startswith("--local_rank")]  # the deepspeed launcher's
    rank, point, step, sep, *cli = argv
    assert sep == "--", "usage: python -m tests.kill_at RANK POINT STEP -- <vcppo arguments>"
    if int(os.environ.get("RANK", "0")) == int(rank):
        install(point, parse_step(step))
    from vcppo.cli import entry
    sys.argv = ["vcppo", *cli]
    entry()


if __name__ == "__main__":
    main(sys.argv[1:])
