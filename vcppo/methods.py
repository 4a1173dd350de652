"""The methods table: the advantage estimators and policy losses a config can name, what each
needs from a run, and the function that computes it.

``algorithm.advantage_estimator`` picks an :class:`Estimator`, ``algorithm.policy_loss`` a
:class:`PolicyLossSpec`; any estimator composes with any policy loss. A row names its function as
``"module:function"`` (imported on first use, so the config checks and ``vcppo plan`` read the
table without importing torch): every estimator has the signature of
:mod:`vcppo.algos.estimators` (``EstimatorInput -> EstimatorOutput``), every policy loss that of
:func:`vcppo.algos.losses.policy_loss`. The schema's choices, the config checks, the step plan,
:mod:`vcppo.driver.step.update` and :mod:`vcppo.driver.step.update` all read these rows, so a new
method is one function and one row (docs/architecture.md, "Adding an estimator").
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator.

    ``critic``: it reads V_old, so the run builds, pretrains and trains a value model.
    ``groups``: its baseline comes from the other samples of the same prompt
    (``rollout.n_samples_per_prompt`` >= 2).
    ``whitens``: its definition includes normalising the advantages over the global batch
    (``algorithm.whiten_advantages`` and ``zero_mean_advantages`` must stay true).
    ``fn``: ``"module:function"`` computing it (:mod:`vcppo.algos.estimators`' signature).
    """
    name: str
    critic: bool
    groups: bool
    whitens: bool
    source: str
    fn: str


_EST = "vcppo.algos.estimators"
ESTIMATORS = {e.name: e for e in (
    Estimator("gae", critic=True, groups=False, whitens=False,
              source="GAE (Schulman et al. 2016, arXiv 1506.02438) with Decoupled-GAE (VC-PPO, arXiv 2503.01491)",
              fn=f"{_EST}:gae"),
    Estimator("grpo", critic=False, groups=True, whitens=False,
              source="GRPO (DeepSeekMath, arXiv 2402.03300); without the std division it is Dr. GRPO's "
                     "(arXiv 2503.20783)", fn=f"{_EST}:grpo"),
    Estimator("rloo", critic=False, groups=True, whitens=False,
              source="RLOO (Ahmadian et al. 2024, arXiv 2402.14740)", fn=f"{_EST}:rloo"),
    Estimator("reinforce_plus_plus", critic=False, groups=False, whitens=True,
              source="REINFORCE++ (Hu et al. 2025, arXiv 2501.03262)", fn=f"{_EST}:reinforce_pp"),
    Estimator("reinforce_plus_plus_baseline", critic=False, groups=True, whitens=True,
              source="REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262)",
              fn=f"{_EST}:reinforce_pp_baseline"),
)}


@dataclass(frozen=True)
class PolicyLossSpec:
    """A policy loss. ``aggregations``: the ``algorithm.loss_agg`` values it defines (None: all).
    ``dual_clip``: it has a dual clip (``algorithm.dual_clip_c``).
    ``sampler_ratio``: its ratio is against the sampler's own logprobs (no pi_old pass, no TIS).
    ``fn``: ``"module:function"`` computing it (:func:`vcppo.algos.losses.policy_loss`' signature)."""
    name: str
    aggregations: tuple[str, ...] | None
    dual_clip: bool
    source: str
    fn: str
    sampler_ratio: bool = False


POLICY_LOSSES = {p.name: p for p in (
    PolicyLossSpec("ppo", aggregations=None, dual_clip=True,
                   source="the clipped surrogate per token (PPO, arXiv 1707.06347), with clip-higher "
                          "(DAPO, arXiv 2503.14476) and dual-clip (arXiv 1912.09729)",
                   fn="vcppo.algos.losses:policy_loss"),
    PolicyLossSpec("gspo", aggregations=("seq-mean-token-mean",), dual_clip=False,
                   source="GSPO (Zheng et al. 2025, arXiv 2507.18071): the length-normalised sequence ratio, "
                          "clipped per sequence", fn="vcppo.algos.gspo:gspo_loss"),
    PolicyLossSpec("dis", aggregations=None, dual_clip=False,
                   source="SAO's direct double-sided importance sampling (arXiv 2607.07508 sec. 3.1): the ratio "
                          "against the sampler's logprobs, tokens outside [1 - eps_low, 1 + eps_high] masked out",
                   fn="vcppo.algos.dis:dis_loss", sampler_ratio=True),
)}


def uses_critic(estimator: str) -> bool:
    """Whether a run with this ``algorithm.advantage_estimator`` builds and trains a critic."""
    return ESTIMATORS[estimator].critic


def load_fn(path: str) -> Callable:
    """The function a row names (``"module:function"``), imported on first use."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def estimator_fn(estimator: str) -> Callable:
    """``algorithm.advantage_estimator``'s function (:mod:`vcppo.algos.estimators`' signature)."""
    return load_fn(ESTIMATORS[estimator].fn)


def policy_loss_fn(policy_loss: str) -> Callable:
    """``algorithm.policy_loss``'s function (:func:`vcppo.algos.losses.policy_loss`' signature)."""
    return load_fn(POLICY_LOSSES[policy_loss].fn)
