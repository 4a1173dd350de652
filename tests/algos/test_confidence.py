"""vcppo.algos.confidence: features of the state before each token, from earlier tokens only."""
import math

import torch

from vcppo.algos.confidence import confidence_features


def test_features_by_hand():
    lp = torch.tensor([[-0.1, -2.0, -0.3, -1.0, 0.0], [-0.5, -0.2, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    f = confidence_features(lp, mask)
    assert f.shape == (2, 5, 3)
    torch.testing.assert_close(f[0, :4, 0], torch.tensor([0.0, -0.1, -2.0, -0.3]))  # previous token's
    torch.testing.assert_close(f[0, :4, 1], torch.tensor([0.0, -0.1, -2.0, -2.0]))  # lowest so far
    torch.testing.assert_close(f[0, :4, 2], torch.log1p(torch.tensor([0.0, 0.0, 1.0, 1.0])))  # below 1/2
    assert f[0, 4].abs().sum() == 0 and f[1, 2:].abs().sum() == 0  # padding
    torch.testing.assert_close(f[1, 1], torch.tensor([-0.5, -0.5, math.log(1.0)]))  # -0.5 > log 1/2


def test_a_token_never_informs_its_own_state():
    lp = torch.zeros(1, 6)
    lp[0, 3] = -5.0
    f = confidence_features(lp, torch.ones(1, 6))
    assert f[0, :4].abs().sum() == 0 and f[0, 4, 0] == -5.0 and f[0, 5, 1] == -5.0
