"""Checks of ``actor.sequence_parallel_size`` / ``critic.sequence_parallel_size`` that need no engine:
what a placement does not support (its own rule: :meth:`vcppo.config.placement.Placement.check`), the model's heads
(:func:`check_sequence_parallel_heads`) and the launched ranks (:func:`check_sequence_parallel_ranks`).
Each raises a ConfigError naming the key before any engine starts."""
from __future__ import annotations

import json
import os

from vcppo.config.schema import Config, ConfigError


def _sections(cfg: Config) -> list[tuple[str, int]]:
    """(section, SP size > 1) of the engines the run builds with sequence parallelism."""
    from vcppo.methods import uses_critic

    sections = ["actor"] + (["critic"] if uses_critic(cfg.algorithm.advantage_estimator) else [])
    return [(s, getattr(cfg, s).sequence_parallel_size) for s in sections
            if getattr(cfg, s).sequence_parallel_size > 1]


def _model_dir(cfg: Config, section: str) -> str | None:
    if section == "actor" or cfg.model.critic_init == "policy":
        return cfg.model.policy_path
    return cfg.model.critic_path


def check_sequence_parallel_heads(cfg: Config) -> None:
    """Ulysses splits the attention heads over the group: the model's query heads must be divisible
    by the SP size, its key/value heads divisible by it or dividing it (then replicated)."""
    from vcppo.engines.sequence_parallel import head_problem

    for section, size in _sections(cfg):
        path = os.path.join(_model_dir(cfg, section) or "", "config.json")
        if not os.path.isfile(path):
            continue
        c = json.load(open(path))
        c = c.get("text_config", c)
        heads = c.get("num_attention_heads")
        if not heads:
            continue
        problem = head_problem(size, int(heads), int(c.get("num_key_value_heads") or heads))
        if problem:
            raise ConfigError(f"config key '{section}.sequence_parallel_size' ({size}): {problem} (model "
                              f"{os.path.dirname(path)})")


def check_sequence_parallel_ranks(cfg: Config, training_ranks: int) -> None:
    """An SP group is ``size`` of the training ranks: the size must divide their number."""
    for section, size in _sections(cfg):
        if training_ranks % size:
            raise ConfigError(f"config key '{section}.sequence_parallel_size' ({size}) must divide the number of "
                              f"training ranks ({training_ranks})")
