"""Sequence rewards from a rule (the verifier) and a reward model: how they combine, and the
running moments that normalise the model's scores.

Notation: B samples; ``rule`` (B,) the rule's reward, ``model`` (B,) the reward model's score
(normalised or not: the caller decides), ``has_rule`` (B,) bool where the sample's data_source
has a rule of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

COMBINE_MODES = ("rule", "model", "weighted_sum", "model_without_rule")


def combine_rewards(rule: torch.Tensor, model: torch.Tensor | None, mode: str, rule_weight: float = 1.0,
                    model_weight: float = 1.0, has_rule: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) sequence rewards.

        rule                 rule
        model                model
        weighted_sum         rule_weight * rule + model_weight * model
        model_without_rule   rule where has_rule, model elsewhere
    """
    if mode == "rule":
        return rule
    if model is None:
        raise ValueError(f"combine mode {mode!r} needs the reward model's scores")
    if mode == "model":
        return model
    if mode == "weighted_sum":
        return rule_weight * rule + model_weight * model
    if mode == "model_without_rule":
        if has_rule is None:
            raise ValueError("combine mode 'model_without_rule' needs has_rule")
        return torch.where(has_rule.bool(), rule, model)
    raise ValueError(f"combine mode must be one of {COMBINE_MODES}, got {mode!r}")


@dataclass(frozen=True)
class Moments:
    """Count, mean and sum of squared deviations (M2) of the values seen so far."""
    count: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    @property
    def std(self) -> float:
        """Population standard deviation (0 before two values)."""
        return (self.m2 / self.count) ** 0.5 if self.count > 1 else 0.0

    def merged(self, count: float, mean: float, m2: float) -> "Moments":
        """These moments and a batch's, merged (Chan et al. 1979, the parallel form of Welford's
        update): exact for any split of the values into batches."""
        if count == 0:
            return self
        total = self.count + count
        delta = mean - self.mean
        return Moments(total, self.mean + delta * count / total,
                       self.m2 + m2 + delta * delta * self.count * count / total)


def batch_moments(values: torch.Tensor) -> tuple[float, float, float]:
    """(count, mean, M2) of a (N,) tensor, in float64."""
    v = values.double()
    n = float(v.numel())
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = float(v.mean())
    return n, mean, float(((v - mean) ** 2).sum())


def normalise(values: torch.Tensor, moments: Moments, eps: float = 1e-6) -> torch.Tensor:
    """(values - mean) / (std + eps) under ``moments``; (B,) -> (B,) float32."""
    return ((values.double() - moments.mean) / (moments.std + eps)).float()
