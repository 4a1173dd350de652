"""The multi-node launch for real, on two nodes made on this machine (launch/two_nodes.sh: network
namespaces node-a 10.213.7.1 and node-b 10.213.7.2 on a private link, each with its own hostname,
/dev/shm and node-local directory; the repository, the venv and the run directory shared). Each node
runs the documented command, `NODE_RANK=N HOSTFILE=hostfile launch/multi_node.sh vcppo ...` (the
deepspeed launcher's --no_ssh form, one launcher per node), of a tiny `vcppo train vcppo`:

* 2 nodes x 1 rank log, record for record, what 1 node x 2 ranks logs; the one-node run's DeepSpeed
  shm segments lie in its node's own /dev/shm and are gone after its clean end;
* a SIGKILL of the rank on node-b in PPO step 2's actor update ends both launchers within a minute,
  leaves no process on either node, and the same commands resume to the uninterrupted run's records;
* a rank whose master is unreachable (node-a's link down) or not listening exits within bounded time
  with one line naming MASTER_ADDR / MASTER_PORT and what it found there;
* 2 nodes x 2 ranks log what 1 node x 4 ranks logs, the model a hub id resolved once per node from each
  node's own cache;
* the pdsh form (`HOSTFILE=hostfile launch/multi_node.sh vcppo ...` on node-a, an sshd per node), SLURM's
  script with an `srun` that starts a task inside each node, both logging what the no-ssh run logged;
* split placement with the training rank on node-b and the rollout rank on node-a logs what one
  colocated rank logs.

Traffic goes only to the two namespaces' own addresses. `make test-nodes` runs these (root, iproute2 and
util-linux needed; skipped with the reason otherwise)."""
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ENV
from tests.driver.test_exact_resume_e2e import assert_same, records
from tests.two_nodes import REPO, SCRIPT, skip_reason, two_nodes
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete, peek_state

pytestmark = [pytest.mark.nodes, pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]

PORT = "29500"  # each node has a port space of its own: nothing else on this machine listens there
KILLED_STEP = 2


def documented_check() -> list[str]:
    """The arguments of docs/launching.md's two-node check: `vcppo` and its overrides, paths under /shared/check."""
    from tests.test_doc_commands import command_lines
    line = next(c for c in command_lines(REPO / "docs/launching.md")
                if c.startswith("launch/multi_node.sh vcppo model.policy_path=/shared/check/tiny"))
    return shlex.split(line)[1:]


def train_args(art: Path, out: Path, **extra) -> list[str]:
    """The documented check's arguments with this test's tiny model, task and run directory (``extra`` added)."""
    args = [a.replace("/shared/check/runs", str(out)).replace("/shared/check", str(art)) for a in documented_check()]
    return args + [f"{k}={v}" for k, v in extra.items()]


def node_env(hostfile: Path, node_rank: str | None = None) -> dict:
    env = dict(ENV, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HOSTFILE=str(hostfile), MASTER_PORT=PORT)
    env.pop("MASTER_ADDR", None)  # the hostfile's first node, as on a cluster
    if node_rank is not None:
        env["NODE_RANK"] = node_rank
    return env


def hostfile(path: Path, slots: dict[str, int]) -> Path:
    path.write_text("".join(f"node-{node} slots={n}\n" for node, n in slots.items()))
    return path


def start_both(nodes, args: list[str], hosts: Path, logs: Path, tag: str, launcher=None):
    """One launcher per node (NODE_RANK 0 on node-a, 1 on node-b); ``launcher(node)``: another command there."""
    return {node: nodes.start(node, launcher(node) if launcher else ["launch/multi_node.sh", *args],
                              node_env(hosts, str(rank)), logs / f"{tag}.{node}.log", cwd=REPO if not launcher
                              else logs)
            for rank, node in enumerate("ab")}


