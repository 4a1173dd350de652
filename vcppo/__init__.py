"""vcppo: Value-Calibrated PPO (value pretraining + Decoupled-GAE) for long chain-of-thought RL."""
__version__ = "0.1.0"
