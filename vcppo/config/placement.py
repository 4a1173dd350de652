"""Where a run's parts live (``placement.mode``): the :class:`Placement` protocol, its table of
implementations (:data:`PLACEMENTS`), and the rank arithmetic the implementations share.

A placement is one class in a module of its own (``vcppo/driver/placement/colocated.py``,
``split.py``) and one row of :data:`PLACEMENTS` naming it as ``"module:Class"`` (imported on first use,
as the methods table's rows are, so the config checks and ``vcppo plan`` read it without torch). It is
built once (:meth:`Placement.of`: once per run by the driver, once per loaded config by the rules, once per
plan by the planner) and passed on; it answers everything that depends on where the parts live:

* its config rules (:meth:`Placement.check`) and the launched rank counts (:meth:`Placement.check_ranks`);
* the planner's shares: the ranks that train and sample (:meth:`Placement.ranks`), whether sampling has
  ranks of its own (``rollout_apart``), the critic too (``critic_apart``), whether sampling overlaps
  training (``overlapped``);
* the run's parts: its process groups (:meth:`Placement.init_groups`), what a rank of each role
  serves instead of training (:meth:`Placement.serves`), which roles sample (:meth:`Placement.samples_on`),
  a training rank's experience source (:meth:`Placement.source`) and its critic side
  (:meth:`Placement.remote_critic`).

Nothing else reads ``placement.mode`` or branches on a placement's name (tests/test_architecture.py).
:class:`Roles` is the rank arithmetic of a placement whose ranks have roles (which launched rank does
what). docs/architecture.md, "How to add ... a placement", lists what a new one changes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from vcppo.errors import ConfigError

TRAIN, CRITIC, ROLLOUT, BOTH = "train", "critic", "rollout", "both"  # a rank's role

# placement.mode -> "module:Class" of its implementation (a subclass of Placement). The schema's choices.
PLACEMENTS = {
    "colocated": "vcppo.driver.placement.colocated:Colocated",
    "split": "vcppo.driver.placement.split:Split",
}


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


class Placement:
    """The protocol every placement implements; the defaults are those of a placement whose every rank
    samples and trains (role ``both``). ``world`` below is the number of launched ranks (GPUs, for
    the planner). Built from the config (``cfg``: a :class:`vcppo.config.schema.Config`, which offers
    PLACEMENTS' rows as ``placement.mode``'s choices) by :meth:`of`; its keys are read here and nowhere else."""
    name = ""              # its placement.mode (its row in PLACEMENTS)
    rollout_apart = False  # sampling on ranks of its own: the training ranks hold no vLLM, read no prompts
    reshards = True        # a checkpoint resumes on another number of training ranks (converted)
    sequence_parallel = True  # SP groups can be built over its training ranks

    def __init__(self, cfg):
        p = cfg.placement
        self.rollout_ranks = p.rollout_ranks    # ranks that only sample (where sampling has ranks of its own)
        self.critic_ranks = p.critic_ranks      # ranks that hold only the critic (0: beside the actor)
        self.max_staleness = cfg.trainer.max_staleness  # steps sampling may run ahead of training

    @classmethod
    def of(cls, cfg) -> "Placement":
        """The run's placement: the class ``placement.mode``'s row names, built from ``cfg``."""
        from vcppo.methods import load_fn
        return load_fn(PLACEMENTS[cfg.placement.mode])(cfg)

    # --- the config's and the planner's answers (no torch) -----------------------------------------
    @property
    def critic_apart(self) -> bool:
        """The critic on ranks of its own (its passes beside the actor's, over a link)."""
        return False

    @property
    def overlapped(self) -> bool:
        """Sampling runs ahead of training (a step's time is the longer of the two, not their sum)."""
        return False

    @property
    def rollout_beside_training(self) -> bool:
        """vLLM shares the training ranks (and their memory): it sleeps while they train."""
        return not self.rollout_apart

    def check(self, cfg) -> None:
        """Its config rules: a ConfigError naming the key of a setting it cannot run."""

    def ranks(self, world: int) -> tuple[int, int]:
        """(training ranks, rollout ranks) among ``world``."""
        return world, world

    def check_ranks(self, cfg, world: int) -> None:
        """The launched rank counts (and the prompts each step shares out), checked on every rank
        before any process group exists."""
        check_share(cfg.trainer.prompts_per_step, world, "number of ranks")

    def samples_on(self, role: str) -> bool:
        """Whether a rank of ``role`` samples (holds vLLM, reads the prompts)."""
        return role in (BOTH, ROLLOUT)

    def describe(self) -> str:
        """The start-up line's account of where the parts live, for a rank that reads no prompts."""
        return f"{self.name} placement"

    # --- the run's parts (the driver's; imported where they are asked for) ---------------------------
    def init_groups(self, cfg):
        """This rank's process groups, set up once: its :class:`vcppo.runtime.dist.DistInfo`."""
        raise NotImplementedError

    def serves(self) -> dict[str, Callable]:
        """{role: what a rank of that role does instead of training, ``fn(cfg, run_dir, placement)``}."""
        return {}

    def source(self, ctx, plan):
        """A training rank's :class:`~vcppo.driver.parts.ExperienceSource`."""
        raise NotImplementedError

    def remote_critic(self, resume_point):
        """The critic started on ranks of its own (a :class:`~vcppo.driver.step.critic_side.Critic`),
        or None: the training ranks build it."""
        return None


def check_share(prompts_per_step: int, ranks: int, what: str, where: str = "") -> None:
    """Every rank of a group gets the same number of a step's prompts."""
    if prompts_per_step % ranks:
        raise ConfigError(f"config key 'trainer.prompts_per_step' ({prompts_per_step}) must be divisible by "
                          f"the {what} ({ranks}){where}")
