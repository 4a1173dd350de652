"""GAE: hand-computed cases, the fused torch scan == reference loop, invariances.

The Triton kernel (under its CPU interpreter, and compiled for sm_90) is tested in
tests/algos/test_gae_triton.py.
"""
import subprocess
import sys

import pytest
import torch

from vcppo.algos import gae as gae_module
from vcppo.algos.gae import decoupled_gae, gae_reference, length_adaptive_lambda

# fp32 tolerance against the float64 reference loop. The fused torch path sums the same terms
# in a different order (blocked GEMMs + carries), so the difference is a few fp32 ulps of the
# partial sums: <= ~T * 6e-8 * |partial sum|. Our random cases have T <= 300 and |sums| <= ~30,
# i.e. <= ~5e-4 in the very worst case and ~5e-6 typically (measured); an indexing or masking
# bug shows up as an O(0.1-1) error, so 1e-4 still fails on every real bug.
ATOL, RTOL = 1e-4, 1e-5

# CPU implementations of the fused pass (the Triton kernel runs under its interpreter in a
# subprocess: tests/algos/test_gae_triton.py).
FUSED_IMPLS = ["torch"]


# ---------------------------------------------------------------- hand-computed cases
def test_hand_computed_all_valid():
    # r = [0, 0, 1], V = [.5, .6, .7], gamma = 1, lam = .5
    # delta = [0 + .6 - .5, 0 + .7 - .6, 1 + 0 - .7] = [.1, .1, .3]
    # A_2 = .3;  A_1 = .1 + .5 * .3 = .25;  A_0 = .1 + .5 * .25 = .225
    # returns = A + V = [.725, .85, 1.0]; with lam = 1 every return is the reward-to-go 1.0
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    m = torch.ones(1, 3, dtype=torch.bool)
    for impl in ("reference", "torch"):
        adv, ret = decoupled_gae(r, v, m, gamma=1.0, lam_actor=0.5, lam_critic=0.5, impl=impl)
        torch.testing.assert_close(adv, torch.tensor([[0.225, 0.25, 0.3]]))
        torch.testing.assert_close(ret, torch.tensor([[0.725, 0.85, 1.0]]))
        adv1, ret1 = decoupled_gae(r, v, m, gamma=1.0, lam_actor=1.0, lam_critic=1.0, impl=impl)
        torch.testing.assert_close(adv1, torch.tensor([[0.5, 0.4, 0.3]]))
        torch.testing.assert_close(ret1, torch.ones(1, 3))


def test_hand_computed_interior_mask_and_discount():
    # Masked positions 1 (tool output) and 4 (padding) hold junk that must be ignored.
    # Compressed: r = [0, 0, 1], V = [.5, .6, .7], gamma = .9
    # delta = [.9*.6 - .5, .9*.7 - .6, 1 - .7] = [.04, .03, .3]
    # lam_actor = .5 (c = .45): A = [.04 + .45*.165, .03 + .45*.3, .3] = [.11425, .165, .3]
    # lam_critic = 1 (c = .9): A = [.04 + .9*.3, .03 + .9*.3, .3] = [.31, .3, .3]
    #   returns = A + V = [.81, .9, 1.0] = discounted reward-to-go .9^2, .9, 1
    r = torch.tensor([[0.0, 9.0, 0.0, 1.0, 5.0]])
    v = torch.tensor([[0.5, 100.0, 0.6, 0.7, 100.0]])
    m = torch.tensor([[1, 0, 1, 1, 0]])
    for impl in ("reference", "torch"):
        adv, ret = decoupled_gae(r, v, m, gamma=0.9, lam_actor=0.5, lam_critic=1.0, impl=impl)
        torch.testing.assert_close(adv, torch.tensor([[0.11425, 0.0, 0.165, 0.3, 0.0]]))
        torch.testing.assert_close(ret, torch.tensor([[0.81, 0.0, 0.9, 1.0, 0.0]]))


@pytest.mark.parametrize("impl", FUSED_IMPLS)
def test_lambda_zero_is_one_step_td(impl):
    # lam = 0: A_t = delta_t exactly (the torch path must not take log(0)).
    r = torch.tensor([[1.0, 2.0, 3.0]])
    v = torch.tensor([[0.5, 0.25, 2.0]])
    m = torch.ones(1, 3)
    adv, _ = decoupled_gae(r, v, m, gamma=1.0, lam_actor=0.0, impl=impl)
    torch.testing.assert_close(adv, torch.tensor([[1.0 + 0.25 - 0.5, 2.0 + 2.0 - 0.25, 3.0 - 2.0]]))


