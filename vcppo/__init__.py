"""vcppo: Value-Calibrated PPO (value pretraining + Decoupled-GAE) for long chain-of-thought RL."""
import os as _os

__version__ = "0.1.0"

# OpenMP threads sleep between parallel regions instead of spinning. Spinning threads hold their
# core while the thread they wait for may not be scheduled: on a 2-core host beside one other busy
# process, torch's two threads took 2-9 s per step of a tiny model where they take 0.14-0.27 s
# passive (docs/performance.md). The runtime reads this once, when torch loads it, so it is set here,
# before any vcppo module imports torch (and it reaches every process vcppo starts); a value the
# user set wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
