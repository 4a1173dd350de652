"""Where a run's parts live (``placement.*``), answered by one object built once from the config.

:class:`Placement` says which role a launched rank has, how many ranks train, sample and hold the
critic, whether the critic lives on ranks of its own, whether sampling overlaps training, what the
placement does not support, and the rank counts a run needs. The config rules, the planner, the
process groups and the driver ask it rather than reading ``placement.mode``. :class:`Roles` is split
placement's rank arithmetic (which launched rank does what).

Two placements exist: ``colocated`` (every rank samples with its own vLLM between its updates, role
``both``) and ``split`` (the last ``rollout_ranks`` only sample, ``critic_ranks`` more may hold the
critic only, the first ones train). A new one is a mode here, its rank arithmetic, and its experience
source in ``vcppo/driver/placement/`` (docs/architecture.md, "How to add ... a placement").
"""
from __future__ import annotations

from dataclasses import dataclass

from vcppo.config.schema import Config
from vcppo.errors import ConfigError

TRAIN, CRITIC, ROLLOUT, BOTH = "train", "critic", "rollout", "both"  # a rank's role
SPLIT = "split"  # placement.mode: "colocated" (the default) or this


@dataclass(frozen=True)
class Roles:
    """W launcher ranks: the first ``world_size - critic_ranks - rollout_ranks`` train (the actor,
    and the critic unless it has ranks of its own), the next ``critic_ranks`` hold the critic only,
    the last ``rollout_ranks`` sample (so on a multi-node launch the rollout ranks fill the last
    node(s)). Critic rank i serves training rank i, so there are as many of each."""
    world_size: int
    rollout_ranks: int
    critic_ranks: int = 0

    def __post_init__(self):
        if not 1 <= self.rollout_ranks < self.world_size - self.critic_ranks:
            raise ValueError(f"'placement.rollout_ranks' ({self.rollout_ranks}) must leave at least one training "
                             f"rank among the {self.world_size} launched ranks, after {self.critic_ranks} critic rank(s)")
        if self.critic_ranks and self.critic_ranks != self.train_ranks:
            raise ValueError(f"'placement.critic_ranks' ({self.critic_ranks}) must equal the number of actor ranks "
                             f"({self.train_ranks} of the {self.world_size} launched ranks): critic rank i serves "
                             "actor rank i")

    @property
    def train_ranks(self) -> int:
        """The actor's ranks (and the critic's, without ranks of its own)."""
        return self.world_size - self.rollout_ranks - self.critic_ranks

    def role_of(self, rank: int) -> str:
        if rank < self.train_ranks:
            return TRAIN
        return CRITIC if rank < self.train_ranks + self.critic_ranks else ROLLOUT

    def _first(self, role: str) -> int:
        return {TRAIN: 0, CRITIC: self.train_ranks, ROLLOUT: self.train_ranks + self.critic_ranks}[role]

    def role_rank(self, rank: int) -> int:
        """The rank within its role world."""
        return rank - self._first(self.role_of(rank))

    def role_size(self, rank: int) -> int:
        return {TRAIN: self.train_ranks, CRITIC: self.critic_ranks, ROLLOUT: self.rollout_ranks}[self.role_of(rank)]

    def bridge_rank(self, rank: int) -> int | None:
        """0 for training rank 0, 1..R for the rollout ranks, None for the other ranks."""
        if rank == 0:
            return 0
        return rank - self._first(ROLLOUT) + 1 if self.role_of(rank) == ROLLOUT else None

    def critic_partner(self, rank: int) -> int | None:
        """The training rank's critic rank, or the critic rank's training rank (None: no partner)."""
        if not self.critic_ranks or self.role_of(rank) == ROLLOUT:
            return None
        return rank + self.train_ranks if rank < self.train_ranks else rank - self.train_ranks


@dataclass(frozen=True)
class Placement:
    """The run's placement (``Placement.of(cfg)``); ``world`` below is the number of launched ranks
    (GPUs, for the planner)."""
    mode: str            # "colocated" or SPLIT
    rollout_ranks: int   # split: ranks that only sample
    critic_ranks: int    # split: ranks that hold only the critic (0: the critic trains beside the actor)
    max_staleness: int   # split: how many steps sampling may run ahead of training

    @classmethod
    def of(cls, cfg: Config) -> "Placement":
        p = cfg.placement
        return cls(p.mode, p.rollout_ranks, p.critic_ranks, cfg.trainer.max_staleness)

    @property
    def split(self) -> bool:
        """Sampling on ranks of its own: the training ranks hold no vLLM and read no prompts."""
        return self.mode == SPLIT

    @property
    def critic_apart(self) -> bool:
        """The critic on ranks of its own (its passes beside the actor's, over a link)."""
        return self.split and self.critic_ranks > 0

    @property
    def overlapped(self) -> bool:
        """Sampling runs ahead of training (a step's time is the longer of the two, not their sum)."""
        return self.split and self.max_staleness > 0

    @property
    def rollout_beside_training(self) -> bool:
        """vLLM shares the training ranks (and their memory): it sleeps while they train."""
        return not self.split

    def roles(self, world: int) -> Roles:
        """Split placement's rank layout over ``world`` launched ranks (ConfigError naming the key)."""
        try:
            return Roles(world, self.rollout_ranks, self.critic_ranks)
        except ValueError as e:
            raise ConfigError(f"config key {e}") from None

    def ranks(self, world: int) -> tuple[int, int]:
        """(training ranks, rollout ranks) among ``world``: colocated, every rank does both; with
        critic ranks the training ranks are the actor's (the critic has as many of its own)."""
        if not self.split:
            return world, world
        return self.roles(world).train_ranks, self.rollout_ranks

    def check_ranks(self, world: int, prompts_per_step: int) -> None:
        """The rank counts against ``world`` launched ranks and the prompts each step shares out."""
        if not self.split:
            check_share(prompts_per_step, world, "number of ranks")
            return
        train, rollout = self.ranks(world)
        check_share(prompts_per_step, rollout, "placement.rollout_ranks", " in placement.mode=split")
        check_share(prompts_per_step, train, "training ranks", " in placement.mode=split")

    def samples_on(self, role: str) -> bool:
        """Whether a rank of ``role`` samples (holds vLLM, reads the prompts)."""
        return role in (BOTH, ROLLOUT)

    def dist_args(self) -> dict:
        """The process groups' keyword arguments (:func:`vcppo.engines.dist.init_distributed`)."""
        if not self.split:
            return {}
        return {"split_rollout_ranks": self.rollout_ranks, "split_critic_ranks": self.critic_ranks}

    def describe(self) -> str:
        """The start-up line's account of a split run's ranks (a split run's training rank says it)."""
        return f"split placement: {self.rollout_ranks} rollout rank(s) sample" + \
            (f", {self.critic_ranks} critic rank(s) hold the critic" if self.critic_ranks else "")


def check_share(prompts_per_step: int, ranks: int, what: str, where: str = "") -> None:
    """Every rank of a group gets the same number of a step's prompts."""
    if prompts_per_step % ranks:
        raise ConfigError(f"config key 'trainer.prompts_per_step' ({prompts_per_step}) must be divisible by "
                          f"the {what} ({ranks}){where}")