# ---------------------------------------------------------------- random cases vs the loop
def _random_case(B, T, seed, dtype=torch.float32, lengths_only=False):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    if lengths_only:
        lengths = torch.randint(0, T + 1, (B,), generator=g)
        m = torch.arange(T)[None, :] < lengths[:, None]
    else:
        m = torch.rand(B, T, generator=g) < 0.7                 # interior holes everywhere
    # Edge rows: all masked, full, length 1, single valid token in the middle.
    m[0] = False
    if B > 1:
        m[1] = True
    if B > 2:
        m[2] = False
        m[2, 0] = True
    if B > 3:
        m[3] = False
        m[3, T // 2] = True
    return r.to(dtype), v.to(dtype), m


def _check_against_reference(r, v, m, gamma, lam_actor, lam_critic, impl):
    adv, ret = decoupled_gae(r, v, m, gamma, lam_actor, lam_critic, impl=impl)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    lam_a64 = lam_actor.double() if isinstance(lam_actor, torch.Tensor) else lam_actor
    # Oracle in float64 on exactly the values the fused pass saw (bf16 inputs upcast losslessly).
    adv_ref, _ = gae_reference(r.double(), v.double(), m, gamma, lam_a64)
    _, ret_ref = gae_reference(r.double(), v.double(), m, gamma, lam_critic)
    torch.testing.assert_close(adv.double(), adv_ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(ret.double(), ret_ref, atol=ATOL, rtol=RTOL)
    assert (adv[~m.bool()] == 0).all() and (ret[~m.bool()] == 0).all()


@pytest.mark.parametrize("B,T", [(5, 1), (6, 7), (9, 64), (8, 65), (4, 300), (3, 129)])
@pytest.mark.parametrize("lengths_only", [True, False])
@pytest.mark.parametrize("gamma", [1.0, 0.97])
@pytest.mark.parametrize("impl", FUSED_IMPLS)
def test_fused_matches_reference(impl, B, T, lengths_only, gamma):
    r, v, m = _random_case(B, T, seed=B * 1000 + T, lengths_only=lengths_only)
    _check_against_reference(r, v, m, gamma, 0.95, 1.0, impl)
    _check_against_reference(r, v, m, gamma, 0.0, 0.5, impl)


@pytest.mark.parametrize("lengths_only", [True, False])
@pytest.mark.parametrize("impl", FUSED_IMPLS)
def test_fused_per_sequence_lambda(impl, lengths_only):
    B, T = 10, 150
    r, v, m = _random_case(B, T, seed=7, lengths_only=lengths_only)
    lam = torch.linspace(0.0, 1.0, B)                 # includes lam = 0 and lam = 1 rows
    _check_against_reference(r, v, m, 1.0, lam, 1.0, impl)
    _check_against_reference(r, v, m, 0.9, lam, torch.full((B,), 0.99), impl)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("impl", FUSED_IMPLS)
def test_fused_low_precision_inputs(impl, dtype):
    # bf16 / fp16 inputs are read once and accumulated in fp32: compared with the float64 loop on
    # the same (already rounded) inputs, the error budget is the fp32 one, not bf16's 4e-3.
    r, v, m = _random_case(6, 200, seed=3, dtype=dtype)
    _check_against_reference(r, v, m, 1.0, 0.95, 1.0, impl)


@pytest.mark.parametrize("impl", FUSED_IMPLS)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8, torch.int64, torch.float32, torch.bfloat16])
def test_fused_mask_dtypes_strides_and_grad(impl, mask_dtype):
    # Any 0/1 mask dtype; non-contiguous inputs (column slices, transposes); requires_grad inputs.
    r, v, m = _random_case(7, 41, seed=17)
    wide_r = torch.randn(7, 60, dtype=torch.float64)
    wide_r[:, 5:46] = r
    r_strided = wide_r.float()[:, 5:46]                          # row stride 60, not contiguous
    v_t = v.float().t().contiguous().t().requires_grad_(True)   # column-major, needs grad
    m_any = m.to(mask_dtype)
    adv, ret = decoupled_gae(r_strided, v_t, m_any, 0.99, 0.9, 1.0, impl=impl)
    assert not adv.requires_grad and not ret.requires_grad
    adv_ref, _ = gae_reference(r.double(), v.double(), m, 0.99, 0.9)
    _, ret_ref = gae_reference(r.double(), v.double(), m, 0.99, 1.0)
    torch.testing.assert_close(adv.double(), adv_ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(ret.double(), ret_ref, atol=ATOL, rtol=RTOL)


def test_lambda_one_gamma_one_returns_are_reward_to_go():
    r, v, m = _random_case(6, 50, seed=11)
    _, ret = decoupled_gae(r.float(), v.float(), m, 1.0, 0.95, 1.0, impl="torch")
    # reward-to-go over valid tokens: reverse cumulative sum of the masked rewards
    masked_r = torch.where(m, r.double(), torch.zeros_like(r.double()))
    reward_to_go = masked_r.flip(1).cumsum(1).flip(1)
    torch.testing.assert_close(ret.double(), torch.where(m, reward_to_go, torch.zeros_like(reward_to_go)), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("impl", FUSED_IMPLS)
def test_changing_lam_actor_leaves_returns_unchanged(impl):
    r, v, m = _random_case(6, 80, seed=5)
    _, ret_a = decoupled_gae(r.float(), v.float(), m, 1.0, 0.9, 1.0, impl=impl)
    _, ret_b = decoupled_gae(r.float(), v.float(), m, 1.0, 0.3, 1.0, impl=impl)
    assert torch.equal(ret_a, ret_b)
    # A per-sequence lam_actor takes the batched-GEMM route: same math, other summation order.
    _, ret_c = decoupled_gae(r.float(), v.float(), m, 1.0, torch.rand(6), 1.0, impl=impl)
    torch.testing.assert_close(ret_c, ret_a, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("lengths_only", [True, False])
@pytest.mark.parametrize("impl", FUSED_IMPLS)
def test_masked_positions_change_nothing(impl, lengths_only):
    r, v, m = _random_case(6, 90, seed=13, lengths_only=lengths_only)
    r, v = r.float(), v.float()
    adv, ret = decoupled_gae(r, v, m, 0.99, 0.95, 1.0, impl=impl)
    junk_r = torch.where(m, r, torch.full_like(r, float("nan")))
    junk_v = torch.where(m, v, torch.full_like(v, 1e30))
    adv2, ret2 = decoupled_gae(junk_r, junk_v, m, 0.99, 0.95, 1.0, impl=impl)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    adv3, ret3 = decoupled_gae(junk_r, junk_v, m, 0.99, 0.95, 1.0, impl="reference")
    assert not adv3.isnan().any() and not ret3.isnan().any()


def test_auto_on_cpu_is_the_torch_scan(monkeypatch):
    r, v, m = _random_case(3, 10, seed=1)
    r, v = r.float(), v.float()
    calls = []
    real = gae_module._decoupled_gae_torch
    monkeypatch.setattr(gae_module, "_decoupled_gae_torch",
                        lambda *a, **k: calls.append("torch") or real(*a, **k))
    a1, _ = decoupled_gae(r, v, m, impl="auto")
    assert calls == ["torch"]
    a2, _ = decoupled_gae(r, v, m, impl="torch")
    assert torch.equal(a1, a2)


def test_gae_imports_no_jit_compiler():
    """numba (llvmlite) in the process breaks vLLM's start-up module scan and, on its OpenMP
    layer, slowed torch's later sdpa calls (docs/performance.md); importing the algorithms and
    running the CPU GAE must leave it unimported. Fresh interpreter: another test may import it."""
    script = (
        "import sys, torch\n"
        "import vcppo.algos\n"
        "from vcppo.algos.gae import decoupled_gae\n"
        "r = torch.randn(8, 16); m = torch.ones(8, 16, dtype=torch.bool)\n"
        "decoupled_gae(r, r, m)\n"
        "print('JIT', sorted(k for k in ('numba', 'llvmlite') if k in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "JIT []" in proc.stdout, proc.stdout + proc.stderr


def test_bad_impl_and_shapes_raise():
    r, v, m = _random_case(3, 10, seed=1)
    with pytest.raises(ValueError):
        decoupled_gae(r, v, m, impl="cuda")
    with pytest.raises(ValueError):
        decoupled_gae(r, v[:, :5], m)


# ---------------------------------------------------------------- length-adaptive lambda
def test_length_adaptive_lambda_formula_and_clamps():
    lam = length_adaptive_lambda(torch.tensor([0, 10, 20, 40, 100, 200, 1000, 10**6]), alpha=0.05)
    # 1 - 1/(0.05 * l): l=100 -> 0.8, l=200 -> 0.9, l=1000 -> 0.98; l <= 40 -> clamped to 0.5
    expected = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.8, 0.9, 0.98, 0.999])
    torch.testing.assert_close(lam, expected)
    assert (lam > 0).all() and (lam < 1).all()
    with pytest.raises(ValueError):
        length_adaptive_lambda(torch.tensor([5]), min_lambda=0.0)
