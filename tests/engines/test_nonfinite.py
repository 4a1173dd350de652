"""Non-finite steps: a train step whose loss or advantages are non-finite is skipped on the
real engines (ZeRO 1, 2, 3 and no ZeRO, one rank), leaving no trace; non-finite weights are never written."""
import math

import pytest
import torch

from tests.engines.token_loss import TokenLoss, nll_loss
from vcppo.experience import ActorBatch, Rollout, make_layout

pytestmark = [pytest.mark.integration]


def _actor(info, path, **kw):
    from vcppo.engines.actor import ActorEngine
    from vcppo.config.schema import ActorConfig
    cfg = ActorConfig(**{"lr": 1e-3, "micro_batch_size": 1, "grad_clip": 1.0, "warmup_steps": 2,
                         "lr_schedule": "cosine", **kw})
    return ActorEngine(path, cfg, info, total_optimizer_steps=10)


def _batch():
    return make_layout([[5, 6], [7, 8, 9]], [[10, 11, 12], [13, 14]], pad_id=0)


def _nan_advantages():
    layout = _batch()
    advantages = torch.zeros_like(layout.policy_mask, dtype=torch.float32)
    advantages[1, 0] = float("nan")  # one bad value on the second micro-batch
    return ActorBatch(**vars(Rollout.unscored(layout)), advantages=advantages)


BAD = {
    # NaN loss (NaN gradients)
    "nan_loss": (lambda: _batch(), TokenLoss(lambda out, micro: -out.logprobs * float("nan"))),
    # inf loss with FINITE gradients: d(x + inf)/dx = 1, so only the loss check catches it
    "inf_loss": (lambda: _batch(), TokenLoss(lambda out, micro: -out.logprobs + float("inf"))),
    # finite loss, non-finite advantages in the mini-batch
    "nan_advantages": (_nan_advantages, nll_loss()),
}


@pytest.mark.parametrize("zero_stage", [3, 2, 1, 0])
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_nonfinite_step_is_skipped_without_a_trace(case, zero_stage, info, tiny_model_dir):
    """bad step then good step == the good step alone: weights, lr and the next step's figures."""
    make_bad, bad_loss = BAD[case]
    a = _actor(info, tiny_model_dir, zero_stage=zero_stage)
    before = a.full_state_dict()
    m_bad = a.train_step(make_bad(), bad_loss)
    assert m_bad["nonfinite_skipped"] == 1.0
    after = a.full_state_dict()
    for k in before:
        assert torch.equal(after[k], before[k]), k  # no update applied
    m_good = a.train_step(_batch(), nll_loss())
    assert m_good["nonfinite_skipped"] == 0.0 and math.isfinite(m_good["grad_norm"])

    ref = _actor(info, tiny_model_dir, zero_stage=zero_stage)
    m_ref = ref.train_step(_batch(), nll_loss())
    assert m_good["lr"] == m_ref["lr"]  # the schedule did not advance on the skipped step
    assert m_good["grad_norm"] == pytest.approx(m_ref["grad_norm"], rel=1e-6)
    w, w_ref = a.full_state_dict(), ref.full_state_dict()
    for k in w:
        torch.testing.assert_close(w[k], w_ref[k], rtol=1e-6, atol=1e-7)  # optimizer moments untouched


@pytest.mark.parametrize("zero_stage", [3, 0])
def test_nonfinite_weights_are_never_written(zero_stage, info, tiny_model_dir, tmp_path):
    from vcppo.engines.deepspeed_engine import NonFiniteError
    a = _actor(info, tiny_model_dir, zero_stage=zero_stage)
    a.check_finite_weights("a test")  # finite: no error
    p = next(iter(a.module.parameters()))
    local = p.ds_tensor if hasattr(p, "ds_tensor") else p.data
    with torch.no_grad():
        local.view(-1)[0] = float("inf")
    with pytest.raises(NonFiniteError, match="refusing to write checkpoint"):
        a.save_checkpoint(str(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.extended
def test_two_ranks_skip_together_when_one_rank_is_nonfinite(tiny_model_dir, tmp_path):
    import json

    from tests.engines.test_distributed import cpu_worker
    cpu_worker("tests.engines.nonfinite_worker", "--model", tiny_model_dir, "--out", str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [{"bad": 1.0, "unchanged": True, "good": 0.0, "moved": True}] * 2
