"""The experience maker: DAPO dynamic sampling, SPMD agreement on
two ranks, on scripted sampling rounds (no engine; the real ones run in test_train_e2e.py)."""
from types import SimpleNamespace

import pytest
import torch

from tests.fakes import FakeRun, ScriptedMaker, scored
from tests.gloo_ranks import run_on_two_ranks
from vcppo.config.schema import Config

N = 2  # samples per prompt


def make(rounds, phase="ppo", step=1, rank=0, world_size=1, **cfg):
    run = FakeRun(rank=rank, world_size=world_size, **cfg)
    batch, metrics = ScriptedMaker(run, rounds).make(phase, step)
    return run, batch, metrics


def test_dynamic_sampling_refills_with_informative_groups():
    # Round 0: groups 0 and 2 informative. Round 1: groups 1, 2, 3 informative -> the first two fill up.
    r0 = scored([[1, -1], [1, 1], [-1, 1], [-1, -1]])
    r1 = scored([[1, 1], [1, -1], [-1, 1], [1, -1]], prompt_len=4, lengths=[9, 1, 2, 8, 7, 7, 1, 1])
    ctx, batch, m = make([r0, r1], step=3, **{"trainer.dynamic_sampling": True})
    assert ctx.calls == ["sample:ppo:unbalanced", "sample:ppo/retry1:unbalanced"]
    assert batch.size == 4 * N
    # ids of round 1 are shifted by prompts_per_step (4) so groups of different rounds never merge
    assert batch.group.tolist() == [0, 0, 2, 2, 5, 5, 6, 6]
    assert batch.scores.tolist() == [1, -1, -1, 1, 1, -1, -1, 1]
    assert {k: v for k, v in m.items() if k.startswith("dynamic_sampling/")} == {
        "dynamic_sampling/tries": 2.0, "dynamic_sampling/dropped_groups": 3.0,
        "dynamic_sampling/sampled_groups": 8.0, "dynamic_sampling/filled_groups": 0.0}
    assert m["reward/step_failures"] == 0.0  # the reward guard's tally brackets every round
    # Rows keep their tokens and rewards through the concatenation (round 1's prompt widths differ).
    assert torch.equal(batch.token_rewards.sum(1), batch.scores)
    # Widths: round 1's 4-token prompts; its dropped 9-token response does not pad the batch.
    assert (batch.prompt_len, batch.responses.shape[1]) == (4, 8)
    assert batch.policy_mask.sum(1).tolist() == [3, 4, 4, 5, 2, 8, 7, 7]


def test_dynamic_sampling_stops_at_max_tries_and_fills_with_dropped_groups():
    rounds = [scored([[1, 1], [-1, -1], [1, -1], [1, 1]]), scored([[-1, -1]] * 4), scored([[1, 1]] * 4)]
    ctx, batch, m = make(rounds, **{"trainer.dynamic_sampling": True, "trainer.dynamic_sampling_max_tries": 2})
    assert len(ctx.calls) == 2
    assert batch.size == 4 * N
    # the one informative group first, then the earliest dropped groups
    assert batch.group.tolist() == [2, 2, 0, 0, 1, 1, 3, 3]
    assert m["dynamic_sampling/filled_groups"] == 3.0 and m["dynamic_sampling/dropped_groups"] == 7.0


def test_dynamic_sampling_is_a_no_op_when_every_group_is_informative_or_when_off():
    r0 = scored([[1, -1], [-1, 1], [1, -1], [-1, 1]])
    ctx, batch, m = make([r0], **{"trainer.dynamic_sampling": True})
    assert ctx.calls == ["sample:ppo:unbalanced"] and m["dynamic_sampling/tries"] == 1.0
    assert torch.equal(batch.input_ids, r0.input_ids) and torch.equal(batch.scores, r0.scores)
    _, batch, m = make([scored([[1, 1]] * 4)])
    assert not any(k.startswith("dynamic_sampling/") for k in m) and batch.size == 4 * N
    # value pretraining samples the policy's own prompt distribution: never filtered
    pre, batch, _ = make([scored([[1, 1]] * 4)], phase="value_pretrain", **{"trainer.dynamic_sampling": True})
    assert batch.size == 4 * N and pre.calls == ["sample:value_pretrain"]


