"""CUDA checks, run by launch/gpu_check.sh on a GPU machine; skipped without CUDA (conftest)."""
import pytest
import torch

from vcppo.algos.gae import decoupled_gae, gae_reference

pytestmark = pytest.mark.gpu


def _case(B, T, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    mask[:, T // 3] = 0  # an interior hole (tool output)
    r = torch.randn(B, T, generator=g) * mask
    v = torch.randn(B, T, generator=g)
    return r.to(device, dtype), v.to(device, dtype), mask.to(device)


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_gae_matches_reference(impl, dtype):
    torch.backends.cuda.matmul.allow_tf32 = False  # the torch path's scan is exact only in full fp32
    r, v, m = _case(64, 1024, "cuda", dtype)
    lam_actor = torch.rand(64, device="cuda") * 0.1 + 0.9
    adv, ret = decoupled_gae(r, v, m, gamma=0.99, lam_actor=lam_actor, lam_critic=1.0, impl=impl)
    rf, vf = r.float().cpu(), v.float().cpu()
    ref_adv = torch.stack([gae_reference(rf[i:i + 1], vf[i:i + 1], m[i:i + 1].cpu(), 0.99, float(lam_actor[i]))[0][0]
                           for i in range(64)])
    _, ref_ret = gae_reference(rf, vf, m.cpu(), 0.99, 1.0)
    assert adv.is_cuda and adv.dtype == torch.float32
    torch.testing.assert_close(adv.cpu(), ref_adv, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ret.cpu(), ref_ret, rtol=1e-4, atol=1e-4)


def test_auto_picks_triton_on_cuda():
    from vcppo.algos.gae import triton_available
    r, v, m = _case(8, 64, "cuda")
    a1, _ = decoupled_gae(r, v, m, impl="auto")
    a2, _ = decoupled_gae(r, v, m, impl="triton" if triton_available() else "torch")
    assert torch.equal(a1, a2)


def test_deepspeed_runs_on_cuda():
    """The test process gives DeepSpeed its CUDA accelerator (tests/conftest.py), not the CPU one a
    leftover DS_ACCELERATOR=cpu would: every engine test below would otherwise train on the CPU."""
    pytest.importorskip("deepspeed")
    from deepspeed.accelerator import get_accelerator
    assert get_accelerator().device_name() == "cuda"
    assert get_accelerator().communication_backend_name() == "nccl"


@pytest.mark.parametrize("zero_stage", [0, 3], ids=["zero0", "zero3"])
def test_actor_engine_bf16_on_cuda(tmp_path, zero_stage):
    """The actor on CUDA trains a step in bf16 under DeepSpeed ZeRO-0 (what one rank resolves
    ``zero_stage: null`` to) and ZeRO-3 (set explicitly: valid on one rank, its partitioning hooks on
    nccl), one rank each."""
    pytest.importorskip("deepspeed")
    from vcppo.engines.loss_contract import ResponseNLL
    from vcppo.engines.actor import ActorEngine
    from vcppo.experience import make_layout
    from vcppo.config.schema import ActorConfig
    from vcppo.runtime.dist import init_distributed
    from vcppo.models.factory import make_model

    make_model("tiny", None, tmp_path / "m")
    dist = init_distributed("cuda")
    eng = ActorEngine(str(tmp_path / "m"), ActorConfig(lr=1e-3, micro_batch_size=4, zero_stage=zero_stage), dist,
                      total_optimizer_steps=2)
    assert eng.zero_stage == zero_stage and eng.ds_config["zero_optimization"]["stage"] == zero_stage
    assert next(eng.module.parameters()).dtype == torch.bfloat16
    b = make_layout([[1, 2, 3]] * 4, [[4, 5, 6, 7]] * 4, pad_id=0, device=dist.device)
    m = eng.train_step(b, ResponseNLL())
    assert torch.isfinite(torch.tensor(m["grad_norm"]))
    # DeepSpeed itself runs on CUDA (not its CPU accelerator), and so do the engine's weights
    from deepspeed.accelerator import get_accelerator
    assert get_accelerator().device_name() == "cuda" and next(eng.module.parameters()).is_cuda
    if zero_stage == 3:  # the weights are partitioned (ZeRO-3's parameter attributes), not whole
        assert all(hasattr(p, "ds_id") for p in eng.module.parameters())
    eng.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_equals_padded_on_cuda(tmp_path, dtype):
    """Packed passes on CUDA (flash_attention_2 varlen when installed, else per-sequence sdpa) give
    the padded layout's logprobs and values: fp32 (per-sequence sdpa) tightly, bf16 (flash-attn when
    installed) within bf16 noise."""
    pytest.importorskip("deepspeed")
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.critic import CriticEngine
    from vcppo.runtime.dist import init_distributed
    from vcppo.engines.packing import VARLEN_ATTENTION
    from vcppo.experience import make_layout
    from vcppo.models.factory import make_model
    from vcppo.config.schema import ActorConfig, CriticConfig

    make_model("tiny", None, tmp_path / "m")
    dist = init_distributed("cuda")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 90, (n,), generator=g).tolist() for n in (3, 9, 1, 5)]
    responses = [torch.randint(5, 90, (n,), generator=g).tolist() for n in (1, 40, 17, 64)]
    b = make_layout(prompts, responses, pad_id=0, device=dist.device)
    out = {}
    for packed in (False, True):
        actor = ActorEngine(str(tmp_path / "m"), ActorConfig(micro_batch_size=4, packed=packed), dist,
                            total_optimizer_steps=1, dtype=dtype, train=False)
        critic = CriticEngine("policy", str(tmp_path / "m"), CriticConfig(micro_batch_size=4, packed=packed), dist,
                              total_optimizer_steps=1, dtype=dtype, train=False)
        if packed:
            assert actor.attention in ("flash_attention_2", VARLEN_ATTENTION)
            assert dtype == "bfloat16" or actor.attention == VARLEN_ATTENTION  # flash-attn has no fp32
        out[packed] = (actor.forward_logprobs(b)[0], critic.forward_values(b))
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=0.05, atol=0.05)
    for padded, packed in zip(out[False], out[True]):
        torch.testing.assert_close(packed, padded, **tol)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism needs 2 GPUs")
def test_tp2_rollout_group_shares_its_samples(tmp_path):
    """vLLM with tensor_parallel_size=2 under external_launcher: the two ranks are one sharded
    engine, send identical requests, get identical samples and keep disjoint halves of the prompts."""
    pytest.importorskip("vllm")
    import json
    import os
    import subprocess
    import sys
    from tests.engines.conftest import build_tiny_model

    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    model = build_tiny_model(tmp_path / "tiny")
    env = dict(os.environ, PYTHONPATH=repo, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    cmd = [os.path.join(os.path.dirname(sys.executable), "deepspeed"), "--num_gpus", "2",
           os.path.join(repo, "tests", "engines", "dist_worker.py"), "--model", model, "--out", str(tmp_path / "o"),
           "--vllm", "--device", "cuda"]
    p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.load(open(tmp_path / "o" / "result.json"))
    outs = r["group_outputs_per_rank"]
    assert outs[0] == outs[1] and len(outs[0]) == 8
    assert r["kept_groups_per_rank"] == [[0, 1], [2, 3]]
