"""The driver's DAPO wiring (dynamic sampling, soft overlong punishment) and the call order of
vLLM's sleep / wake-up in both phases, on a fake run context: every round of sampling is scripted,
no engine runs (the real engines run in test_train_e2e.py)."""
from types import SimpleNamespace

import pytest
import torch

from tests.gloo_ranks import run_on_two_ranks
from vcppo.driver.dapo import apply_overlong_penalty, sample_batch
from vcppo.driver.ppo import ppo_step
from vcppo.driver.value_pretrain import pretrain_step
from vcppo.engines.dist import DistInfo
from vcppo.experience import make_experience
from vcppo.schema import Config

N = 2  # samples per prompt


def scored(groups: list[list[float]], first: int = 0, lengths: list[int] | None = None, prompt_len=None):
    """A batch as collect_experience lays it out: ``groups[g]`` holds the scores of prompt
    ``first + g``'s N samples (prompt-major); response i has ``lengths[i]`` tokens."""
    scores = [s for g in groups for s in g]
    lengths = lengths or [3 + (i % 3) for i in range(len(scores))]
    prompts = [[1] * (prompt_len or 2 + g % 2) for g, grp in enumerate(groups) for _ in grp]
    b = make_experience(prompts, [[5] * n for n in lengths], pad_id=0)
    B, R = b.responses.shape
    b.scores = torch.tensor(scores, dtype=torch.float32)
    b.token_rewards = torch.zeros(B, R)
    b.token_rewards[torch.arange(B), torch.tensor(lengths) - 1] = b.scores
    b.sampler_logprobs = -0.5 * b.response_mask
    b.group = torch.tensor([first + g for g, grp in enumerate(groups) for _ in grp])
    b.correct = (b.scores > 0).float()
    b.truncated = torch.zeros(B)
    return b


class FakeCtx:
    """The parts of RunContext the phases touch; records the order of the calls that matter."""

    def __init__(self, rounds, rank=0, world_size=1, **cfg):
        self.cfg = Config()
        self.cfg.trainer.prompts_per_step = 4
        self.cfg.rollout.n_samples_per_prompt = N
        for key, value in cfg.items():
            section, name = key.split(".")
            setattr(getattr(self.cfg, section), name, value)
        self.rounds, self.calls = list(rounds), []
        record = lambda name, out=None: (lambda *a, **k: (self.calls.append(name), out)[1])  # noqa: E731
        self.rollout = SimpleNamespace(sleep=record("sleep"), wake_up=record("wake_up"))
        self.scorer = SimpleNamespace(num_failures=0, num_timeouts=0, num_scored=0)
        self.reference = None
        self.critic = SimpleNamespace(forward_values=lambda b: (self.calls.append("values"),
                                                                 torch.zeros_like(b.response_mask))[1],
                                      train_step=record("critic_update", {}))
        self.actor = SimpleNamespace(forward_logprobs=lambda b, with_entropy=False: (
                                         self.calls.append("old_logprobs"),
                                         (b.sampler_logprobs.clone(), torch.zeros_like(b.response_mask)))[1],
                                     train_step=record("actor_update", {}))
        self.sync_weights = record("weight_sync", 0.0)
        self.dist = DistInfo(rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"),
                             backend="gloo", is_main=rank == 0)

    def sample_step(self, phase, step, balance=True):
        self.calls.append(f"sample:{phase}" + ("" if balance else ":unbalanced"))
        return self.rounds.pop(0)


def test_dynamic_sampling_refills_with_informative_groups():
    # Round 0: groups 0 and 2 informative. Round 1: groups 1, 2, 3 informative -> the first two fill up.
    r0 = scored([[1, -1], [1, 1], [-1, 1], [-1, -1]])
    r1 = scored([[1, 1], [1, -1], [-1, 1], [1, -1]], prompt_len=4, lengths=[9, 1, 2, 8, 7, 7, 1, 1])
    ctx = FakeCtx([r0, r1], **{"trainer.dynamic_sampling": True})
    batch, m = sample_batch(ctx, "ppo", step=3)
    assert ctx.calls == ["sample:ppo:unbalanced", "sample:ppo/retry1:unbalanced"]
    assert batch.size == 4 * N
    # ids of round 1 are shifted by prompts_per_step (4) so groups of different rounds never merge
    assert batch.group.tolist() == [0, 0, 2, 2, 5, 5, 6, 6]
    assert batch.scores.tolist() == [1, -1, -1, 1, 1, -1, -1, 1]
    assert m == {"dynamic_sampling/tries": 2.0, "dynamic_sampling/dropped_groups": 3.0,
                 "dynamic_sampling/sampled_groups": 8.0, "dynamic_sampling/filled_groups": 0.0}
    # Rows keep their tokens and rewards through the concatenation (round 1's prompt widths differ).
    assert torch.equal(batch.token_rewards.sum(1), batch.scores)
    # Widths: round 1's 4-token prompts; its dropped 9-token response no longer pads the batch.
    assert (batch.prompt_len, batch.responses.shape[1]) == (4, 8)
    assert batch.response_mask.sum(1).tolist() == [3, 4, 4, 5, 2, 8, 7, 7]


def test_dynamic_sampling_stops_at_max_tries_and_fills_with_dropped_groups():
    rounds = [scored([[1, 1], [-1, -1], [1, -1], [1, 1]]), scored([[-1, -1]] * 4), scored([[1, 1]] * 4)]
    ctx = FakeCtx(rounds, **{"trainer.dynamic_sampling": True, "trainer.dynamic_sampling_max_tries": 2})
    batch, m = sample_batch(ctx, "ppo", step=1)
    assert len(ctx.calls) == 2 and len(ctx.rounds) == 1
    assert batch.size == 4 * N
    # the one informative group first, then the earliest dropped groups
    assert batch.group.tolist() == [2, 2, 0, 0, 1, 1, 3, 3]
    assert m["dynamic_sampling/filled_groups"] == 3.0 and m["dynamic_sampling/dropped_groups"] == 7.0


