"""Run by tests/runtime/test_rendezvous.py as one rank of 2 with no other rank (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT from the environment): joins the rendezvous with a 3 s bound and prints what it says."""
from vcppo.runtime import dist
from vcppo.runtime.launch_env import RendezvousError

try:
    dist.init_distributed("cpu", rendezvous_timeout_s=3)
except RendezvousError as e:
    print(e, flush=True)
    dist.exit_process(2)
dist.exit_process(0)
