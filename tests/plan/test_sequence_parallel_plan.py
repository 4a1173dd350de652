"""`vcppo plan` with sequence parallelism: activations per rank divided by the SP size, Ulysses'
all-to-all in the step time, SP among the knobs when one sequence does not fit a rank (never a size
the model's heads rule out), and the faster knobs of a run that fits. No engine starts."""
import pytest

from vcppo.commands.plan import main as plan_main
from vcppo.config.load import load_config
from vcppo.plan import memory as M
from vcppo.plan import timing as T
from vcppo.plan.advise import Cluster, Shapes, plan_run, sequence_parallel_problem, sequence_parallel_sizes
from vcppo.plan.knobs import Setting, apply, find_faster, find_fit, wider_sequence_parallel
from vcppo.models.shapes import BUILTIN_SHAPES
from vcppo.plan.hardware import HARDWARE
from vcppo.errors import ConfigError

Q32 = BUILTIN_SHAPES["qwen2.5-32b"]
LONG = ["rollout.max_response_tokens=65536"]


def _setting(preset, overrides, shape="qwen2.5-32b", gpu="h100", nodes=8):
    s = BUILTIN_SHAPES[shape]
    return Setting(load_config(preset, overrides), Cluster(HARDWARE[gpu], 8, nodes)), Shapes(s, s, s)


def _sp(setting, overrides, shapes):
    return plan_run(apply(setting, overrides).cfg, shapes, setting.cluster)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("chunk", [0, 1024])
def test_activations_per_rank_divide_by_the_sp_size_but_the_heads_fixed_buffers_do_not(checkpointing, chunk):
    """Layers, checkpoints, the final norm and the full-logits head are per token: / sp exactly for a
    divisible micro-batch. The chunked head's chunk working set and its fp32 weight gradient are not."""
    tokens, response = 65536, 61440
    acts = {sp: M.activations(Q32, tokens, response, 2, checkpointing=checkpointing, logprob_chunk_size=chunk,
                              sequence_parallel=sp) for sp in (1, 2, 4, 8)}
    for sp in (2, 4, 8):
        assert acts[sp].layers_bytes == pytest.approx(acts[1].layers_bytes / sp)
        if chunk == 0:
            assert acts[sp].logits_bytes == pytest.approx(acts[1].logits_bytes / sp)
        else:
            fixed = acts[1].logits_bytes - 8 * response  # the chunk working set and the weight gradient
            assert acts[sp].logits_bytes == pytest.approx(fixed + 8 * response / sp)
    critic = [M.activations(Q32, tokens, response, 2, checkpointing=checkpointing, lm_head=False,
                            sequence_parallel=sp).total_bytes for sp in (1, 4)]
    assert critic[1] == pytest.approx(critic[0] / 4)


def test_the_plans_engines_carry_the_sp_size_and_states_do_not_shrink():
    setting, shapes = _setting("vcppo_paper_32b_16k", LONG)
    one, two = _sp(setting, [], shapes), _sp(setting, ["actor.sequence_parallel_size=2"], shapes)
    a1, a2 = one.engines[0], two.engines[0]
    assert (a1.sequence_parallel, a2.sequence_parallel) == (1, 2)
    assert a2.activations_ckpt_bytes < 0.55 * a1.activations_ckpt_bytes
    assert a2.states == a1.states and two.engines[1] == one.engines[1]  # ZeRO-3 over all ranks; critic unchanged


def test_the_all_to_all_bytes_are_the_ulysses_exchanges():
    """Forward: q, k, v out and the output back, each (sp - 1) / sp of it: d (2 q_dim + 2 kv_dim)
    (sp - 1) / sp per layer per token; 32B: q_dim 5120, kv_dim 1024 (8 KV heads x 128)."""
    assert T.alltoall_bytes_per_token(Q32, 2, 1) == 0
    assert T.alltoall_bytes_per_token(Q32, 2, 2) == 2 * (2 * 5120 + 2 * 1024) / 2
    assert T.alltoall_bytes_per_token(Q32, 2, 8) == 2 * (2 * 5120 + 2 * 1024) * 7 / 8
    # 7B has 4 KV heads: at SP 8 they would be replicated to 8 (not allowed there: 28 heads)
    q7 = BUILTIN_SHAPES["qwen2.5-7b"]
    assert T.alltoall_bytes_per_token(q7, 2, 4) == 2 * (2 * 3584 + 2 * 4 * 128) * 3 / 4


