"""Checks of ``actor.sequence_parallel_size`` / ``critic.sequence_parallel_size`` that need no engine:
what a placement does not support is its own rule (:meth:`vcppo.config.placement.Placement.check`), the
model's heads are the pre-flight's (:func:`vcppo.preflight.check_sequence_parallel_heads`), and the
launched ranks are checked here (:func:`check_sequence_parallel_ranks`).
Each raises a ConfigError naming the key before any engine starts."""
from __future__ import annotations

from vcppo.config.schema import Config
from vcppo.errors import ConfigError


def sequence_parallel_sections(cfg: Config) -> list[tuple[str, int]]:
    """(section, SP size > 1) of the engines the run builds with sequence parallelism."""
    from vcppo.methods import uses_critic

    sections = ["actor"] + (["critic"] if uses_critic(cfg.algorithm.advantage_estimator) else [])
    return [(s, getattr(cfg, s).sequence_parallel_size) for s in sections
            if getattr(cfg, s).sequence_parallel_size > 1]




def check_sequence_parallel_ranks(cfg: Config, training_ranks: int) -> None:
    """An SP group is ``size`` of the training ranks: the size must divide their number."""
    for section, size in sequence_parallel_sections(cfg):
        if training_ranks % size:
            raise ConfigError(f"config key '{section}.sequence_parallel_size' ({size}) must divide the number of "
                              f"training ranks ({training_ranks})")
