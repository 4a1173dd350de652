"""Split placement (``placement.mode=split``): the last ``placement.rollout_ranks`` launched ranks only
sample (vLLM), ``placement.critic_ranks`` ranks before them may hold the critic only, and the first ones
train (ZeRO-3 among themselves). Weights and samples cross between them over the bridge
(:mod:`vcppo.runtime.bridge`), sampling up to ``trainer.max_staleness`` steps ahead.

:class:`Split` owns all of it: its config rules, its rank counts, its process groups (each role's world,
the bridge, the critic links), what its rollout ranks (:mod:`~vcppo.driver.placement.rollout_ranks`)
and critic ranks (:mod:`~vcppo.driver.placement.critic_ranks`) serve, its training ranks' source
(:mod:`~vcppo.driver.placement.training_ranks`) and their critic side
(:mod:`~vcppo.driver.placement.training_ranks`). Its row: ``"split"`` in
:data:`vcppo.config.placement.PLACEMENTS`. Only its answers are imported with it (no torch); its parts
are imported where they are asked for.
"""
from __future__ import annotations

from typing import Callable

from vcppo.config.placement import CRITIC, ROLLOUT, Placement, Roles, check_share
from vcppo.errors import ConfigError
from vcppo.methods import uses_critic


class Split(Placement):
    name = "split"
    rollout_apart = True
    reshards = False  # a checkpoint resumes on the training ranks that wrote it only
    sequence_parallel = False  # SP groups are built over colocated ranks only, so far

    def __init__(self, cfg):
        super().__init__(cfg)
        self.bridge = None       # trainer 0 and the rollout ranks: the runtime.bridge.Bridge (init_groups)
        self.critic_link = None  # a training rank and its critic rank: their runtime.bridge.CriticLink

    @property
    def critic_apart(self) -> bool:
        return self.critic_ranks > 0

    @property
    def overlapped(self) -> bool:
        return self.max_staleness > 0

    def check(self, cfg) -> None:
        if cfg.rollout.tensor_parallel_size > 1:
            raise ConfigError(f"config key 'rollout.tensor_parallel_size' ({cfg.rollout.tensor_parallel_size}) must "
                              "be 1 with placement.mode=split: tensor-parallel rollout groups are not built on "
                              "rollout ranks yet (each rollout rank runs one whole engine)")
        if self.critic_ranks and not uses_critic(cfg.algorithm.advantage_estimator):
            raise ConfigError(f"config key 'placement.critic_ranks' ({self.critic_ranks}) needs a critic, and "
                              f"algorithm.advantage_estimator={cfg.algorithm.advantage_estimator!r} has none")
        if cfg.rollout.lora_sync == "adapter":
            raise ConfigError("config key 'rollout.lora_sync' must be 'merged' with placement.mode=split (the rollout "
                              "ranks receive full weights)")
        for section in ("actor", "critic"):
            size = getattr(cfg, section).sequence_parallel_size
            if size > 1 and not self.sequence_parallel and (section == "actor" or uses_critic(
                    cfg.algorithm.advantage_estimator)):
                raise ConfigError(f"config key '{section}.sequence_parallel_size' ({size}) is not supported with "
                                  "placement.mode=split yet (SP groups are built over the colocated ranks); use "
                                  "placement.mode=colocated or sequence_parallel_size=1")

    def roles(self, world: int) -> Roles:
        """The rank layout over ``world`` launched ranks (ConfigError naming the key)."""
        try:
            return Roles(world, self.rollout_ranks, self.critic_ranks)
        except ValueError as e:
            raise ConfigError(f"config key {e}") from None

    def ranks(self, world: int) -> tuple[int, int]:
        """With critic ranks the training ranks are the actor's (the critic has as many of its own)."""
        return self.roles(world).train_ranks, self.rollout_ranks

    def check_ranks(self, cfg, world: int) -> None:
        train, rollout = self.ranks(world)
        check_share(cfg.trainer.prompts_per_step, rollout, "placement.rollout_ranks", " in placement.mode=split")
        check_share(cfg.trainer.prompts_per_step, train, "training ranks", " in placement.mode=split")

    def describe(self) -> str:
        return f"split placement: {self.rollout_ranks} rollout rank(s) sample" + \
            (f", {self.critic_ranks} critic rank(s) hold the critic" if self.critic_ranks else "")

    # --- the run's parts ---------------------------------------------------------------------------
    def init_groups(self, cfg):
        from vcppo.runtime import dist as D
        return D.init_distributed(cfg.trainer.device, **D.timeouts(cfg.trainer), groups=self._groups)

    def _groups(self, g):
        """This rank's role world as the default group, then the bridge and the critic links
        (:class:`vcppo.runtime.dist.GroupSetup` in, its DistInfo out). A critic world's rank 0 is its
        main rank (it writes the critic's exports)."""
        from datetime import timedelta

        import deepspeed

        from vcppo.runtime.bridge import Bridge, CriticLink, init_role_world
        from vcppo.runtime.dist import DistInfo
        from vcppo.runtime.launch_env import skip_shm_collective
        roles, timeout = Roles(g.world, self.rollout_ranks, self.critic_ranks), timedelta(seconds=g.timeout_s)
        if g.device.type == "cpu":
            # DeepSpeed's CPU shm all-reduce sizes itself by the node's launcher ranks, which now
            # include the rollout ranks: plain gloo collectives within the training world instead.
            skip_shm_collective()
        init_role_world(roles, g.rank, g.backend, timeout, g.store)
        deepspeed.init_distributed(dist_backend=g.backend, auto_mpi_discovery=False)  # adopts the role world
        role = roles.role_of(g.rank)
        if roles.bridge_rank(g.rank) is not None:
            self.bridge = Bridge(g.store, roles, g.rank, g.backend, g.device, timeout)
        if roles.critic_partner(g.rank) is not None:
            self.critic_link = CriticLink(g.store, roles, g.rank, timeout)
        main = g.rank == 0 or (role == CRITIC and roles.role_rank(g.rank) == 0)
        return DistInfo(rank=roles.role_rank(g.rank), world_size=roles.role_size(g.rank), local_rank=g.local_rank,
                        device=g.device, backend=g.backend, is_main=main, role=role)

    def serves(self) -> dict[str, Callable]:
        from vcppo.driver.placement.critic_ranks import serve_critic
        from vcppo.driver.placement.rollout_ranks import serve_rollouts
        return {ROLLOUT: serve_rollouts, CRITIC: serve_critic}

    def source(self, ctx, plan):
        """Batches from the rollout ranks (trainer 0 receives them over the bridge), weights back."""
        from vcppo.driver.placement.training_ranks import RemoteSource
        return RemoteSource(ctx, self.bridge)

    def remote_critic(self, resume_point):
        if not self.critic_apart:
            return None
        from vcppo.driver.placement.training_ranks import start_remote_critic
        return start_remote_critic(self.critic_link, resume_point)
