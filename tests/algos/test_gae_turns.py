"""Decoupled-GAE across the turns of an episode: observation tokens are masked out, so the TD step
goes from the last model token of turn k to the first model token of turn k + 1, a turn's reward
sits on its last model token, and values at observations never count. Checked by hand (2 turns,
per-turn rewards, lambda_actor 0.9 / lambda_critic 1), against the compressed episode (3 turns,
gamma < 1), in the torch scan, the reference loop and the Triton kernel (its interpreter)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from vcppo.algos.gae import decoupled_gae

# [m m m o o m m]: turn 1 = tokens 0-2 (reward 0.5 on token 2), an observation (3-4), turn 2 = 5-6 (reward 1)
MASK = torch.tensor([[1., 1, 1, 0, 0, 1, 1]])
REWARDS = torch.tensor([[0., 0, 0.5, 0, 0, 0, 1.0]])
VALUES = torch.tensor([[0.1, 0.2, 0.3, 9.0, 9.0, 0.4, 0.5]])  # 9.0 at the observation: must never count
# deltas on the model tokens: 0.1, 0.1, 0.5 + 0.4 - 0.3 = 0.6 (V of turn 2's first token), 0.1, 1 - 0.5 = 0.5
ADV_09 = [1.07695, 1.0855, 1.095, 0.0, 0.0, 0.55, 0.5]   # A_j = delta_j + 0.9 A_{j+1}
RET_1 = [1.5, 1.5, 1.5, 0.0, 0.0, 1.0, 1.0]              # lambda 1: the rewards to go


def _three_turns(gamma: float = 0.97):
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1., 1, 0, 0, 0, 1, 1, 1, 0, 1, 1, 0, 0],    # 3 turns, then padding
                         [1., 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]])   # 2 turns
    rewards = torch.zeros_like(mask)
    rewards[0, [1, 7, 10]] = torch.tensor([0.2, -0.1, 1.0])
    rewards[1, [3, 6]] = torch.tensor([0.3, -1.0])
    values = torch.randn(mask.shape, generator=g)
    return rewards, values, mask, gamma


def _compressed(rewards, values, mask, gamma, lam_actor, lam_critic):
    """Each row's model tokens side by side (no holes), GAE'd, then put back in place."""
    adv, ret = torch.zeros_like(mask), torch.zeros_like(mask)
    for i in range(mask.shape[0]):
        idx = mask[i].nonzero().flatten()
        a, r = decoupled_gae(rewards[i, idx][None], values[i, idx][None], torch.ones(1, len(idx)), gamma,
                             lam_actor, lam_critic, impl="reference")
        adv[i, idx], ret[i, idx] = a[0], r[0]
    return adv, ret


@pytest.mark.parametrize("impl", ["torch", "reference"])
def test_two_turns_by_hand(impl):
    adv, ret = decoupled_gae(REWARDS, VALUES, MASK, gamma=1.0, lam_actor=0.9, lam_critic=1.0, impl=impl)
    torch.testing.assert_close(adv, torch.tensor([ADV_09]), rtol=0, atol=1e-6)
    torch.testing.assert_close(ret, torch.tensor([RET_1]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("impl", ["torch", "reference"])
def test_three_turns_equal_the_compressed_episode(impl):
    rewards, values, mask, gamma = _three_turns()
    adv, ret = decoupled_gae(rewards, values, mask, gamma, 0.95, 1.0, impl=impl)
    want_adv, want_ret = _compressed(rewards, values, mask, gamma, 0.95, 1.0)
    torch.testing.assert_close(adv, want_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_one_turn_is_todays_gae():
    rewards, values, mask, gamma = _three_turns()
    prefix = (torch.arange(13)[None] < torch.tensor([[9], [4]])).float()  # a single turn per row
    a1, r1 = decoupled_gae(rewards * prefix, values, prefix, gamma, 0.95, 1.0, impl="torch")
    a2, r2 = decoupled_gae(rewards * prefix, values, prefix, gamma, 0.95, 1.0, impl="reference")
    assert torch.allclose(a1, a2, atol=1e-6) and torch.allclose(r1, r2, atol=1e-6)


_TRITON = """
import json, torch, sys
sys.path.insert(0, {root!r})
from tests.algos.test_gae_turns import MASK, REWARDS, VALUES, _three_turns
from vcppo.algos.gae import decoupled_gae
adv, ret = decoupled_gae(REWARDS, VALUES, MASK, 1.0, 0.9, 1.0, impl="triton")
r, v, m, g = _three_turns()
a3, r3 = decoupled_gae(r, v, m, g, 0.95, 1.0, impl="triton")
print(json.dumps({{"adv": adv.tolist(), "ret": ret.tolist(), "a3": a3.tolist(), "r3": r3.tolist()}}))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernel_skips_observations_too():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", _TRITON.format(root=root)], capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(torch.tensor(got["adv"]), torch.tensor([ADV_09]), rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(got["ret"]), torch.tensor([RET_1]), rtol=0, atol=1e-5)
    rewards, values, mask, gamma = _three_turns()
    want_adv, want_ret = _compressed(rewards, values, mask, gamma, 0.95, 1.0)
    torch.testing.assert_close(torch.tensor(got["a3"]), want_adv, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.tensor(got["r3"]), want_ret, rtol=1e-4, atol=1e-5)