def test_the_all_to_all_time_is_zero_without_sp_and_grows_with_sp_tokens_and_a_slower_link():
    setting, shapes = _setting("vcppo_paper_32b_16k", LONG)
    exchange = {sp: _sp(setting, [f"actor.sequence_parallel_size={sp}", f"critic.sequence_parallel_size={sp}"],
                        shapes).time.exchange_s for sp in (1, 2, 4, 8)}
    assert exchange[1] == 0 and 0 < exchange[2] < exchange[4] < exchange[8], exchange
    longer, _ = _setting("vcppo_paper_32b_16k", ["rollout.max_response_tokens=131072"])
    at2 = _sp(longer, ["actor.sequence_parallel_size=2", "critic.sequence_parallel_size=2"], shapes).time.exchange_s
    assert at2 > 1.9 * exchange[2]
    model = T.TrainedModel("actor", Q32.params, 0, 1, checkpointing=True, num_layers=64, micro_batches=4,
                           micro_batch_tokens=8192, sequence_parallel=16,
                           exchange_bytes_per_token=T.alltoall_bytes_per_token(Q32, 2, 16))
    cluster = Cluster(HARDWARE["h100"], 8, 4)
    within = T.TrainedModel(**{**model.__dict__, "link_bandwidth": cluster.group_link(8)})
    across = T.TrainedModel(**{**model.__dict__, "link_bandwidth": cluster.group_link(16)})
    assert across.exchange_seconds("update") == pytest.approx(within.exchange_seconds("update") * 450 / 50)
    assert within.exchange_seconds("update") == pytest.approx(3 * within.exchange_seconds("forward"))


def test_the_head_rule_is_the_engines():
    from vcppo.engines.sequence_parallel import head_problem
    for heads, kv in ((40, 8), (28, 4), (14, 2), (64, 8), (12, 12)):
        shape = BUILTIN_SHAPES["qwen2.5-32b"].__class__("s", 10, heads * 8, 2, heads, kv, 16, 8, False)
        for size in range(1, 65):
            assert (sequence_parallel_problem(size, shape, size) is None) == (head_problem(size, heads, kv) is None)
    assert sequence_parallel_sizes(Q32, 64) == [1, 2, 4, 8]  # 5, 10, 20 (of 40 heads) leave 8 KV heads unsplit
    assert sequence_parallel_sizes(BUILTIN_SHAPES["qwen2.5-7b"], 8) == [1, 2, 4]


def test_an_sp_size_the_heads_rule_out_is_a_config_error_naming_the_key():
    setting, shapes = _setting("vcppo_paper_32b_16k", [])
    with pytest.raises(ConfigError, match=r"actor.sequence_parallel_size.*40 attention heads"):
        _sp(setting, ["actor.sequence_parallel_size=16"], shapes)
    with pytest.raises(ConfigError, match=r"critic.sequence_parallel_size.*64 training ranks"):
        _sp(setting, ["critic.sequence_parallel_size=5"], shapes)


def test_65536_tokens_on_one_node_name_the_sp_size_and_the_rollout_tp_that_fit(capsys):
    """One 66k-token sequence per rank does not fit 8 H100s even with checkpointing, the chunked head,
    optimizer offload and micro-batch 1 (the preset's): the planner names SP 2 for both engines and
    vLLM TP 2, and the config re-loaded with them fits."""
    setting, shapes = _setting("vcppo_paper_32b_16k", LONG, nodes=1)
    knobs, fitted = find_fit(setting, shapes)
    assert "actor.sequence_parallel_size=2" in knobs and "critic.sequence_parallel_size=2" in knobs, knobs
    assert "rollout.tensor_parallel_size=2" in knobs and fitted.fits
    assert not any("offload_params" in k or "--nodes" in k for k in knobs)
    again = plan_run(load_config("vcppo_paper_32b_16k", LONG + knobs), shapes, setting.cluster)
    assert again.fits and again.checks == fitted.checks
    assert plan_main(["vcppo_paper_32b_16k", *LONG, "--model-shape", "qwen2.5-32b", "--nodes", "1"]) == 0
    out = capsys.readouterr().out
    assert "actor.sequence_parallel_size=2 critic.sequence_parallel_size=2" in out
    assert "40 attention heads, 8 KV heads; 8 training ranks" in out


