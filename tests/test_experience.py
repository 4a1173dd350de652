"""The stage types: the layout (left-padded prompts, right-padded responses), its slicing, and the
batches built from a rollout. Fast, no engines."""
import dataclasses

import pytest
import torch

from vcppo.experience import ActorBatch, CriticBatch, Layout, Rollout, make_layout


def test_layout_positions_and_masks():
    b = make_layout([[5, 6, 7], [8]], [[10, 11], [12, 13, 14]], pad_id=0, device="cpu")
    assert b.prompt_len == 3 and b.size == 2
    assert b.input_ids.tolist() == [[5, 6, 7, 10, 11, 0], [0, 0, 8, 12, 13, 14]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    # positions count real tokens only: the first real token is at position 0 despite left padding
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 4], [0, 0, 0, 1, 2, 3]]
    assert b.responses.tolist() == [[10, 11, 0], [12, 13, 14]]
    assert b.policy_mask.dtype == torch.float32
    assert b.policy_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    # the logits predicting response token t sit at column P-1+t: that column holds the previous token
    P = b.prompt_len
    assert b.input_ids[0, P - 1].item() == 7 and b.input_ids[1, P - 1 + 1].item() == 12
    assert type(b) is Layout and not hasattr(b, "scores")  # a rollout adds the scored fields


def test_empty_response_gets_one_masked_column():
    b = make_layout([[5]], [[]], pad_id=0)
    assert b.responses.shape == (1, 1) and b.policy_mask.sum() == 0


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        make_layout([[1], [2]], [[3]], pad_id=0)
    with pytest.raises(ValueError, match="empty prompt"):
        make_layout([[]], [[3]], pad_id=0)


def test_select_split_and_micro_batches_carry_every_field():
    r = Rollout.unscored(make_layout([[1, 2], [3], [4, 5, 6]], [[7], [8, 9], [10]], pad_id=0))
    b = ActorBatch(**{**vars(r), "correct": torch.tensor([1.0, 0.0, 1.0])},
                   advantages=torch.arange(3 * 2, dtype=torch.float32).view(3, 2))
    s = b.select([2, 0])
    assert type(s) is ActorBatch
    assert s.advantages.tolist() == [[4, 5], [0, 1]] and s.correct.tolist() == [1.0, 1.0]
    assert s.prompt_len == 3 and s.old_logprobs is None
    assert torch.equal(b.select(torch.tensor([1])).input_ids, b.input_ids[1:2])
    parts = b.split(2)
    assert [p.size for p in parts] == [2, 1]
    assert torch.equal(torch.cat([p.advantages for p in parts]), b.advantages)
    assert [m.size for m in b.micro_batches(2)] == [2, 1]
    assert b.micro_batches(None)[0] is b
    moved = b.to("cpu")
    for f in dataclasses.fields(ActorBatch):
        v = getattr(b, f.name)
        assert (getattr(moved, f.name) is None) == (v is None)


def _filled(prompts, responses, pad_id=0):
    r = Rollout.unscored(make_layout(prompts, responses, pad_id=pad_id))
    advantages = (torch.arange(r.size * r.responses.shape[1], dtype=torch.float32).view(r.size, -1) + 1) * r.policy_mask
    return ActorBatch(**{**vars(r), "scores": torch.arange(r.size, dtype=torch.float32)}, advantages=advantages)


def test_concat_batches_equals_laying_out_all_rows_at_once():
    from vcppo.experience import concat_batches
    p1, r1 = [[1, 2], [3]], [[7], [8, 9]]
    p2, r2 = [[4, 5, 6]], [[10, 11, 12, 13]]
    a, b = _filled(p1, r1, pad_id=99), _filled(p2, r2, pad_id=99)
    joined = concat_batches([a, b])
    whole = make_layout(p1 + p2, r1 + r2, pad_id=99)
    for f in ("input_ids", "attention_mask", "position_ids", "responses", "policy_mask"):
        assert torch.equal(getattr(joined, f), getattr(whole, f)), f
    assert joined.prompt_len == whole.prompt_len
    assert joined.scores.tolist() == [0.0, 1.0, 0.0]
    # response-aligned fields are padded with zeros on the right, values kept
    assert joined.advantages.tolist()[0] == [1.0, 0.0, 0.0, 0.0]
    assert joined.advantages.tolist()[2] == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="field 'old_logprobs'"):
        b.old_logprobs = torch.zeros_like(b.advantages)
        concat_batches([a, b])
    with pytest.raises(ValueError, match="different stage types"):
        concat_batches([a, Rollout.unscored(make_layout(p2, r2, pad_id=99))])


def test_compact_drops_all_pad_columns_and_keeps_positions():
    from vcppo.experience import compact
    b = _filled([[1, 2, 3], [4]], [[7], [8, 9, 10]])
    short = compact(b.select([1]))  # a 1-token prompt and a 3-token response
    assert short.prompt_len == 1 and short.responses.shape == (1, 3)
    assert short.input_ids.tolist() == [[4, 8, 9, 10]]
    assert short.position_ids.tolist() == [[0, 1, 2, 3]]
    assert short.advantages.tolist() == b.advantages[1:2].tolist()
    other = compact(b.select([0]))
    assert other.prompt_len == 3 and other.responses.shape == (1, 1)
    assert other.input_ids.tolist() == [[1, 2, 3, 7]] and other.scores.tolist() == [0.0]


def test_stage_batches_carry_the_rollout_and_require_what_their_loss_reads():
    r = Rollout.unscored(make_layout([[1, 2], [3]], [[7], [8, 9]], pad_id=0))
    c = CriticBatch(**vars(r), returns=torch.ones(2, 2))
    assert torch.equal(c.input_ids, r.input_ids) and c.old_values is None
    with pytest.raises(TypeError, match="returns"):
        CriticBatch(**vars(r))  # no targets, no critic batch
    with pytest.raises(TypeError, match="advantages"):
        ActorBatch(**vars(r))
