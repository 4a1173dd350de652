"""Fake engines and a fake run context: every step plan runs through the real driver code in
milliseconds (the real engines run in tests/driver/test_train_e2e.py and tests/engines/).

A fake model's per-token outputs are a fixed function of the tokens plus an offset that each
applied optimizer step moves, so a test can tell outputs before an update from outputs after it.
Every call that matters is recorded, in order, in ``FakeRun.calls``.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from vcppo.driver.step.critic_side import LocalCritic
from vcppo.engines.deepspeed_engine import stitch_rows
from vcppo.engines.loss_contract import GlobalCounts, ModelOutputs
from vcppo.runtime.dist import DistInfo
from vcppo.experience import Rollout, make_layout
from vcppo.config.schema import Config
from vcppo.methods import uses_critic


def scored(groups: list[list[float]], first: int = 0, lengths: list[int] | None = None,
           prompt_len: int | None = None, sampler_logprobs: bool = True) -> Rollout:
    """A rollout as the sampler lays it out: ``groups[g]`` holds the scores of prompt ``first + g``'s
    samples (prompt-major); response i has ``lengths[i]`` tokens."""
    scores = [s for g in groups for s in g]
    lengths = lengths or [3 + (i % 3) for i in range(len(scores))]
    prompts = [[1] * (prompt_len or 2 + g % 2) for g, grp in enumerate(groups) for _ in grp]
    layout = make_layout(prompts, [[5 + (i + t) % 4 for t in range(n)] for i, n in enumerate(lengths)], pad_id=0)
    B, R = layout.responses.shape
    score_t = torch.tensor(scores, dtype=torch.float32)
    token_rewards = torch.zeros(B, R)
    token_rewards[torch.arange(B), torch.tensor(lengths) - 1] = score_t
    return Rollout(**layout.layout_fields(), scores=score_t, token_rewards=token_rewards,
                   group=torch.tensor([first + g for g, grp in enumerate(groups) for _ in grp]),
                   correct=(score_t > 0).float(), truncated=torch.zeros(B),
                   sampler_logprobs=-0.5 * layout.policy_mask if sampler_logprobs else None)


class FakeEngine:
    """An actor / critic / reference stand-in: forward passes, ``train_step`` calling the loss on
    every micro-batch as the real engine does, and a weight offset that each step moves."""

    def __init__(self, name: str, calls: list, micro_batch_size: int = 3):
        self.name, self.calls, self.micro_batch_size = name, calls, micro_batch_size
        self.offset = 0.0

    def _outputs(self, micro, need_entropy: bool = True) -> ModelOutputs:
        mask = micro.policy_mask
        token = micro.responses.float()
        pos = torch.arange(mask.shape[1], dtype=torch.float32)
        return ModelOutputs(logprobs=(-0.1 * (token % 7 + 1) - self.offset) * mask,
                            entropy=(0.5 + self.offset) * mask if need_entropy else None,
                            values=(0.01 * pos + self.offset) * mask)

    def micro_batch_rows(self, batch) -> list[list[int]]:
        return [list(range(s, min(s + self.micro_batch_size, batch.size)))
                for s in range(0, batch.size, self.micro_batch_size)]

    def train_step_outputs(self, minibatch, kept):
        groups = self.micro_batch_rows(minibatch)
        return stitch_rows(groups, kept[:len(groups)])

    def forward_logprobs(self, batch, with_entropy: bool = False):
        self.calls.append(f"{self.name}:forward")
        out = self._outputs(batch)
        return out.logprobs, out.entropy if with_entropy else None

    def forward_values(self, batch):
        self.calls.append(f"{self.name}:forward")
        return self._outputs(batch).values

    def train_step(self, minibatch, loss) -> dict:
        self.calls.append(f"{self.name}:train_step")
        counts = GlobalCounts.over_ranks(loss.count_masks(minibatch))
        records = [loss(self._outputs(minibatch.select(rows), loss.needs_entropy), minibatch.select(rows), counts)[1]
                   for rows in self.micro_batch_rows(minibatch)]
        self.offset += 0.25  # the update moved the weights
        metrics = {k: float(sum(float(r[k]) for r in records)) for k in records[0]} if records else {}
        return {**metrics, "grad_norm": 1.0, "lr": 1e-6, "nonfinite_skipped": 0.0}


class FakeRun:
    """The parts of :class:`~vcppo.driver.context.RunContext` a step touches. ``overrides``:
    ``{"section.key": value}`` set on a default :class:`~vcppo.config.schema.Config`."""

    def __init__(self, rank: int = 0, world_size: int = 1, **overrides):
        self.cfg = Config()
        self.cfg.trainer.prompts_per_step = 4
        self.cfg.rollout.n_samples_per_prompt = 2
        for key, value in overrides.items():
            section, name = key.split(".")
            setattr(getattr(self.cfg, section), name, value)
        self.calls: list[str] = []
        record = lambda name: (lambda *a, **k: self.calls.append(name))  # noqa: E731
        self.rollout = SimpleNamespace(sleep=record("sleep"), wake_up=record("wake_up"), replica=0)
        self.scorer = SimpleNamespace(num_failures=0, num_timeouts=0, num_scored=0)
        self.actor = FakeEngine("actor", self.calls)
        gae = uses_critic(self.cfg.algorithm.advantage_estimator)
        self.critic = LocalCritic(self.cfg, FakeEngine("critic", self.calls)) if gae else None
        self.reference = FakeEngine("reference", self.calls) if self.cfg.algorithm.kl_coef > 0 else None
        self.reward_model = None
        self.dist = DistInfo(rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"),
                             backend="gloo", is_main=rank == 0)
        self.timeline = None

    def sync_weights(self) -> float:
        self.calls.append("weight_sync")
        return 0.0


class ScriptedMaker:
    """An :class:`~vcppo.driver.step.experience_maker.ExperienceMaker` whose sampling rounds are scripted."""

    def __new__(cls, run: FakeRun, rounds: list[Rollout], logprobs: bool = True):
        from vcppo.driver.step.experience_maker import ExperienceMaker

        class Maker(ExperienceMaker):
            def sample_round(self, phase, step, balance=True):
                run.calls.append(f"sample:{phase}" + ("" if balance else ":unbalanced"))
                return self.rounds.pop(0)

        maker = Maker(run.cfg, run.dist, prompts=None, rollout=run.rollout, scorer=run.scorer, pad_id=0,
                      logprobs=logprobs)
        maker.rounds = list(rounds)
        return maker


def scripted_source(run: FakeRun, rounds: list[Rollout], logprobs: bool = True):
    """A colocated experience source (what `vcppo train` steps with) over a :class:`ScriptedMaker`."""
    from vcppo.driver.placement.colocated import ColocatedSource
    return ColocatedSource(run, ScriptedMaker(run, rounds, logprobs=logprobs))
