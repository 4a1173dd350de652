"""Value pretraining (VC-PPO sec. 4.1): fix the critic before the policy learns from it.

A critic initialised from a reward model (trained only at <eos>) scores early tokens low; its TD
errors then carry a positive bias that GAE accumulates toward the start of the response, so early
tokens get inflated advantages and the policy learns to stop early (sec. 3.1). The fix: freeze the
SFT policy, sample from it, and regress the critic on Monte-Carlo returns (GAE with lambda = 1,
i.e. unbiased targets) until value loss and explained variance settle. The loss curve shows two
phases: a fast "range alignment", then slow "knowledge injection" (Fig. 4). The paper found ~100
steps best and 150 over-fitting.

The loop is :func:`vcppo.driver.loops.value_pretrain`; it publishes the result to the critic cache
(:mod:`vcppo.driver.durability.critic_cache`), so every preset and seed of a sweep that starts from the same
SFT model reuses one pretrained critic. Here: the stopping rule.
"""
from __future__ import annotations

import numpy as np

from vcppo.config.schema import ValuePretrainConfig


def settled(ev_history: list[float], loss_history: list[float], vp: ValuePretrainConfig) -> bool:
    """Stopping rule: after ``min_steps``, compare the means of the last two windows of
    ``window`` steps; settled when explained variance moved by less than ``ev_tolerance``
    (absolute) and value loss by less than ``loss_tolerance`` (relative)."""
    w = vp.window
    if len(ev_history) < max(vp.min_steps, 2 * w):
        return False
    ev_prev, ev_last = np.mean(ev_history[-2 * w:-w]), np.mean(ev_history[-w:])
    l_prev, l_last = np.mean(loss_history[-2 * w:-w]), np.mean(loss_history[-w:])
    return bool(abs(ev_last - ev_prev) < vp.ev_tolerance
                and abs(l_last - l_prev) <= vp.loss_tolerance * max(abs(l_prev), 1e-8))
