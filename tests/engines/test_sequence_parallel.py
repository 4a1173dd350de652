"""Sequence parallelism (actor/critic.sequence_parallel_size): SP=2 on 2 gloo ranks, and 2 SP groups x
2 data-parallel on 4, give what one rank without SP gives on the same global batch: logprobs,
entropies, values, every parameter's gradient before each of two optimizer steps, the weights after
them (tests/engines/sp_worker.py). Plus the slicing, the gathered outputs' layout and the config
errors, without ranks."""
import os

import pytest
import torch

from tests.engines.test_distributed import cpu_worker
from vcppo.engines.packing import PackedBatch
from vcppo.engines.sequence_parallel import SPGroup, head_problem, shard_packed

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(model_dir, out, *extra, world_size):
    cpu_worker("tests.engines.sp_worker", "--model", model_dir, "--out", out, *extra, world_size=world_size)
    return torch.load(os.path.join(out, "result.pt"))


LR, BETAS, EPS = 1e-3, (0.9, 0.95), 1e-8  # sp_worker's optimizer: AdamW, the configs' default betas, no decay


def adam_directions(grads: list[dict]) -> list[dict]:
    """Each step's AdamW direction m_hat / (sqrt(v_hat) + eps) per parameter, from that run's gradients."""
    out, m, v = [], {}, {}
    for t, step in enumerate(grads, start=1):
        out.append({})
        for name, g in step.items():
            if g is None:
                continue
            g = g.double()
            m[name] = BETAS[0] * m.get(name, 0 * g) + (1 - BETAS[0]) * g
            v[name] = BETAS[1] * v.get(name, 0 * g) + (1 - BETAS[1]) * g * g
            m_hat, v_hat = m[name] / (1 - BETAS[0] ** t), v[name] / (1 - BETAS[1] ** t)
            out[-1][name] = m_hat / (v_hat.sqrt() + EPS)
    return out


def weight_bound(ref_grads: list[dict], got_grads: list[dict], name: str, w: torch.Tensor) -> torch.Tensor:
    """How far two runs' weights may be apart, entry by entry, when they differ only in the fp32
    summation order of their gradients: each step moves a weight by lr_t * its Adam direction with
    lr_t <= lr, so |w_got - w_ref| <= lr * sum_t |d_t(got) - d_t(ref)|, from the directions each run's
    own gradients give (the gradients themselves are checked to 1e-5 of their scale). Adam's first
    steps are ~sign(g): where a gradient entry is near zero its summation noise flips or scales the
    step (up to 2 lr), where it is not the bound is near zero. Plus the weights' own rounding (two
    fp32 additions: 2 ulps of |w|, and the direction's rounding, 1e-6 lr)."""
    d_ref, d_got = adam_directions(ref_grads), adam_directions(got_grads)
    apart = sum((a[name] - b[name]).abs() for a, b in zip(d_got, d_ref) if name in a)
    return (LR * (apart + 1e-6) + 2 * 2.0 ** -23 * w.double().abs()).float()


# A weight that is no trained parameter by name: LoRA's merged W + s * B @ A, whose two factors each
# move by their Adam noise; 5% of lr, as measured (tests/engines/test_distributed.py).
MERGED_ATOL = 5e-5


