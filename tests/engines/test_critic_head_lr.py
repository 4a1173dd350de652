"""``critic.head_lr_scale``: the value head trains at lr x scale, the backbone at lr. Real DeepSpeed
critic (tiny Qwen2, one rank): Adam's first step moves every weight by ~its group's lr, so the head's
largest first move must be ~lr x scale; the backbone (no gradient at the first step: the head is
zero) moves by at most ~lr at the second, whatever the scale."""
import pytest
import torch

from vcppo.experience import CriticBatch, Rollout, make_layout
from vcppo.config.schema import CriticConfig

pytestmark = [pytest.mark.integration]


def _first_step_moves(model_dir, info, scale: float) -> tuple[float, float, list]:
    from vcppo.driver.step.update import ValueLoss
    from vcppo.engines.critic import CriticEngine
    cfg = CriticConfig(lr=1e-3, head_lr_scale=scale, warmup_steps=0, lr_schedule="constant", grad_clip=0.0,
                       value_clip=None)  # the test keeps old_values at 0: a clip would stop step 2
    critic = CriticEngine("policy", model_dir, cfg, info, total_optimizer_steps=4)
    before = {k: v.clone() for k, v in critic.full_state_dict().items()}
    r = Rollout.unscored(make_layout([[5, 6], [7, 8, 9]], [[10, 11, 12], [13, 14]], pad_id=0))
    b = CriticBatch(**vars(r), old_values=torch.zeros(r.policy_mask.shape),
                    returns=torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]) * r.policy_mask)
    critic.train_step(b, ValueLoss(cfg, "token-mean"))
    first = {k: v.clone() for k, v in critic.full_state_dict().items()}
    critic.train_step(b, ValueLoss(cfg, "token-mean"))
    second = critic.full_state_dict()
    lrs = [g["lr"] for g in critic.optimizer.param_groups]
    critic.close()
    head = max((first[k] - before[k]).abs().max().item() for k in before if k.startswith("value_head."))
    body = max((second[k] - first[k]).abs().max().item() for k in before if not k.startswith("value_head."))
    return head, body, lrs


def test_the_value_head_trains_at_its_own_rate(info, tmp_path):
    from tests.engines.conftest import build_tiny_model
    model_dir = build_tiny_model(tmp_path / "m")
    head, body, lrs = _first_step_moves(model_dir, info, scale=30.0)
    assert lrs == pytest.approx([1e-3, 3e-2])
    assert head == pytest.approx(3e-2, rel=0.05) and 0 < body <= 1.05e-3
    head1, body1, lrs1 = _first_step_moves(model_dir, info, scale=1.0)
    assert lrs1 == pytest.approx([1e-3])
    assert head1 == pytest.approx(1e-3, rel=0.05) and 0 < body1 <= 1.05e-3