def test_dynamic_sampling_is_a_no_op_when_every_group_is_informative_or_when_off():
    r0 = scored([[1, -1], [-1, 1], [1, -1], [-1, 1]])
    ctx = FakeCtx([r0], **{"trainer.dynamic_sampling": True})
    batch, m = sample_batch(ctx, "ppo", step=1)
    assert ctx.calls == ["sample:ppo:unbalanced"] and m["dynamic_sampling/tries"] == 1.0
    assert torch.equal(batch.input_ids, r0.input_ids) and torch.equal(batch.scores, r0.scores)
    off = FakeCtx([scored([[1, 1]] * 4)])
    batch, m = sample_batch(off, "ppo", step=1)
    assert m == {} and batch.size == 4 * N
    # value pretraining samples the policy's own prompt distribution: never filtered
    pre = FakeCtx([scored([[1, 1]] * 4)], **{"trainer.dynamic_sampling": True})
    assert sample_batch(pre, "pretrain", step=1)[0].size == 4 * N and pre.calls == ["sample:pretrain"]


def test_overlong_penalty_shifts_scores_and_the_last_token_reward():
    b = scored([[1, -1], [1, 1]], lengths=[2, 6, 7, 8])
    cfg = Config()
    assert apply_overlong_penalty(b, cfg) == {}  # off by default
    cfg.rollout.max_response_tokens, cfg.reward.overlong_buffer_tokens = 8, 4
    m = apply_overlong_penalty(b, cfg)
    torch.testing.assert_close(b.scores, torch.tensor([1.0, -1.5, 0.25, 0.0]))
    torch.testing.assert_close(b.token_rewards.sum(1), b.scores)
    assert b.token_rewards[1, 5].item() == -1.5 and b.token_rewards[3, 7].item() == 0.0
    assert m["reward/overlong_penalised_frac"] == 0.75
    assert m["reward/overlong_penalty_mean"] == pytest.approx(-(0.5 + 0.75 + 1.0) / 4)


def test_vllm_sleeps_after_sampling_and_wakes_before_the_next_in_value_pretraining():
    # lambda_critic < 1 keeps the separate values pass (with 1 the critic update's own forward gives
    # V_old; the real engine's test of that path: tests/driver/test_old_values_from_update.py)
    ctx = FakeCtx([scored([[1, -1], [1, 1]]), scored([[1, 1], [-1, -1]])], **{"value_pretrain.lambda_critic": 0.99})
    for step in (1, 2):
        pretrain_step(ctx, step)
    one = ["sample:pretrain", "sleep", "values", "critic_update", "wake_up"]
    assert ctx.calls == one + one


# Two actor mini-batches keep the separate old-logprobs pass (with one, the update's own forward
# gives them; the real engine's test of that path: tests/driver/test_old_logprobs_from_update.py).
TWO_MINI_BATCHES = {"actor.ppo_mini_batches": 2, "algorithm.lambda_critic": 0.99}  # + the values pass


def test_vllm_sleeps_during_the_ppo_updates():
    ctx = FakeCtx([scored([[1, -1], [1, 1]])], **TWO_MINI_BATCHES)
    ppo_step(ctx, 1)
    assert ctx.calls == ["sample:ppo", "sleep", "old_logprobs", "values", "critic_update", "actor_update",
                         "actor_update", "wake_up", "weight_sync"]


def test_ppo_step_reports_dynamic_sampling_and_mismatch_metrics():
    ctx = FakeCtx([scored([[1, 1], [1, -1]]), scored([[-1, 1], [1, 1]])],
                  **{"trainer.dynamic_sampling": True, "trainer.prompts_per_step": 2,
                     "algorithm.rollout_is_cap": 2.0}, **TWO_MINI_BATCHES)
    m = ppo_step(ctx, 1)
    assert m["dynamic_sampling/tries"] == 2.0 and m["dynamic_sampling/dropped_groups"] == 2.0
    # the fake actor returns the sampler's logprobs: no mismatch, every weight 1
    assert m["mismatch/logprob_abs_max"] == 0.0 and m["mismatch/kl_k3"] == 0.0
    assert m["mismatch/tis_weight_mean"] == 1.0 and m["mismatch/tis_truncated_frac"] == 0.0


def _two_rank_worker(rank, out):
    # Each rank holds 2 of the step's 4 prompts. Rank 0's first round is all informative, rank 1's
    # has one informative group: both ranks must run the second round (same prompt stream).
    for balance in (False, True):
        first = [scored([[1, -1], [-1, 1]], first=0), scored([[1, 1], [1, -1]], first=2)][rank]
        second = [scored([[1, 1], [1, 1]], first=0), scored([[-1, 1], [1, 1]], first=2, lengths=[30, 30, 2, 2])][rank]
        ctx = FakeCtx([first, second, scored([[1, -1], [1, -1]])], rank=rank, world_size=2,
                      **{"trainer.dynamic_sampling": True, "trainer.balance_batch": balance})
        batch, m = sample_batch(ctx, "ppo", step=1)
        out[(rank, balance)] = (ctx.calls, batch.group.tolist(), batch.response_mask.sum(1).tolist(), m)


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
    from vcppo.schema import RolloutConfig

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