def _assert_same(ref, got):
    """Per-token outputs to fp32 noise; gradients to 1e-5 of each tensor's largest entry; weights
    after two AdamW steps within :func:`weight_bound` of each entry (a trained parameter) or
    :data:`MERGED_ATOL` (LoRA's merged weights)."""
    for k in ("logprobs", "entropy", "values", "logprobs_after", "values_after"):
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-5, msg=k)
    for part in ("actor", "critic"):
        assert got[f"{part}_grad_norms"] == pytest.approx(ref[f"{part}_grad_norms"], rel=1e-5)
        for step, (g_ref, g_got) in enumerate(zip(ref[f"{part}_grads"], got[f"{part}_grads"])):
            assert g_ref.keys() == g_got.keys()
            for name, g in g_ref.items():
                scale = float(g.abs().max()) + 1e-12
                d = float((g_got[name] - g).abs().max())
                assert d <= 1e-5 * scale + 1e-9, f"{part} step {step} grad {name}: {d} vs max {scale}"
        w_ref, w_got = ref[f"{part}_weights"], got[f"{part}_weights"]
        assert w_ref.keys() == w_got.keys()
        trained = ref[f"{part}_grads"][0].keys()
        for name in w_ref:
            d = (w_got[name] - w_ref[name]).abs()
            bound = weight_bound(ref[f"{part}_grads"], got[f"{part}_grads"], name, w_ref[name]) \
                if name in trained else torch.full_like(d, MERGED_ATOL)
            worst = int((d - bound).argmax())
            assert bool((d <= bound).all()), (f"{part} weight {name}: entry {worst} apart by "
                                              f"{float(d.flatten()[worst]):.3g} > {float(bound.flatten()[worst]):.3g}")
    # the critic's second step reaches the backbone (its head starts at zero)
    assert any(float(g.abs().max()) > 0 for n, g in ref["critic_grads"][1].items() if n.startswith("backbone."))


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory):
    """4 attention heads over 2 KV heads (each SP rank keeps one KV head: no replication) and an
    untied LM head; the shared tiny model has 2 over 1 (Ulysses replicates the KV head) and ties it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.engines.conftest import build_tiny_tokenizer
    out = str(tmp_path_factory.mktemp("untied_qwen2"))
    tok = build_tiny_tokenizer()
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=1024,
                      tie_word_embeddings=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      initializer_range=0.2)
    torch.manual_seed(1)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir, tmp_path_factory):
    """The reference: the global batch on one rank without SP, padded, one sequence per micro-batch."""
    return _run(tiny_model_dir, str(tmp_path_factory.mktemp("sp_ref")), world_size=1)


@pytest.mark.integration
@pytest.mark.distributed
@pytest.mark.slow
class TestEquality:
    @pytest.mark.extended
    def test_sp2_on_two_ranks_matches_one_rank_padded(self, tiny_model_dir, one_rank, tmp_path):
        """The padded config (packed: false): SP runs packed rows anyway; KV heads replicated."""
        got = _run(tiny_model_dir, str(tmp_path / "sp2"), "--sp", "2", world_size=2)
        assert got["attention"][0].startswith("vcppo_ulysses_")
        _assert_same(one_rank, got)

    @pytest.mark.extended
    def test_sp2_packed_token_budget_full_logits_checkpointing(self, untied_model_dir, tmp_path):
        """Packed, a 15-token budget per SP group (sequences of 2..13 tokens, odd lengths), the
        full-logits path, gradient checkpointing (the all-to-all recomputed in the backward), an
        untied head and one KV head per rank. `make test` keeps SP on 2 ranks against one rank in
        test_sp2_with_lora_matches_one_rank (packed rows, as SP always runs) and a whole SP run in
        tests/engines/test_sequence_parallel_e2e.py."""
        extra = ("--packed", "--budget", "15", "--chunk", "0", "--checkpointing")
        ref = _run(untied_model_dir, str(tmp_path / "ref"), *extra, world_size=1)
        _assert_same(ref, _run(untied_model_dir, str(tmp_path / "sp2"), "--sp", "2", *extra, world_size=2))

    def test_sp2_with_lora_matches_one_rank(self, tiny_model_dir, tmp_path):
        ref = _run(tiny_model_dir, str(tmp_path / "ref"), "--lora", "--micro", "3", world_size=1)
        _assert_same(ref, _run(tiny_model_dir, str(tmp_path / "sp2"), "--lora", "--micro", "3", "--sp", "2",
                               world_size=2))

    @pytest.mark.faults  # a larger rank layout: `make test-faults` runs it
    def test_two_sp_groups_by_two_data_parallel(self, tiny_model_dir, one_rank, tmp_path):
        """4 ranks: SP groups {0, 1} and {2, 3}, ZeRO-3 and the gradient mean over all four."""
        _assert_same(one_rank, _run(tiny_model_dir, str(tmp_path / "sp2x2"), "--sp", "2", world_size=4))


# --- without ranks --------------------------------------------------------------------------------

def _packed(lengths_and_predicts):
    """A packed row of sequences (length, [predicting offsets]) -> PackedBatch (ids = position in row)."""
    ids, pos, predict, start = [], [], [], 0
    for n, offsets in lengths_and_predicts:
        ids += list(range(start, start + n))
        pos += list(range(n))
        predict += [start + o for o in offsets]
        start += n
    N = len(predict)
    return PackedBatch(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]),
                       predict_index=torch.tensor(predict), rows=torch.zeros(N, dtype=torch.long),
                       cols=torch.arange(N), shape=(1, N))


def test_shard_slices_a_row_not_divisible_by_the_sp_size():
    packed = _packed([(2, [0]), (5, [1, 2, 3])])  # T = 7 -> 3 ranks of 3 (2 pad tokens)
    shards = [shard_packed(packed, SPGroup(size=3, rank=r, group=None)) for r in range(3)]
    assert [s.input_ids[0].tolist() for s in shards] == [[0, 1, 2], [3, 4, 5], [6, 0, 0]]
    # the pad is a sequence of its own (positions restart at 0), so no real token attends to it
    assert [s.position_ids[0].tolist() for s in shards] == [[0, 1, 0], [1, 2, 3], [4, 0, 1]]
    assert [s.counts for s in shards] == [[1, 3, 0]] * 3
    assert [s.local_predict.tolist() for s in shards] == [[0], [0, 1, 2], []]
    assert [(s.take.start, s.take.stop) for s in shards] == [(0, 1), (1, 4), (4, 4)]
    feats = torch.arange(7.0).view(1, 7, 1)
    assert shards[2].local_rows(feats)[0, :, 0].tolist() == [6.0, 0.0, 0.0]


def test_shard_of_a_sequence_shorter_than_the_sp_size():
    packed = _packed([(2, [0])])
    shards = [shard_packed(packed, SPGroup(size=4, rank=r, group=None)) for r in range(4)]
    assert [s.input_ids.shape[1] for s in shards] == [1, 1, 1, 1]
    assert shards[0].counts == [1, 0, 0, 0] and shards[3].local_predict.numel() == 0


def test_head_rules():
    assert head_problem(2, 4, 2) is None and head_problem(2, 2, 1) is None  # KV head replicated
    assert head_problem(4, 8, 2) is None
    assert "6 attention heads" in head_problem(4, 6, 2)
    assert "3 key/value heads" in head_problem(2, 4, 3)


@pytest.mark.parametrize("overrides, message", [
    (["actor.sequence_parallel_size=2", "placement.mode=split"],
     "'actor.sequence_parallel_size' (2) is not supported with placement.mode=split"),
    (["critic.sequence_parallel_size=2", "placement.mode=split"],
     "'critic.sequence_parallel_size' (2) is not supported with placement.mode=split"),
])
def test_config_refuses_unsupported_placements(overrides, message):
    from vcppo.config.load import load_config
    from vcppo.errors import ConfigError
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config("base", overrides)


def test_config_names_the_key_and_the_model_counts(tiny_model_dir):
    from vcppo.config.load import load_config
    from vcppo.config.parallel import check_sequence_parallel_ranks
    from vcppo.preflight import check_sequence_parallel_heads
    from vcppo.errors import ConfigError
    cfg = load_config("base", [f"model.policy_path={tiny_model_dir}", "critic.sequence_parallel_size=4"])
    with pytest.raises(ConfigError, match=r"'critic.sequence_parallel_size' \(4\): the model's 2 attention heads"):
        check_sequence_parallel_heads(cfg)
    with pytest.raises(ConfigError, match=r"'critic.sequence_parallel_size' \(4\) must divide the number of "
                                          r"training ranks \(2\)"):
        check_sequence_parallel_ranks(cfg, 2)
    cfg = load_config("base", [f"model.policy_path={tiny_model_dir}", "actor.sequence_parallel_size=2"])
    check_sequence_parallel_heads(cfg)  # 2 heads over 1 KV head: the KV head is replicated
    check_sequence_parallel_ranks(cfg, 4)
    with pytest.raises(ConfigError, match="'critic.sequence_parallel_size' configures a critic"):  # none is built
        load_config("base", ["critic.sequence_parallel_size=3", "algorithm.advantage_estimator=grpo"])


def test_the_weight_bound_allows_summation_noise_and_nothing_else():
    """Two runs whose gradients agree but for fp32 noise on a near-zero entry: Adam's first step
    ~ lr * sign(g) may move that entry by up to 2 lr, and the bound allows it there only; an entry
    whose gradients agree gets a bound of rounding size, so a real difference of 1% of lr fails."""
    g_ref = [{"w": torch.tensor([0.5, 1e-7, -0.2])}, {"w": torch.tensor([0.4, -2e-7, -0.1])}]
    g_got = [{"w": torch.tensor([0.5, -1e-7, -0.2])}, {"w": torch.tensor([0.4, 1e-7, -0.1])}]  # noise flips entry 1
    w = torch.tensor([0.1, 0.2, 0.3])
    bound = weight_bound(g_ref, g_got, "w", w)
    assert bound[1] > LR  # the noisy entry may move by ~lr or more
    assert bound[0] < 1e-2 * LR and bound[2] < 1e-2 * LR  # the others only by rounding
