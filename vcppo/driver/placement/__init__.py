"""Placement: the split protocol and the rollout ranks, and the critic on ranks of its own (its link's
messages, the actor ranks' side, the critic ranks' side)."""