def _two_rank_worker(rank, out):
    # Each rank holds 2 of the step's 4 prompts. Rank 0's first round is all informative, rank 1's
    # has one informative group: both ranks must run the second round (same prompt stream).
    for balance in (False, True):
        first = [scored([[1, -1], [-1, 1]], first=0), scored([[1, 1], [1, -1]], first=2)][rank]
        second = [scored([[1, 1], [1, 1]], first=0), scored([[-1, 1], [1, 1]], first=2, lengths=[30, 30, 2, 2])][rank]
        ctx, batch, m = make([first, second, scored([[1, -1], [1, -1]])], rank=rank, world_size=2,
                             **{"trainer.dynamic_sampling": True, "trainer.balance_batch": balance})
        out[(rank, balance)] = (ctx.calls, batch.group.tolist(), batch.policy_mask.sum(1).tolist(), m)


@pytest.mark.distributed
def test_two_ranks_agree_on_the_number_of_rounds():
    out = run_on_two_ranks(_two_rank_worker)
    (calls0, groups0, _, m0), (calls1, groups1, _, m1) = out[(0, False)], out[(1, False)]
    assert calls0 == calls1 == ["sample:ppo:unbalanced", "sample:ppo/retry1:unbalanced"]
    assert groups0 == [0, 0, 1, 1]            # rank 0 was full after round 0
    assert groups1 == [3, 3, 6, 6]            # rank 1: group 3, then round 1's prompt 2 (id 2 + 4)
    assert m0 == m1                           # metrics are global
    assert m0["dynamic_sampling/dropped_groups"] == 4.0 and m0["dynamic_sampling/sampled_groups"] == 8.0
    # Balanced once at the end: the same four groups, whole, with their rows' lengths; the
    # 60-token group 6 now shares no rank with the next-longest one.
    (_, g0, len0, b0), (_, g1, len1, b1) = out[(0, True)], out[(1, True)]
    assert sorted(set(g0) | set(g1)) == [0, 1, 3, 6] and not set(g0) & set(g1)
    assert all(g.count(x) == N for g in (g0, g1) for x in set(g))
    assert sorted(len0 + len1) == sorted(out[(0, False)][2] + out[(1, False)][2])
    assert b0 == b1 == m0
    assert (6 in g0) != (6 in g1) and len(g0 if 6 in g0 else g1) == N


def test_rollout_sleeps_only_on_gpu_and_when_configured():
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.config.schema import RolloutConfig

    def engine(on_gpu, free):
        e = object.__new__(RolloutEngine)  # the real methods, a recording stand-in for vllm.LLM
        e.on_gpu, e._asleep, e.calls = on_gpu, False, []
        e.cfg = RolloutConfig(free_memory_during_training=free)
        e.llm = SimpleNamespace(sleep=lambda level: e.calls.append(f"sleep{level}"),
                                wake_up=lambda: e.calls.append("wake_up"))
        return e

    for on_gpu, free, expected in ((True, True, ["sleep1", "wake_up"]), (True, False, []), (False, True, [])):
        e = engine(on_gpu, free)
        e.sleep(), e.sleep(), e.wake_up(), e.wake_up()  # idempotent: one sleep, one wake
        assert e.calls == expected, (on_gpu, free)


def test_value_pretraining_keeps_its_sampling_seed_key():
    """The phase is named value_pretrain everywhere; its seeds keep the key they were drawn with, so a
    run's samples (and the demo's figures) do not move."""
    from vcppo.driver.step.experience_maker import sample_seed
    from vcppo.driver.state import Phase, seed_key
    assert seed_key(Phase.VALUE_PRETRAIN) == seed_key("value_pretrain") == "pretrain"
    assert [seed_key(p) for p in (Phase.PPO, "ppo/retry1", "val")] == ["ppo", "ppo/retry1", "val"]
    assert sample_seed(0, seed_key(Phase.VALUE_PRETRAIN), 3, 0) == sample_seed(0, "pretrain", 3, 0)
    assert sample_seed(0, seed_key(Phase.VALUE_PRETRAIN), 3, 0) != sample_seed(0, "ppo", 3, 0)
