"""``critic.confidence_features``: the real DeepSpeed critic (tiny Qwen2, one rank) reads the sampler's
logprobs through its confidence head the same way packed and padded, keeps the head through export
and reload (the critic cache's path), and says what is missing when a batch has no logprobs."""
import dataclasses

import pytest
import torch

from vcppo.experience import Rollout, make_layout
from vcppo.config.schema import CriticConfig

pytestmark = [pytest.mark.integration]


def _batch():
    g = torch.Generator().manual_seed(0)
    b = Rollout.unscored(make_layout([[5, 6], [7, 8, 9], [5]], [[10, 11, 12], [13, 14], [20, 21, 22, 23]],
                                     pad_id=0))
    return dataclasses.replace(b, sampler_logprobs=-3 * torch.rand(b.policy_mask.shape, generator=g)
                               * b.policy_mask)


def _critic(info, path, init="policy", **kw):
    from vcppo.engines.critic import CriticEngine
    cfg = CriticConfig(**{"lr": 1e-3, "micro_batch_size": 2, "confidence_features": True, **kw})
    critic = CriticEngine(init, path, cfg, info, total_optimizer_steps=4)
    return critic


def test_confidence_head_packed_equals_padded_and_survives_export(info, tmp_path):
    from tests.engines.conftest import build_tiny_model
    from vcppo.algos.confidence import confidence_features
    from vcppo.models.value_model import ValueModel
    model_dir = build_tiny_model(tmp_path / "m")
    b = _batch()
    values = {}
    for packed in (True, False):
        critic = _critic(info, model_dir, packed=packed)
        with torch.no_grad():  # the heads start at zero: give them something to say
            critic.module.confidence_head.weight.copy_(torch.tensor([[0.5, -0.25, 0.75]]))
            critic.module.confidence_head.bias.fill_(0.1)
        values[packed] = critic.forward_values(b)
        if packed:
            critic.export(str(tmp_path / "exported"))
        critic.close()
    torch.testing.assert_close(values[True], values[False], rtol=1e-5, atol=1e-6)
    # the value head is zero, so the values are the confidence head's alone, at response tokens only
    expected = (confidence_features(b.sampler_logprobs, b.policy_mask) @ torch.tensor([0.5, -0.25, 0.75])
                + 0.1) * b.policy_mask
    torch.testing.assert_close(values[True], expected, rtol=1e-5, atol=1e-6)
    reloaded = ValueModel.from_pretrained(str(tmp_path / "exported"))
    assert reloaded.confidence_head is not None
    torch.testing.assert_close(reloaded.confidence_head.bias, torch.tensor([0.1]))
    critic = _critic(info, str(tmp_path / "exported"), init="checkpoint")
    torch.testing.assert_close(critic.forward_values(b), values[True], rtol=1e-5, atol=1e-6)
    b = dataclasses.replace(b, sampler_logprobs=None)
    with pytest.raises(ValueError, match="sampler's logprobs"):
        critic.forward_values(b)
    critic.close()
