"""The step's diagnostics are over the global batch: the critic's explained variance pools every
rank's tokens before it divides, instead of averaging each shard's own ratio (the bug that makes a
critic which only learned each shard's mean look like one that learned nothing)."""
from types import SimpleNamespace

import pytest
import torch

from tests.gloo_ranks import run_on_two_ranks
from vcppo.algos.stats import explained_variance
from vcppo.driver.step.metrics import step_metrics
from vcppo.driver.step.step_plan import Source
from vcppo.driver.step.timeline import PhaseTimer
from vcppo.experience import Advantages, BeforeUpdate, CriticResult
from vcppo.config.schema import Config

T = 5  # response tokens


def shard(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank r's (values, returns, mask): returns spread around 4r, values = 4r everywhere. Inside a
    shard the critic explains nothing (EV 0: it predicts the shard's mean); over both shards it
    explains the gap between them, most of the variance."""
    returns = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand(4, T) + 4.0 * rank
    mask = torch.ones(4, T)
    mask[1, 3:] = 0  # a padded tail: its tokens count nowhere
    returns = returns * mask
    values = torch.full((4, T), 4.0 * rank) * mask
    return values, returns, mask


def _worker(rank, out):
    values, returns, mask = shard(rank)
    rollout = SimpleNamespace(policy_mask=mask, scores=torch.zeros(4), correct=torch.zeros(4),
                              truncated=torch.zeros(4), response_lengths=mask.sum(1))
    plan = SimpleNamespace(v_old=Source.PASS, sampler_logprobs=False, pi_old=Source.PASS, entropy=Source.NONE)
    cfg = Config()
    cfg.logging.profile_buckets = 4
    ctx = SimpleNamespace(cfg=cfg)
    timer = PhaseTimer()
    timer.seconds["rollout"] = 1.0
    m = step_metrics(ctx, plan, rollout, BeforeUpdate(old_values=values), Advantages(returns, returns), timer,
                     CriticResult(returns=returns, metrics={}))
    out[rank] = m["critic/explained_variance"]


def test_explained_variance_is_over_the_global_batch_not_a_mean_of_shards():
    shards = [shard(r) for r in (0, 1)]
    pooled = float(explained_variance(*(torch.cat(parts) for parts in zip(*shards))))
    per_shard = [float(explained_variance(*s)) for s in shards]
    assert per_shard == pytest.approx([0.0, 0.0], abs=1e-6) and pooled > 0.8  # the case tells them apart
    out = run_on_two_ranks(_worker)
    assert out[0] == pytest.approx(pooled, rel=1e-5) and out[1] == pytest.approx(pooled, rel=1e-5)
