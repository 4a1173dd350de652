"""Real DeepSpeed ZeRO-3 checkpoints (actor: weights, Adam moments, cosine schedule) load with
weights_only=True and resume exactly; a print-on-unpickle object planted in a state file is
refused without running. One rank, in this process."""
import glob

import pytest
import torch

from tests.engines.token_loss import nll_loss
from vcppo.engines.safe_checkpoint import WeightsOnlyCheckpointEngine, use_weights_only_loading
from vcppo.experience import make_layout

pytestmark = [pytest.mark.integration]

PAYLOAD_OUTPUT = "PLANTED-CODE-RAN"


class PrintOnUnpickle:
    def __reduce__(self):
        return (print, (PAYLOAD_OUTPUT,))


def _actor(info, path):
    from vcppo.engines.actor import ActorEngine
    from vcppo.config.schema import ActorConfig
    cfg = ActorConfig(lr=1e-3, micro_batch_size=2, grad_clip=0.0, warmup_steps=4, lr_schedule="cosine",
                      zero_stage=3)  # the layout this test plants into (auto is ZeRO-0 on one rank)
    return ActorEngine(path, cfg, info, total_optimizer_steps=10)


def test_zero3_checkpoint_resumes_exactly_with_weights_only_and_refuses_a_planted_object(
        info, tiny_model_dir, tmp_path, capsys):
    b = make_layout([[5, 6], [7, 8, 9]], [[10, 11, 12], [13, 14]], pad_id=0)
    a = _actor(info, tiny_model_dir)
    a.train_step(b, nll_loss())
    a.save_checkpoint(str(tmp_path / "ckpt"))
    a.train_step(b, nll_loss())
    w_cont = a.full_state_dict()

    fresh = _actor(info, tiny_model_dir)
    use_weights_only_loading(fresh.engine)
    assert isinstance(fresh.engine.checkpoint_engine, WeightsOnlyCheckpointEngine)
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    fresh.train_step(b, nll_loss())
    w_res = fresh.full_state_dict()
    for k in w_cont:
        assert torch.equal(w_res[k], w_cont[k]), k  # moments and schedule came back

    (optim_file,) = glob.glob(str(tmp_path / "ckpt" / "ds" / "*optim_states.pt"))
    state = torch.load(optim_file, weights_only=False)  # our own file, to plant into
    state["planted"] = PrintOnUnpickle()
    torch.save(state, optim_file)
    capsys.readouterr()
    victim = _actor(info, tiny_model_dir)
    use_weights_only_loading(victim.engine)
    with pytest.raises(Exception, match="Unsupported global: GLOBAL print"):
        victim.load_checkpoint(str(tmp_path / "ckpt"))
    assert PAYLOAD_OUTPUT not in capsys.readouterr().out