def wait_all(procs: dict, timeout: float = 900) -> dict[str, int]:
    try:
        return {node: p.wait(timeout=timeout) for node, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()


def running(pid: int) -> bool:
    """A process that still runs (a killed one its parent has not reaped yet is a zombie: state Z)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_two_nodes_are_apart_and_their_teardown_leaves_nothing(tmp_path):
    """Each node: its address, its hostname, its /dev/shm and node-local directory; the rest shared; a
    TCP connection from node-b to node-a by name; `down` then finds nothing left."""
    with two_nodes(tmp_path / "nodes") as nodes:
        for node, addr in (("a", "10.213.7.1"), ("b", "10.213.7.2")):
            out = nodes.run(node, ["sh", "-c", f"hostname; ip -4 -br addr; touch /dev/shm/on-{node} "
                                   f"{nodes.local}/on-{node} {tmp_path}/shared-{node}"]).stdout
            assert out.splitlines()[0] == f"node-{node}" and f"{addr}/24" in out, out
        assert (nodes.shm("a"), nodes.shm("b")) == (["on-a"], ["on-b"])
        assert not list(Path("/dev/shm").glob("on-[ab]"))
        assert nodes.run("a", ["ls", nodes.local]).stdout.split() == ["on-a"]
        assert nodes.run("b", ["ls", nodes.local]).stdout.split() == ["on-b"]
        assert sorted(p.name for p in tmp_path.glob("shared-*")) == ["shared-a", "shared-b"]
        server = nodes.start("a", [sys.executable, "-c", "import socket; s = socket.create_server(('node-a', 29999)); "
                                   "c, peer = s.accept(); print(peer[0])"], ENV, tmp_path / "server.log")
        client = ("import socket, time\nfor _ in range(100):\n  try: socket.create_connection(('node-a', 29999)); "
                  "break\n  except OSError: time.sleep(0.1)")
        assert nodes.run("b", [sys.executable, "-c", client]).returncode == 0
        assert server.wait(timeout=30) == 0 and (tmp_path / "server.log").read_text().strip() == "10.213.7.2"
        nodes.run("a", ["rm", "/dev/shm/on-a"])
        nodes.run("b", ["rm", "/dev/shm/on-b"])


def test_teardown_after_a_failure_ends_what_runs_and_names_what_was_left(tmp_path):
    """`run`: the command fails (exit 3) with a process still running on node-a and a segment in
    node-b's /dev/shm: everything is removed all the same, each leftover named, the exit status kept."""
    if skip_reason():
        pytest.skip(skip_reason())
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    script = f"{SCRIPT} on $TWO_NODES a sleep 300 & {SCRIPT} on $TWO_NODES b touch /dev/shm/seg; sleep 1; exit 3"
    res = subprocess.run([str(SCRIPT), "run", str(tmp_path / "nodes"), "sh", "-c", script], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 3, res.stdout + res.stderr
    pid = int(re.search(r"left: process (\d+) on node-a: sleep 300", res.stderr).group(1))
    assert "left: /dev/shm segment on node-b: seg" in res.stderr
    assert not running(pid)
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == before
    assert not (tmp_path / "nodes").exists()


def test_each_node_reaches_both_by_ssh_with_the_key_made_for_them(tmp_path):
    """`two_nodes.sh ssh`: an sshd on each node's address; from node-a, ssh and pdsh (as DeepSpeed runs it)
    reach node-a and node-b by name; `down` stops both sshds and finds nothing left."""
    if not (shutil.which("pdsh") and os.path.exists("/usr/sbin/sshd")):
        pytest.skip("needs pdsh and openssh-server (scripts/install_node_tools.sh, which `make test-nodes` runs)")
    with two_nodes(tmp_path / "nodes") as nodes:
        nodes.ssh()
        assert nodes.run("a", ["ssh", "-o", "PasswordAuthentication=no", "node-b", "hostname"]).stdout == "node-b\n"
        res = nodes.run("a", ["pdsh", "-S", "-w", "node-a,node-b", "hostname; echo rank=%n"],
                        env=dict(os.environ, PDSH_RCMD_TYPE="ssh"))
        assert res.returncode == 0, res.stderr
        assert sorted(res.stdout.splitlines()) == ["node-a: node-a", "node-a: rank=0", "node-b: node-b",
                                                   "node-b: rank=1"]


def _mapped_segments() -> set[str]:
    """The DeepSpeed shm segments some process maps, by name: each rank removes its segment's name once
    every rank mapped it, so a running rank shows it as ``/dev/shm/NAME (deleted)`` in its maps (the
    path in its own mount namespace)."""
    found: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            found.update(re.findall(r"/dev/shm/(deepspeed_allreduce_buffer_\S+)", maps.read_text()))
        except OSError:  # it ended meanwhile
            continue
    return found


@pytest.fixture(scope="module")
def one_node(tiny_artifacts, tmp_path_factory):
    """1 node x 2 ranks (node-a); the DeepSpeed shm segments seen in its /dev/shm while it ran (listed
    there, or mapped from there by its ranks while the host's /dev/shm has none)."""
    root = tmp_path_factory.mktemp("one_node")
    with two_nodes(root / "nodes") as nodes:
        hosts = hostfile(root / "hostfile", {"a": 2})
        proc = nodes.start("a", ["launch/multi_node.sh", *train_args(tiny_artifacts, root)], node_env(hosts),
                           root / "a.log")
        seen: set[str] = set()
        while proc.poll() is None:
            seen.update(nodes.shm("a"))
            seen.update(_mapped_segments())
            assert not list(Path("/dev/shm").glob("deepspeed_allreduce_buffer_*_node-a_*"))
            time.sleep(0.5)
        assert proc.wait() == 0, (root / "a.log").read_text()[-5000:]
        assert nodes.wait_idle() == {} and nodes.shm("a") == [] and nodes.shm("b") == []
    return records(root / "vcppo-seed0"), seen


@pytest.fixture(scope="module")
def two_one_rank_nodes(tiny_artifacts, tmp_path_factory):
    """2 nodes x 1 rank, uninterrupted: (records, node-a's launcher output)."""
    root = tmp_path_factory.mktemp("two_nodes")
    with two_nodes(root / "nodes") as nodes:
        hosts = hostfile(root / "hostfile", {"a": 1, "b": 1})
        codes = wait_all(start_both(nodes, train_args(tiny_artifacts, root), hosts, root, "run"))
        assert codes == {"a": 0, "b": 0}, [(root / f"run.{n}.log").read_text()[-3000:] for n in "ab"]
        assert nodes.wait_idle() == {} and nodes.shm("a") == [] and nodes.shm("b") == []
    return records(root / "vcppo-seed0"), (root / "run.a.log").read_text()


def test_one_node_keeps_its_shm_segments_in_its_own_dev_shm(one_node):
    _, seen = one_node
    assert {f"deepspeed_allreduce_buffer_{os.getuid()}_node-a_{PORT}_{r}" for r in (0, 1)} <= seen, seen


def test_two_nodes_one_rank_each_log_what_one_node_with_two_ranks_logs(one_node, two_one_rank_nodes):
    got, launcher = two_one_rank_nodes
    assert_same(got, one_node[0])
    # the launcher's lines that say the layout it started (docs/launching.md reads them)
    assert "nnodes=2, num_local_procs=1, node_rank=0" in launcher
    assert "global_rank_mapping=defaultdict(<class 'list'>, {'node-a': [0], 'node-b': [1]})" in launcher
    assert "dist_world_size=2" in launcher and "| ranks 2 |" in launcher


def test_a_rank_killed_on_node_b_ends_both_launchers_and_the_rerun_resumes_exactly(two_one_rank_nodes, tiny_artifacts,
                                                                                 tmp_path):
    args = train_args(tiny_artifacts, tmp_path)
    hosts = hostfile(tmp_path / "hostfile", {"a": 1, "b": 1})
    deepspeed = str(REPO / ".venv/bin/deepspeed") if (REPO / ".venv/bin/deepspeed").exists() else "deepspeed"

    def killing_launcher(node):  # the command multi_node.sh runs, with the rank on node-b killing itself
        return [deepspeed, "--hostfile", str(hosts), "--master_addr", "node-a", "--master_port", PORT, "--no_ssh",
                "--node_rank", "01"["ab".index(node)], "--module", "tests.kill_at", "1", "update", str(KILLED_STEP),
                "--", "train", *args]

    with two_nodes(tmp_path / "nodes") as nodes:
        codes = wait_all(start_both(nodes, args, hosts, tmp_path, "killed", launcher=killing_launcher))
        ended = time.time()
        died = float((tmp_path / "killed_at").read_text())
        logs = {n: (tmp_path / f"killed.{n}.log").read_text() for n in "ab"}
        assert codes["a"] != 0 and codes["b"] != 0, (codes, logs["a"][-3000:], logs["b"][-3000:])
        assert ended - died < 60, (ended - died, logs["a"][-3000:])
        print(f"both launchers ended {ended - died:.1f} s after the kill: {codes}")
        assert nodes.wait_idle(timeout=5) == {}
        assert nodes.shm("a") == [] and nodes.shm("b") == []
        run = tmp_path / "vcppo-seed0"
        left = list_complete(checkpoint_root(run))
        assert (peek_state(left[-1]).phase, peek_state(left[-1]).step) == ("ppo", KILLED_STEP - 1)
        assert not (run / "final").exists()

        codes = wait_all(start_both(nodes, args, hosts, tmp_path, "resumed"))
        logs = {n: (tmp_path / f"resumed.{n}.log").read_text() for n in "ab"}
        assert codes == {"a": 0, "b": 0}, (logs["a"][-3000:], logs["b"][-3000:])
        assert f"resuming from {left[-1]}" in logs["a"]
        assert_same(records(run), two_one_rank_nodes[0])


@pytest.mark.parametrize("master", ["link down", "not listening"])
def test_an_unreachable_master_is_named_on_one_line_within_bounded_time(master, tiny_artifacts, tmp_path):
    """node-b's launcher alone: node-a's link is down, or nothing listens on node-a's MASTER_PORT."""
    hosts = hostfile(tmp_path / "hostfile", {"a": 1, "b": 1})
    args = train_args(tiny_artifacts, tmp_path, **{"trainer.rendezvous_timeout_s": 10})
    with two_nodes(tmp_path / "nodes") as nodes:
        if master == "link down":
            nodes.set_link("a", up=False)
        start = time.time()
        res = nodes.run("b", ["launch/multi_node.sh", *args], env=node_env(hosts, "1"), timeout=300)
        took = time.time() - start
        assert nodes.wait_idle(timeout=5) == {}
    out = res.stdout + res.stderr
    lines = [line for line in out.splitlines() if "could not join the rendezvous" in line]
    assert res.returncode == 2 and len(lines) == 1, out[-3000:]
    assert lines[0].startswith(f"vcppo train: rank 1 of 2 could not join the rendezvous at MASTER_ADDR=node-a "
                               f"MASTER_PORT={PORT} within 10 s (trainer.rendezvous_timeout_s): tried node-a:{PORT}, "
                               f"and node-a = 10.213.7.1 "), lines[0]
    found = "refuses the connection" if master == "not listening" else ("unreachable", "gave no answer")
    assert any(f in lines[0] for f in ([found] if isinstance(found, str) else found)), lines[0]
    print(f"{master}: exit {res.returncode} after {took:.0f} s: {lines[0]}")
    assert took < 150, took  # start-up (~30-60 s here) and the 10 s bound, not the 30-minute collective timeout


def test_two_nodes_two_ranks_each_log_what_one_node_with_four_ranks_logs(tiny_artifacts, tmp_path):
    """1 node x 4 ranks (the model by path) against 2 nodes x 2 ranks whose model is a hub id, cached in each
    node's own node-local HF_HOME: each node's local rank 0 resolves it there once (its answer file), the
    other local rank reads that answer, and the records are the same. No node leaves a /dev/shm segment."""
    from tests.hub_cache import add_model
    one, two = tmp_path / "one", tmp_path / "two"
    with two_nodes(tmp_path / "nodes") as nodes:
        proc = nodes.start("a", ["launch/multi_node.sh", *train_args(tiny_artifacts, one)],
                           node_env(hostfile(tmp_path / "hostfile1", {"a": 4})), tmp_path / "one.a.log")
        assert proc.wait(timeout=1200) == 0, (tmp_path / "one.a.log").read_text()[-5000:]
        assert nodes.wait_idle() == {} and nodes.shm("a") == []
        for node in "ab":  # what each node's own disk holds; nothing of it on the shared storage
            add_model(nodes.state / f"local-{node}" / "hf", "check/tiny", tiny_artifacts / "tiny")
        args = [a.replace(f"model.policy_path={tiny_artifacts / 'tiny'}", "model.policy_path=check/tiny")
                for a in train_args(tiny_artifacts, two)]
        assert "model.policy_path=check/tiny" in args
        hosts = hostfile(tmp_path / "hostfile2", {"a": 2, "b": 2})
        procs = {}
        for rank, node in enumerate("ab"):
            env = dict(node_env(hosts, str(rank)), HF_HOME=str(nodes.local / "hf"), HF_HUB_OFFLINE="1")
            procs[node] = nodes.start(node, ["launch/multi_node.sh", *args], env, tmp_path / f"two.{node}.log")
        codes = wait_all(procs, timeout=1200)
        assert codes == {"a": 0, "b": 0}, [(tmp_path / f"two.{n}.log").read_text()[-3000:] for n in "ab"]
        assert nodes.wait_idle() == {} and nodes.shm("a") == [] and nodes.shm("b") == []
        answers = {n: list((nodes.state / f"local-{n}" / "hf/hub/.vcppo").glob("model--check*tiny.json")) for n in "ab"}
        assert all(len(found) == 1 for found in answers.values()), answers
        assert not (nodes.local / "hf").exists()  # the host's view of the node-local path: empty
    launcher = (tmp_path / "two.a.log").read_text()
    assert "{'node-a': [0, 1], 'node-b': [2, 3]}" in launcher and "| ranks 4 |" in launcher
    assert_same(records(two / "vcppo-seed0"), records(one / "vcppo-seed0"))


def test_pdsh_over_ssh_runs_the_documented_command_on_both_nodes(two_one_rank_nodes, tiny_artifacts, tmp_path):
    """`HOSTFILE=hostfile launch/multi_node.sh vcppo ...` on node-a, unchanged: DeepSpeed checks ssh to node-a,
    then pdsh starts each node's launcher over ssh (an sshd on each node's address, a key made for them). Only
    the variables in DS_ENV_FILE (and PYTHON*) reach the ranks. The records are the no-ssh run's."""
    if not (shutil.which("pdsh") and os.path.exists("/usr/sbin/sshd")):
        pytest.skip("needs pdsh and openssh-server (scripts/install_node_tools.sh, which `make test-nodes` runs)")
    hosts = hostfile(tmp_path / "hostfile", {"a": 1, "b": 1})
    ds_env = tmp_path / "deepspeed_env"
    ds_env.write_text("".join(f"{k}={ENV[k]}\n" for k in ("DS_ACCELERATOR", "WANDB_MODE", "TOKENIZERS_PARALLELISM"))
                      + "OMP_NUM_THREADS=1\n")
    with two_nodes(tmp_path / "nodes") as nodes:
        nodes.ssh()
        env = dict(node_env(hosts), DS_ENV_FILE=str(ds_env))
        res = nodes.run("a", ["launch/multi_node.sh", *train_args(tiny_artifacts, tmp_path)], env=env, timeout=1500)
        assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
        assert nodes.wait_idle() == {} and nodes.shm("a") == [] and nodes.shm("b") == []
    out = res.stdout + res.stderr
    assert "Running on the following workers: node-a,node-b" in out and "cmd = pdsh -S -f 1024 -w node-a,node-b" in out
    assert "node-b: " in out  # pdsh prefixes each node's output with its name
    assert_same(records(tmp_path / "vcppo-seed0"), two_one_rank_nodes[0])


def test_split_placement_with_the_rollout_rank_on_node_a_and_the_training_rank_on_node_b(tiny_artifacts, tmp_path):
    """placement.mode=split over the two nodes, synchronous: the hostfile lists node-b first, so rank 0 (the
    training rank) runs there and the last rank (the rollout rank) on node-a; weights go to node-a and scored
    batches come back over the link. It logs what one colocated rank logs (as tests/driver/test_split_e2e.py
    checks on one machine)."""
    from tests.driver.test_split_e2e import comparable
    colocated, split = tmp_path / "colocated", tmp_path / "split"
    with two_nodes(tmp_path / "nodes") as nodes:
        one = hostfile(tmp_path / "hostfile1", {"a": 1})
        proc = nodes.start("a", ["launch/multi_node.sh", *train_args(tiny_artifacts, colocated)], node_env(one),
                           tmp_path / "colocated.log")
        assert proc.wait(timeout=900) == 0, (tmp_path / "colocated.log").read_text()[-5000:]
        hosts = hostfile(tmp_path / "hostfile2", {"b": 1, "a": 1})
        args = [*train_args(tiny_artifacts, split), "placement.mode=split"]
        procs = {node: nodes.start(node, ["launch/multi_node.sh", *args], node_env(hosts, str(rank)),
                                   tmp_path / f"split.{node}.log") for rank, node in enumerate("ba")}
        codes = wait_all(procs)
        logs = {n: (tmp_path / f"split.{n}.log").read_text() for n in "ab"}
        assert codes == {"a": 0, "b": 0}, (logs["a"][-3000:], logs["b"][-3000:])
        assert nodes.wait_idle() == {} and nodes.shm("a") == [] and nodes.shm("b") == []
    assert "global_rank_mapping=defaultdict(<class 'list'>, {'node-b': [0], 'node-a': [1]})" in logs["b"]
    assert "split placement: 1 rollout rank(s) sample" in logs["b"]  # rank 0, the training rank, logs
    got, want = records(split / "vcppo-seed0"), records(colocated / "vcppo-seed0")
    assert {k for r in got for k in r} - {k for r in want for k in r} == {"staleness/steps_behind"}
    assert_same(comparable(got), comparable(want))


FAKE_SRUN = r'''#!/usr/bin/env bash
# srun over the two nodes: one task per node, each started inside its node with SLURM's per-task variables;
# --kill-on-bad-exit: the first task to fail ends the other.
while [[ "$1" == --* ]]; do echo "srun option $1"; shift; done
pids=()
for task in 0 1; do
  node=$([ "$task" = 0 ] && echo a || echo b)
  env SLURM_PROCID=$task SLURM_LOCALID=0 SLURM_NODEID=$task SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 \
    SLURM_STEP_TASKS_PER_NODE="1(x2)" SLURM_TASKS_PER_NODE="1(x2)" "$TWO_NODES_SH" on "$TWO_NODES" "$node" "$@" &
  pids+=($!)
done
status=0
for _ in "${pids[@]}"; do
  wait -n || { status=$?; kill "${pids[@]}" 2>/dev/null; }
done
exit "$status"
'''


def test_the_slurm_script_runs_one_task_per_node(two_one_rank_nodes, tiny_artifacts, tmp_path):
    """launch/slurm.sbatch with a stand-in `srun` that starts each task inside its node (and a
    `scontrol` that names the nodes): SLURM's variables map to the ranks, the first node is MASTER_ADDR, and
    the run logs what the deepspeed launcher's 2 x 1 run logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", "#!/usr/bin/env bash\nprintf 'node-a\\nnode-b\\n'\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    with two_nodes(tmp_path / "nodes") as nodes:
        env = dict(ENV, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PATH=f"{bin_dir}:{os.environ['PATH']}",
                   TWO_NODES_SH=str(SCRIPT), TWO_NODES=str(nodes.state), SLURM_JOB_NODELIST="node-[a-b]",
                   SLURM_SUBMIT_DIR=str(REPO), MASTER_PORT=PORT)
        env.pop("MASTER_ADDR", None)
        # the batch script itself only asks scontrol for the nodes and calls srun: it runs here, the tasks there
        res = subprocess.run(["bash", "launch/slurm.sbatch", *train_args(tiny_artifacts, tmp_path)], cwd=REPO,
                             env=env, capture_output=True, text=True, timeout=1200)
        assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
        assert nodes.wait_idle() == {} and nodes.shm("a") == [] and nodes.shm("b") == []
    assert "srun option --kill-on-bad-exit=1" in res.stdout and "| ranks 2 |" in res.stdout + res.stderr
    assert_same(records(tmp_path / "vcppo-seed0"), two_one_rank_nodes[0])
