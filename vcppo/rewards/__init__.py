"""Outcome rewards: answer extraction after </think>, integer / math-verify equivalence,
custom reward functions by dotted path."""
from vcppo.rewards.verifier import (RewardScorer, extract_answer, is_equivalent, load_reward_fn,
                                    parse_int, score, score_batch)

__all__ = ["RewardScorer", "extract_answer", "is_equivalent", "load_reward_fn", "parse_int", "score",
           "score_batch"]