def test_65536_tokens_on_8_nodes_fit_with_the_rollout_tp_and_131072_need_sp():
    """On 64 H100s the layers' checkpoints of one 66k sequence fit a rank beside ZeRO-3's 1/64 of the
    states (the chunked head keeps the logits small): only vLLM needs TP 2. At 131k tokens SP 2 is
    named again."""
    setting, shapes = _setting("vcppo_paper_32b_16k", LONG)
    knobs, fitted = find_fit(setting, shapes)
    assert knobs == ["rollout.tensor_parallel_size=2"] and fitted.fits
    longer, _ = _setting("vcppo_paper_32b_16k", ["rollout.max_response_tokens=131072"])
    knobs, fitted = find_fit(longer, shapes)
    assert "actor.sequence_parallel_size=2" in knobs and fitted.fits, knobs


@pytest.mark.parametrize("shape,tokens,size", [("qwen2.5-7b", 262144, 2), ("qwen2.5-32b", 262144, 8)])
def test_the_sp_sizes_named_keep_the_head_rule(shape, tokens, size):
    """Very long sequences on one node: the SP size named divides the 8 training ranks and the heads."""
    setting, shapes = _setting("vcppo_paper_32b_16k", [f"rollout.max_response_tokens={tokens}"], shape, nodes=1)
    knobs, plan = find_fit(setting, shapes)
    named = [int(k.split("=")[1]) for k in knobs if "sequence_parallel_size" in k]
    assert named and max(named) == size and plan.fits, knobs
    assert all(sequence_parallel_problem(n, shapes.policy, 8) is None for n in named)


@pytest.mark.parametrize("shape,largest", [("qwen2.5-7b", 4), ("qwen2.5-0.5b", 2), ("qwen2.5-32b", 8)])
def test_past_the_largest_allowed_size_the_sp_knob_names_nothing(shape, largest):
    """7B (28 heads, 4 KV heads): 1, 2, 4 on 8 ranks, never 7 or 8; 0.5B (14 heads, 2 KV heads): 1, 2."""
    setting, shapes = _setting("vcppo_paper_32b_16k", ["rollout.max_response_tokens=1048576"], shape, nodes=1)
    for sp in sequence_parallel_sizes(shapes.policy, 8):
        at = apply(setting, [f"actor.sequence_parallel_size={sp}", f"critic.sequence_parallel_size={sp}"])
        knob = wider_sequence_parallel(at, plan_run(at.cfg, shapes, at.cluster), shapes)
        if sp < largest:
            assert knob and sequence_parallel_problem(int(knob[0].split("=")[1]), shapes.policy, 8) is None, knob
        else:
            assert sp == largest and knob == []


def test_split_placement_never_gets_sp():
    setting, shapes = _setting("vcppo_paper_32b_16k", LONG + ["placement.mode=split", "placement.rollout_ranks=16"])
    knobs, _ = find_fit(setting, shapes)
    assert not any("sequence_parallel_size" in k for k in knobs or [])


def test_the_16k_preset_on_64_h100s_fits_and_a_wider_rollout_tp_cuts_the_step(capsys):
    """As shipped the 32B rollout runs on one GPU per replica, 61 GiB of weights leaving KV room for one
    16k sequence: ~11,200 s of rollout a step. It fits, and the plan names a larger vLLM TP with the
    planned step before and after (more than 1.5x)."""
    setting, shapes = _setting("vcppo_paper_32b_16k", [])
    knobs, plan = find_fit(setting, shapes)
    assert knobs == [] and plan.time.rollout_s == pytest.approx(11193, rel=0.01)
    faster, after = find_faster(setting, shapes)
    tp = [int(k.split("=")[1]) for k in faster if k.startswith("rollout.tensor_parallel_size=")]
    assert tp and tp[0] > 1 and after.fits and after.time.step_s * 1.5 < plan.time.step_s, faster
    assert plan_main(["vcppo_paper_32b_16k", "--model-shape", "qwen2.5-32b", "--nodes", "8"]) == 0
    out = capsys.readouterr().out
    assert f"**Faster: adding** `{' '.join(faster)}`" in out
    assert f"from {plan.time.step_s:,.0f} s to {after.time.step_s:,.0f} s" in out
    assert f"| with the faster knobs | {after.time.rollout_s:,.0f} |" in out

