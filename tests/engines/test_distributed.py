"""Actor + critic train_step with 2 ranks (gloo) == 1 rank on the same global batch, and so are a
reward model's scores; vLLM in the same 2-rank processes samples, takes the synced weights, and tears
down cleanly. The ranks are started by hand, as a launcher would (tests/conftest.py); the deepspeed
launcher itself runs `vcppo train` in tests/launch/test_launch.py."""
import json
import os

import pytest
import torch

from tests.conftest import ENV, run_ranks

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def cpu_worker(module, *args, world_size=2):
    """One of the engine tests' workers (tests/engines/*_worker.py) on ranks started by hand: CPU,
    gloo, one thread each."""
    run_ranks(*args, cwd=REPO, module=module, world_size=world_size,
              env=dict(ENV, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1"), timeout=400)


def _by_hand(model_dir, out, *extra, world_size=2):
    """tests/engines/dist_worker.py on ranks started by hand."""
    cpu_worker("tests.engines.dist_worker", "--model", model_dir, "--out", out, *extra, world_size=world_size)
    return out


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir, tmp_path_factory):
    """The reference: the whole global batch on one rank, one sequence per micro-batch, padded."""
    return _by_hand(tiny_model_dir, str(tmp_path_factory.mktemp("w1")), world_size=1)


def _assert_same_step(out1, out2, weight_atol=1e-5):
    r1 = json.load(open(os.path.join(out1, "result.json")))
    r2 = json.load(open(os.path.join(out2, "result.json")))
    for k in ("actor_loss", "critic_loss", "actor_grad_norm", "actor_grad_norm2", "critic_grad_norm",
              "critic_grad_norm2"):
        assert r2[k] == pytest.approx(r1[k], rel=1e-5), k
    w1 = torch.load(os.path.join(out1, "weights.pt"))
    w2 = torch.load(os.path.join(out2, "weights.pt"))
    for part in ("actor", "critic"):
        assert w1[part].keys() == w2[part].keys()
        for name in w1[part]:
            # atol 1e-5 = 1% of lr: Adam's early updates g/(|g|+eps) are ~lr*sign(g), so a
            # near-zero gradient element can move by O(lr * noise / eps) under fp32 reduction noise.
            d = (w2[part][name] - w1[part][name]).abs().max().item()
            assert d < weight_atol, f"{part}.{name}: max abs diff {d}"
    torch.testing.assert_close(w2["values"], w1["values"], rtol=1e-5, atol=1e-5)
    # the reward model engine's scores of the same 4 sequences, from 1 and from 2 ranks
    assert len(r1["rm_scores"]) == 4 and max(abs(x) for x in r1["rm_scores"]) > 1e-3
    assert r2["rm_scores"] == pytest.approx(r1["rm_scores"], abs=1e-4)
    return r2


def test_two_ranks_match_one_rank(tiny_model_dir, one_rank, tmp_path):
    r2 = _assert_same_step(one_rank, _by_hand(tiny_model_dir, str(tmp_path / "w2"), "--vllm"))
    # vLLM on each rank took the synced (updated) weights
    assert max(r2["vllm_vs_actor_maxdiff_per_rank"]) < 1e-4
    # one rollout group of 2 ranks (tensor_parallel_size 2): identical requests give identical
    # samples on both ranks, and each rank trains on its own half of the prompts
    outs = r2["group_outputs_per_rank"]
    assert outs[0] == outs[1] and len(outs[0]) == 8 and len({tuple(o) for o in outs[0]}) > 1
    assert r2["kept_groups_per_rank"] == [[0, 1], [2, 3]]


@pytest.mark.extended
def test_two_ranks_packed_under_a_token_budget_match_one_rank(tiny_model_dir, one_rank, tmp_path):
    """Exact global normalisation when ranks run different numbers of packed micro-batches: rank 0's
    sequences (9 and 7 real tokens) need two micro-batches under a 15-token budget, rank 1's (6 and
    9) fit in one; rank 1 then runs a zero-weight pass so ZeRO-3's collectives stay in step."""
    # Packed passes sum in another order than padded ones: one element of the embedding moved by up
    # to 2.05e-5 (2% of lr; Adam's first update g/(|g|+eps) scales a near-zero gradient's noise up),
    # so weights get 5% of lr. Adam is blind to a constant factor on the gradient: the normaliser is
    # checked by the losses and grad norms above (rel 1e-5; a wrong one moves them by e.g. 2/3).
    r2 = _assert_same_step(one_rank, _by_hand(tiny_model_dir, str(tmp_path / "w2"), "--budget", "15", "--packed"),
                           weight_atol=5e-5)
    assert r2["micro_batches_per_rank"] == [2, 1]


@pytest.mark.extended
def test_two_ranks_with_lora_match_one_rank(tiny_model_dir, tmp_path):
    """LoRA actor and critic under ZeRO-3 on 2 ranks: the same step as on one rank (losses, grad
    norms, adapters, merged weights, values), and vLLM on each rank samples the merged actor.
    `make test` keeps LoRA under ZeRO-3 on 2 ranks against one rank in
    tests/engines/test_sequence_parallel.py::TestEquality::test_sp2_with_lora_matches_one_rank, and vLLM
    sampling the merged LoRA actor in tests/engines/test_lora.py (one rank)."""
    one = _by_hand(tiny_model_dir, str(tmp_path / "w1"), "--lora", world_size=1)
    r2 = _assert_same_step(one, _by_hand(tiny_model_dir, str(tmp_path / "w2"), "--vllm", "--lora"))
    assert max(r2["vllm_vs_actor_maxdiff_per_rank"]) < 1e-4
    w = torch.load(os.path.join(one, "weights.pt"))["actor"]
    adapters = [k for k in w if k.startswith("adapter:")]
    assert len(adapters) == 28 and all(".lora_" in k for k in adapters)
    assert not any("base_layer" in k or ".lora_" in k for k in w if not k.startswith("adapter:"))
