"""Which ranks sample together, and which samples each rank trains on.

With vLLM's ``external_launcher``, ``rollout.tensor_parallel_size = k`` makes every k consecutive
ranks one tensor-parallel engine (vLLM carves its TP groups out of the world in rank order), and
the k ranks of a group must submit IDENTICAL requests: same prompts, same sampling seeds. So the
step's prompts are split over the W / k rollout groups, each group samples its share once, and
the group's outputs are then split again, prompt by prompt, over its k ranks for training:
the training batch is still split per rank, and a prompt's samples never straddle ranks.

Pure arithmetic, no torch; tested for 1-8 ranks and TP 1, 2, 4 (tests/engines/test_rollout_groups.py).
"""
from __future__ import annotations

from dataclasses import dataclass


def contiguous_share(n_items: int, part: int, n_parts: int) -> range:
    """Part ``part`` of ``n_items`` split into ``n_parts`` contiguous shares (ceil-sized, so the
    last shares may be shorter or empty)."""
    per = -(-n_items // n_parts)
    start = min(part * per, n_items)
    return range(start, min(start + per, n_items))


@dataclass(frozen=True)
class RolloutGroups:
    """W ranks in W / k rollout groups of k = ``tp_size`` consecutive ranks."""
    world_size: int
    tp_size: int = 1

    def __post_init__(self):
        if self.world_size < 1 or self.tp_size < 1:
            raise ValueError(f"world_size and tp_size must be >= 1, got {self.world_size}, {self.tp_size}")
        if self.world_size % self.tp_size:
            raise ValueError(f"rollout.tensor_parallel_size ({self.tp_size}) must divide the number of "
                             f"ranks ({self.world_size})")

    @property
    def num_groups(self) -> int:
        return self.world_size // self.tp_size

    def group_of(self, rank: int) -> int:
        """The rollout group (vLLM data-parallel replica) ``rank`` belongs to."""
        return rank // self.tp_size

    def members(self, group: int) -> range:
        return range(group * self.tp_size, (group + 1) * self.tp_size)

    def group_prompts(self, n_prompts: int, group: int) -> range:
        """Global prompt indices that ``group`` samples (the same on each of its ranks)."""
        return contiguous_share(n_prompts, group, self.num_groups)

    def train_prompts(self, n_prompts: int, rank: int) -> range:
        """Global prompt indices whose samples ``rank`` trains on: its part of its group's share."""
        share = self.group_prompts(n_prompts, self.group_of(rank))
        part = contiguous_share(len(share), rank % self.tp_size, self.tp_size)
        return range(share.start + part.start, share.start + part.stop)
