"""`vcppo train CONFIG [key=value ...]`: value pretraining, then PPO (:func:`vcppo.driver.phases.train`), on
every rank under the deepspeed launcher, torchrun, or plain python."""
from __future__ import annotations

from vcppo.preflight import load_command_config
from vcppo.driver.phases import train


def main(argv: list[str]) -> int:
    # Checked before any engine starts: a typo must not cost a vLLM start-up.
    train(load_command_config(argv, "train", default_config=None))
    return 0
