"""A small trainer for the lifeline test: a reward pool and an env pool, two env turns that hang (a
pure-Python spin in one worker, a python tool child asleep under the other); prints "hanging" and
its pid, then waits on the turns for two minutes."""
import os

from vcppo.envs.worker import EnvRunner, EpisodeKey
from vcppo.rewards.verifier import RewardScorer

if __name__ == "__main__":
    scorer = RewardScorer(num_workers=1)
    envs = EnvRunner(num_workers=2, timeout_s=120)
    keys = [EpisodeKey(f"e{i}", f"tests.envs.hostile:{env}", (), (("answer", "1"),), 0)
            for i, env in enumerate(("Spins", "ToolSleeps"))]
    print("hanging", os.getpid(), flush=True)
    envs.step([("a", k) for k in keys])
