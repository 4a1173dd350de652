"""`zero_stage: null` (auto): ZeRO-0 on one rank, and on resume the stage the checkpoint was written
with (ZeRO-3 and ZeRO-0 checkpoints have different layouts), on the real DeepSpeed engine."""
import pytest
import torch

from tests.engines.token_loss import nll_loss
from vcppo.engines.engine_setup import checkpoint_zero_stage, resolve_zero_stage
from vcppo.experience import make_layout

pytestmark = [pytest.mark.integration]


def _actor(info, path, zero_stage, dtype="auto"):
    from vcppo.engines.actor import ActorEngine
    from vcppo.config.schema import ActorConfig
    return ActorEngine(path, ActorConfig(lr=1e-2, micro_batch_size=2, zero_stage=zero_stage), info,
                       total_optimizer_steps=4, dtype=dtype)


def test_auto_stage_rules(tmp_path):
    assert resolve_zero_stage(None, 1) == 0 and resolve_zero_stage(None, 2) == 3
    assert resolve_zero_stage(1, 1) == 1 and resolve_zero_stage(3, 1, str(tmp_path)) == 3
    assert checkpoint_zero_stage(str(tmp_path)) is None and resolve_zero_stage(None, 1, str(tmp_path)) == 0


@pytest.mark.slow
def test_auto_is_zero0_on_one_rank_and_resumes_a_zero3_checkpoint_as_zero3(info, tiny_model_dir, tmp_path):
    batch = make_layout([[5, 6], [7, 8, 9]], [[10, 11, 12], [13, 14]], pad_id=0)
    for stage in (3, None):  # a checkpoint written before auto existed (ZeRO-3), and one under auto
        a = _actor(info, tiny_model_dir, stage)
        assert a.zero_stage == (3 if stage == 3 else 0)
        a.train_step(batch, nll_loss())
        a.save_checkpoint(str(tmp_path / f"s{stage}"))
        weights = a.full_state_dict()
        a.close()
        written = checkpoint_zero_stage(str(tmp_path / f"s{stage}"))
        assert written == (3 if stage == 3 else 0)
        b = _actor(info, tiny_model_dir, resolve_zero_stage(None, 1, str(tmp_path / f"s{stage}")))
        b.load_checkpoint(str(tmp_path / f"s{stage}"))
        assert b.zero_stage == written and b.global_steps == 1
        for name, w in b.full_state_dict().items():
            torch.testing.assert_close(w, weights[name], rtol=0, atol=0)
        b.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # torch's AdamW, DeepSpeed's BF16_Optimizer
def test_zero0_on_one_rank_skips_deepspeeds_identity_allreduce(info, tiny_model_dir, dtype):
    """One data-parallel rank without ZeRO: DeepSpeed's backward would copy every gradient into a flat
    bucket to reduce it over the one rank; it is skipped, and the step is the one it would have made."""
    batch = make_layout([[5, 6], [7, 8, 9]], [[10, 11, 12], [13, 14]], pad_id=0)
    skipped, reduced = _actor(info, tiny_model_dir, 0, dtype), _actor(info, tiny_model_dir, 0, dtype)
    assert skipped.engine.enable_backward_allreduce is False
    reduced.engine.enable_backward_allreduce = True  # DeepSpeed's own behaviour
    calls = []
    for a in (skipped, reduced):
        original = a.engine.allreduce_gradients
        a.engine.allreduce_gradients = lambda *args, _f=original, _a=a, **kw: (calls.append(_a), _f(*args, **kw))[1]
        for _ in range(2):
            a.train_step(batch, nll_loss())
    assert calls.count(skipped) == 0 and calls.count(reduced) == 2
    want = reduced.full_state_dict()
    for name, w in skipped.full_state_dict().items():
        torch.testing.assert_close(w, want[name], rtol=0, atol=0)
    zero3 = _actor(info, tiny_model_dir, 3, dtype)
    assert zero3.engine.enable_backward_allreduce is True  # ZeRO's reduction is real work: kept
    for a in (skipped, reduced, zero3):
        a.close()
