"""The advantage estimators and policy losses a config can name, and what each needs from a run.

``algorithm.advantage_estimator`` picks an :class:`Estimator`, ``algorithm.policy_loss`` a
:class:`PolicyLossSpec`; any estimator composes with any policy loss. This module only declares
(no torch, so the config checks and ``vcppo plan`` read it without importing the math): whether
the run builds a critic, needs several samples per prompt, and whitens over the global batch as
part of the method. The math is in :mod:`vcppo.algos` (``gae``, ``stats.grpo_advantages``,
``estimators``, ``losses``, ``gspo``); :mod:`vcppo.driver.step.advantages` and
:mod:`vcppo.driver.step.update` select it by these names.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator.

    ``critic``: it reads V_old, so the run builds, pretrains and trains a value model.
    ``groups``: its baseline comes from the other samples of the same prompt
    (``rollout.n_samples_per_prompt`` >= 2).
    ``whitens``: its definition includes normalising the advantages over the global batch
    (``algorithm.whiten_advantages`` and ``zero_mean_advantages`` must stay true).
    """
    name: str
    critic: bool
    groups: bool
    whitens: bool
    source: str


ESTIMATORS = {e.name: e for e in (
    Estimator("gae", critic=True, groups=False, whitens=False,
              source="GAE (Schulman et al. 2016, arXiv 1506.02438) with Decoupled-GAE (VC-PPO, arXiv 2503.01491)"),
    Estimator("grpo", critic=False, groups=True, whitens=False,
              source="GRPO (DeepSeekMath, arXiv 2402.03300); without the std division it is Dr. GRPO's "
                     "(arXiv 2503.20783)"),
    Estimator("rloo", critic=False, groups=True, whitens=False,
              source="RLOO (Ahmadian et al. 2024, arXiv 2402.14740)"),
    Estimator("reinforce_plus_plus", critic=False, groups=False, whitens=True,
              source="REINFORCE++ (Hu et al. 2025, arXiv 2501.03262)"),
    Estimator("reinforce_plus_plus_baseline", critic=False, groups=True, whitens=True,
              source="REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262)"),
)}


@dataclass(frozen=True)
class PolicyLossSpec:
    """A policy loss. ``aggregations``: the ``algorithm.loss_agg`` values it defines (None: all).
    ``dual_clip``: it has a dual clip (``algorithm.dual_clip_c``)."""
    name: str
    aggregations: tuple[str, ...] | None
    dual_clip: bool
    source: str


POLICY_LOSSES = {p.name: p for p in (
    PolicyLossSpec("ppo", aggregations=None, dual_clip=True,
                   source="the clipped surrogate per token (PPO, arXiv 1707.06347), with clip-higher "
                          "(DAPO, arXiv 2503.14476) and dual-clip (arXiv 1912.09729)"),
    PolicyLossSpec("gspo", aggregations=("seq-mean-token-mean",), dual_clip=False,
                   source="GSPO (Zheng et al. 2025, arXiv 2507.18071): the length-normalised sequence ratio, "
                          "clipped per sequence"),
)}


def uses_critic(estimator: str) -> bool:
    """Whether a run with this ``algorithm.advantage_estimator`` builds and trains a critic."""
    return ESTIMATORS[estimator].critic
