"""A rank killed at a named point of a 2-rank run, on every preset's path, then the same command.

Two `vcppo train` ranks started by hand (RANK / WORLD_SIZE / MASTER_PORT: no launcher, so nothing
but our own code ends the survivor), gloo, ZeRO-3, one thread each. One rank SIGKILLs itself at a
point of PPO step 2 (tests/kill_at.py: sampling, the actor update, mid checkpoint write, sealing).
Then:
  * the other rank exits non-zero within a minute (its next collective fails: the peer's
    connection closed), with no final export;
  * every checkpoint left is intact and the last one is step 1's (a half-written one is a
    staging directory, never resumed from);
  * rerunning the same command on 2 ranks resumes from it and logs, record for record, what an
    uninterrupted 2-rank run of the same command logged.
The `vcppo` case also samples with DAPO dynamic sampling and weights the sampler with truncated IS,
whose state (the prompt stream's position, the rounds drawn) must survive the kill too.

`make test` runs the `vcppo` case; `make test-faults` runs all four (docs/robustness.md)."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ENV, start_ranks
from tests.driver.test_exact_resume_e2e import assert_same, records
from tests.driver.test_train_e2e import base_overrides, for_preset
from vcppo.runtime.launch_env import free_port
from vcppo.driver.durability import manifest
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete, peek_state

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
KILLED_STEP = 2
CASES = {  # preset: (the rank killed, where, what the preset's path adds)
    "vcppo": (1, "update", {"trainer.dynamic_sampling": True, "algorithm.rollout_is_cap": 2.0}),
    "ppo": (1, "rollout", {"model.critic_path": "{art}/rm_scored"}),  # the critic from a reward model
    "grpo": (1, "shards", {"rollout.n_samples_per_prompt": 4, "trainer.prompts_per_step": 2}),
    "vapo": (0, "seal", {"rollout.n_samples_per_prompt": 4, "trainer.prompts_per_step": 2}),
}


def args_for(preset, art, out):
    extra = {k: v.format(art=art) if isinstance(v, str) else v for k, v in CASES[preset][2].items()}
    return for_preset(preset, base_overrides(art, out, **{
        "trainer.total_steps": 3, "trainer.save_every": 1, "trainer.keep_last": 8, "rollout.temperature": 1.0,
        "rollout.max_response_tokens": 24, "value_pretrain.steps": 1, **extra}))


def start_two_ranks(cli_args, cwd, kill=None):
    """Both ranks of one run; ``kill`` = (rank, point): that rank dies there in PPO step 2."""
    module, args = ("tests.kill_at", [str(kill[0]), kill[1], str(KILLED_STEP), "--", *cli_args]) if kill \
        else ("vcppo.cli", cli_args)
    return start_ranks(*args, cwd=cwd, module=module, env=dict(ENV, OMP_NUM_THREADS="1"),
                       err=lambda r: cwd / f"rank{r}.{'killed' if kill else 'run'}.err")


def run_two_ranks(cli_args, cwd):
    procs = start_two_ranks(cli_args, cwd)
    codes = [p.wait(timeout=900) for p in procs]
    err = (cwd / "rank0.run.err").read_text()
    assert codes == [0, 0], err[-4000:]
    return err


@pytest.fixture(scope="module", params=[p if p == "vcppo" else pytest.param(p, marks=pytest.mark.faults)
                                         for p in CASES])
def uninterrupted(request, tiny_artifacts, tmp_path_factory):
    preset = request.param
    root = tmp_path_factory.mktemp(f"full_{preset}")
    run_two_ranks(["train", preset, *args_for(preset, tiny_artifacts, root)], root)
    return preset, records(root / f"{preset}-seed0")


def test_a_rank_killed_mid_step_ends_the_job_and_the_same_command_resumes_exactly(uninterrupted, tiny_artifacts,
                                                                                tmp_path):
    preset, full = uninterrupted
    rank, point, _ = CASES[preset]
    cli = ["train", preset, *args_for(preset, tiny_artifacts, tmp_path)]
    procs = start_two_ranks(cli, tmp_path, kill=(rank, point))
    try:
        killed = procs[rank].wait(timeout=900)
        died_at = time.time()
        survivor = procs[1 - rank].wait(timeout=120)
        waited = time.time() - died_at
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    survivor_err = (tmp_path / f"rank{1 - rank}.killed.err").read_text()
    assert killed == -9, (killed, (tmp_path / f"rank{rank}.killed.err").read_text()[-3000:])
    assert survivor != 0 and waited < 60, (survivor, waited, survivor_err[-3000:])
    print(f"{preset} ({point}, rank {rank} killed): the survivor exited {survivor}, {waited:.1f} s after")
    assert f"[vcppo] rank {1 - rank} stopped because another rank of the job died" in survivor_err.splitlines()[-1]
    run = tmp_path / f"{preset}-seed0"
    assert not (run / "final").exists()
    left = list_complete(checkpoint_root(run))
    assert left and all(manifest.problems(p, 0, 1) == [] for p in left)  # each one whole
    last = peek_state(left[-1])
    assert (last.phase, last.step) == ("ppo", KILLED_STEP - 1), left[-1]
    if point in ("shards", "seal"):  # the half-written checkpoint of step 2 is there, unsealed
        assert [p.name for p in checkpoint_root(run).iterdir() if p.name.endswith(".tmp")]

    err = run_two_ranks(cli, tmp_path)
    assert f"resuming from {left[-1]}" in err
    assert not [p for p in checkpoint_root(run).iterdir() if p.name.endswith(".tmp")]
    assert_same(records(run), full)
    assert json.loads((run / "final_metrics.json").read_text())


def launcher_command(launcher: str, port: str) -> list[str]:
    """The launcher's own command for 2 local ranks, up to the module it runs."""
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}", "-m"]
    return [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "2", "--master_port", port, "--module"]


@pytest.mark.faults
@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_each_launcher_ends_the_job_when_a_rank_dies(launcher, tiny_artifacts, tmp_path):
    """The same kill (rank 1, PPO step 2's actor update) under torchrun and the deepspeed launcher:
    the launcher exits non-zero soon after, with step 1's checkpoint the last and intact."""
    cmd = [*launcher_command(launcher, str(free_port())), "tests.kill_at", "1", "update", str(KILLED_STEP), "--",
           "train", "vcppo", *args_for("vcppo", tiny_artifacts, tmp_path)]
    env = dict(ENV, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    ended = time.time()
    died = float((tmp_path / "killed_at").read_text())
    assert res.returncode != 0 and ended - died < 60, (res.returncode, ended - died, res.stderr[-3000:])
    print(f"{launcher}: exit {res.returncode}, {ended - died:.1f} s after the kill")
    run = tmp_path / "vcppo-seed0"
    left = list_complete(checkpoint_root(run))
    assert peek_state(left[-1]).step == KILLED_STEP - 1 and manifest.problems(left[-1], 0, 1) == []
    assert not (run / "final").exists()
