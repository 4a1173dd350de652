"""Placements, one module each (colocated.py, split.py: a :class:`vcppo.config.placement.Placement` and
a row of :data:`vcppo.config.placement.PLACEMENTS`), and split placement's parts: its protocol and
rollout ranks, and the critic on ranks of its own (its link's messages, the actor ranks' side, the
critic ranks' side)."""
