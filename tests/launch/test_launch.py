"""The launch scripts on the CPU machine: the deepspeed launcher with 2 ranks (gloo) runs a short
`vcppo` preset end to end; the multi-node script runs from a localhost hostfile and as a dry run."""
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ENV
from tests.driver.test_train_e2e import for_preset
from vcppo.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]


def tiny_run_args(art: Path, out: Path) -> list[str]:
    return [f"model.policy_path={art / 'tiny'}", f"data.train_files={art / 'data/train.parquet'}",
            f"data.val_files={art / 'data/val.parquet'}", f"trainer.output_root={out}", "trainer.total_steps=2",
            "trainer.prompts_per_step=4", "rollout.n_samples_per_prompt=2", "rollout.max_response_tokens=32",
            "value_pretrain.steps=2", "trainer.val_max_prompts=4", "trainer.val_n_samples=2", "trainer.val_k=[1,2]",
            "trainer.save_every=1", "logging.progress_bar=false", "logging.wandb=false", "actor.micro_batch_size=2",
            "critic.micro_batch_size=2"]


@pytest.mark.integration
@pytest.mark.distributed
@pytest.mark.slow
def test_single_node_launcher_two_ranks_runs_vcppo(tiny_artifacts, tmp_path):
    env = dict(ENV, NUM_GPUS="2", MASTER_PORT="29731")
    # one step of each phase: the subject is the launcher starting both ranks of a run that trains,
    # gathers and checkpoints (later steps on 2 ranks: tests/driver/test_multirank_faults_e2e.py)
    args = tiny_run_args(tiny_artifacts, tmp_path) + ["trainer.total_steps=1", "value_pretrain.steps=1"]
    res = subprocess.run([str(REPO / "launch/single_node.sh"), "vcppo", *args],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    run = tmp_path / "vcppo-seed0"
    ppo = read_metrics(run, "ppo")
    assert [r["step"] for r in ppo] == [1]
    assert len(read_metrics(run, "value_pretrain")) == 1
    # 4 prompts x 2 samples over both ranks are in the metrics (gathered from each rank).
    assert all(r["perf/response_tokens"] > 0 for r in ppo)
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    assert (ckpt / "rng_rank0.json").exists() and (ckpt / "rng_rank1.json").exists()
    assert "terminate called" not in res.stderr


def test_multi_node_dry_run_prints_the_command_the_script_runs(tmp_path):
    """DRY_RUN=1 prints the nodes and the deepspeed command; without it the script runs exactly that
    command (a DEEPSPEED that records its arguments stands in for the launcher)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two nodes\nnode-a slots=8\nnode-b slots=4\n")
    recorder = tmp_path / "deepspeed"
    recorder.write_text(f"#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > {tmp_path / 'argv'}\n")
    recorder.chmod(0o755)
    env = dict(os.environ, HOSTFILE=str(hostfile), DEEPSPEED=str(recorder), DRY_RUN="1")
    for key in ("MASTER_ADDR", "MASTER_PORT"):  # earlier tests in this process set them; the defaults are
        env.pop(key, None)                      # the first host and port 29500
    args = [str(REPO / "launch/multi_node.sh"), "vcppo", "actor.lr=1e-6", "trainer.run_name=a b"]
    res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    *nodes, command = res.stdout.strip().splitlines()
    assert nodes == ["# node 0/2: node-a, 8 rank(s)", "# node 1/2: node-b, 4 rank(s)"]
    printed = shlex.split(command)
    assert printed == [str(recorder), "--hostfile", str(hostfile), "--master_addr", "node-a", "--master_port", "29500",
                       "--module", "vcppo.cli", "train", "vcppo", "actor.lr=1e-6", "trainer.run_name=a b"]
    env.pop("DRY_RUN")
    assert subprocess.run(args, env=env, timeout=60).returncode == 0
    assert (tmp_path / "argv").read_text().splitlines() == printed[1:]


@pytest.mark.integration
@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.extended
def test_multi_node_script_with_localhost_hostfile(tiny_artifacts, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    env = dict(ENV, HOSTFILE=str(hostfile), MASTER_PORT="29733", MASTER_ADDR="127.0.0.1")
    args = for_preset("grpo", tiny_run_args(tiny_artifacts, tmp_path) + ["trainer.total_steps=1"])  # no critic keys
    res = subprocess.run([str(REPO / "launch/multi_node.sh"), "grpo", *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    assert (tmp_path / "grpo-seed0" / "final_metrics.json").exists()


def test_node_rank_runs_this_nodes_share_without_ssh(tmp_path):
    """NODE_RANK=N: DeepSpeed's --no_ssh --node_rank N form (one launcher per node), also for a one-line hostfile."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=2\nnode-b slots=2\n")
    env = dict(os.environ, HOSTFILE=str(hostfile), DEEPSPEED="deepspeed", DRY_RUN="1", NODE_RANK="1")
    env.pop("MASTER_ADDR", None)
    res = subprocess.run([str(REPO / "launch/multi_node.sh"), "vcppo"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    *nodes, command = res.stdout.strip().splitlines()
    assert nodes[1] == "# node 1/2: node-b, 2 rank(s) (this node: it starts these)"
    assert " --master_addr node-a " in command and " --no_ssh --node_rank 1 --module vcppo.cli " in command
    hostfile.write_text("node-a slots=2\n")
    env["NODE_RANK"] = "0"
    res = subprocess.run([str(REPO / "launch/multi_node.sh"), "vcppo"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert "--no_ssh_check" not in res.stdout and "--no_ssh --node_rank 0" in res.stdout


def test_the_nodes_rank_count_under_the_deepspeed_launcher_is_its_local_size(monkeypatch):
    """The deepspeed launcher sets LOCAL_SIZE, not LOCAL_WORLD_SIZE: 2 nodes x 2 ranks is 2 ranks on this node
    (the reward workers and the hub download are sized by it), not WORLD_SIZE's 4."""
    from vcppo.runtime.launch_env import local_world_size
    from vcppo.models.hub import _local_rank
    for key in ("LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert local_world_size() == 2 and _local_rank() == (1, 2)


def test_missing_hostfile_is_a_clear_error(tmp_path):
    env = dict(os.environ, HOSTFILE=str(tmp_path / "nope"))
    res = subprocess.run([str(REPO / "launch/multi_node.sh"), "vcppo"], env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "no hostfile" in res.stderr


def test_chain_ablation_dry_run_lists_every_run_and_builds_nothing(tmp_path):
    """launch/chain_ablation.sh --dry-run: the 3 shipped chain sweeps expand (5 presets + 3 lambdas + 2
    budgets, x 3 seeds, every run its own directory) and nothing is built or trained."""
    res = subprocess.run([str(REPO / "launch/chain_ablation.sh"), "--dry-run"], cwd=tmp_path, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = [line for line in res.stdout.splitlines() if " train " in line]
    assert len(runs) == 30
    dirs = {line.split("trainer.output_root=")[1].split()[0] + "/" + line.split("trainer.run_name=")[1].split()[0]
            for line in runs}
    assert len(dirs) == 30 and all("model.policy_path=chain/sft" in line for line in runs)
    assert not any(tmp_path.iterdir())


def test_split_chain_script_overrides_load_for_every_mode():
    """launch/split_chain.sh: its shared overrides, with each mode's placement, are a valid config."""
    import re

    from vcppo.config.load import load_config
    text = (REPO / "launch/split_chain.sh").read_text()
    common = re.search(r"COMMON=\((.*?)\)", text, re.S).group(1).split()
    modes = [m.split() for m in re.findall(r"placement=\((.*?)\)", text)]
    critic_rank = re.findall(r"placement\+=\((.*?)\)", text)
    assert len(modes) == 2 and critic_rank == ["placement.critic_ranks=1"]
    for placement in [*modes, modes[1] + critic_rank]:
        cfg = load_config("vcppo", [*common, *placement, "trainer.seed=1"])
        assert cfg.algorithm.lambda_actor == 0.8 and cfg.trainer.total_steps == 50
    assert cfg.placement.mode == "split" and cfg.trainer.max_staleness == 1 and cfg.placement.critic_ranks == 1


FAKE_SRUN = r'''#!/usr/bin/env bash
# A 2-node x 2-task allocation: runs the command once per task, with SLURM's per-task variables.
while [[ "$1" == --* ]]; do echo "srun option $1"; shift; done
for task in 0 1 2 3; do
  SLURM_PROCID=$task SLURM_LOCALID=$((task % 2)) SLURM_NODEID=$((task / 2)) SLURM_NTASKS=4 \
    SLURM_STEP_NUM_TASKS=4 SLURM_STEP_TASKS_PER_NODE="2(x2)" SLURM_TASKS_PER_NODE="2(x2)" "$@" || exit $?
done
'''
# Stands in for the Python the script runs: prints what vcppo would take from the task's environment.
FAKE_PY = r'''#!/usr/bin/env bash
exec "$REAL_PY" -c 'import json, os, sys
from vcppo.runtime.launch_env import slurm_launcher_env
print(json.dumps({"args": sys.argv[1:], "master": os.environ["MASTER_ADDR"], **slurm_launcher_env(dict(os.environ))}))' "$@"
'''


def test_slurm_script_maps_a_two_node_allocation_to_ranks(tmp_path):
    import json
    import sys
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("fake_python", FAKE_PY),
                       ("scontrol", "#!/usr/bin/env bash\nprintf 'node-a\\nnode-b\\n'\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(ENV, PATH=f"{bin_dir}:{ENV.get('PATH', os.environ['PATH'])}", PY=str(bin_dir / "fake_python"),
               REAL_PY=sys.executable, SLURM_JOB_NODELIST="node-[a-b]", SLURM_SUBMIT_DIR=str(REPO))
    res = subprocess.run(["bash", str(REPO / "launch/slurm.sbatch"), "vcppo", "trainer.total_steps=3"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "srun option --kill-on-bad-exit=1" in res.stdout
    tasks = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert [(t["RANK"], t["LOCAL_RANK"], t["LOCAL_WORLD_SIZE"], t["WORLD_SIZE"]) for t in tasks] == [
        ("0", "0", "2", "4"), ("1", "1", "2", "4"), ("2", "0", "2", "4"), ("3", "1", "2", "4")]
    assert all(t["master"] == "node-a" and t["args"] == ["-m", "vcppo.cli", "train", "vcppo", "trainer.total_steps=3"]
               for t in tasks)


@pytest.mark.parametrize("env, expected", [
    ({}, {}),  # not under SLURM
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "8"}, {}),  # the batch script: no step
    ({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
      "SLURM_STEP_TASKS_PER_NODE": "3,2(x2)"},
     {"RANK": "5", "WORLD_SIZE": "7", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_TASKS_PER_NODE": "8"},
     {"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}),
])
def test_slurm_variables_map_to_the_launcher_ones(env, expected):
    from vcppo.runtime.launch_env import slurm_launcher_env
    assert slurm_launcher_env(env) == expected
