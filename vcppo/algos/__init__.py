"""Pure tensor math for VC-PPO / VAPO: GAE, losses, statistics. No engines, no config objects.

The Triton kernel (`vcppo.algos.gae_triton`) is imported lazily by `decoupled_gae`, so importing
this package does not require triton.
"""
from vcppo.algos.gae import decoupled_gae, gae_reference, length_adaptive_lambda, triton_available
from vcppo.algos.kl import KL_ESTIMATORS, adaptive_kl_coef, kl_estimate, sequence_mean_kl
from vcppo.algos.losses import (
    AGGREGATIONS,
    aggregate_loss,
    entropy_from_logits,
    policy_loss,
    positive_example_nll,
    value_loss,
)
from vcppo.algos.stats import (
    PositionProfile,
    advantage_position_correlation,
    advantage_position_profile,
    explained_variance,
    grpo_advantages,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    pass_at_k,
)

__all__ = [
    "decoupled_gae", "gae_reference", "length_adaptive_lambda", "triton_available",
    "AGGREGATIONS", "aggregate_loss", "entropy_from_logits", "policy_loss",
    "KL_ESTIMATORS", "adaptive_kl_coef", "kl_estimate", "sequence_mean_kl",
    "positive_example_nll", "value_loss",
    "PositionProfile", "advantage_position_correlation", "advantage_position_profile",
    "explained_variance", "grpo_advantages", "masked_mean", "masked_sum", "masked_var",
    "masked_whiten", "pass_at_k",
]
