"""make_batch layout (left-padded prompts, right-padded responses) and batch slicing. Fast, no engines."""
import torch

from vcppo.engines.batch import make_batch, micro_batches, slice_batch, split_batch


def test_make_batch_layout_positions_and_masks():
    b = make_batch([[5, 6, 7], [8]], [[10, 11], [12, 13, 14]], pad_id=0, device="cpu")
    assert b["prompt_len"] == 3
    assert b["input_ids"].tolist() == [[5, 6, 7, 10, 11, 0], [0, 0, 8, 12, 13, 14]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    # positions count real tokens only: the first real token is at position 0 despite left padding
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 4], [0, 0, 0, 1, 2, 3]]
    assert b["responses"].tolist() == [[10, 11, 0], [12, 13, 14]]
    assert b["response_mask"].dtype == torch.float32
    assert b["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    # the logits predicting response token t sit at column P-1+t: that column holds the previous token
    P = b["prompt_len"]
    assert b["input_ids"][0, P - 1].item() == 7 and b["input_ids"][1, P - 1 + 1].item() == 12


def test_empty_response_gets_one_masked_column():
    b = make_batch([[5]], [[]], pad_id=0)
    assert b["responses"].shape == (1, 1) and b["response_mask"].sum() == 0


def test_slice_and_split_carry_extra_tensors():
    b = make_batch([[1, 2], [3], [4, 5, 6]], [[7], [8, 9], [10]], pad_id=0)
    b["advantages"] = torch.arange(3 * 2, dtype=torch.float32).view(3, 2)
    b["uid"] = ["a", "b", "c"]
    b["scalar"] = torch.tensor(1.5)
    s = slice_batch(b, [2, 0])
    assert s["advantages"].tolist() == [[4, 5], [0, 1]] and s["uid"] == ["c", "a"]
    assert s["prompt_len"] == 3 and s["scalar"].item() == 1.5
    parts = split_batch(b, 2)
    assert [p["input_ids"].shape[0] for p in parts] == [2, 1]
    assert torch.equal(torch.cat([p["advantages"] for p in parts]), b["advantages"])
    assert [m["input_ids"].shape[0] for m in micro_batches(b, 2)] == [2, 1]
    assert micro_batches(b, None)[0] is b
