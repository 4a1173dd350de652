"""``actor.gradient_checkpointing``: active in the train step (every decoder layer runs its forward
again in the backward), and what it is for: a lower train-step peak, measured by `vcppo bench
logprobs`' per-segment peaks (:func:`vcppo.bench.train.train_segments`)."""
import json
import os
import subprocess
import sys

import pytest

from tests.engines.test_engines import PROMPTS, _actor
from tests.engines.token_loss import nll_loss
from vcppo.experience import make_layout

pytestmark = [pytest.mark.integration]


def _layer_calls(info, path, checkpointing: bool) -> list[int]:
    actor = _actor(info, path, gradient_checkpointing=checkpointing)
    layers = actor.module.model.layers
    calls = [0] * len(layers)
    for i, layer in enumerate(layers):
        # a pre-hook: torch's recompute stops once it has what the backward needs (before the
        # forward returns, so a forward hook would not see it)
        layer.register_forward_pre_hook(lambda *a, i=i: calls.__setitem__(i, calls[i] + 1))
    batch = make_layout(PROMPTS, [[20, 21, 22, 1]] * len(PROMPTS), pad_id=0)
    actor.train_step(batch, nll_loss())
    assert actor.module.is_gradient_checkpointing == checkpointing
    return calls


def test_checkpointing_recomputes_every_layer_in_the_backward(info, tiny_model_dir):
    plain, checkpointed = (_layer_calls(info, tiny_model_dir, c) for c in (False, True))
    assert plain == [1, 1] and checkpointed == [2, 2]  # one micro-batch: forward, then the recompute


# Both settings in one fresh process (the bench's worker function; its malloc settings stay there).
PEAKS = """
import json, sys
from argparse import Namespace
from vcppo.bench.logprobs import run_one
from vcppo.models.factory import make_model
make_model("small", None, sys.argv[1])
out = {}
for ck in (False, True):
    args = Namespace(threads=1, repeats=1, phases="train_step", checkpointing=ck, entropy=False)
    out[str(ck)] = run_one(sys.argv[1], "4x64+960", 1024, args)["train_step"]["segments_mib"]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_checkpointing_lowers_the_train_steps_peak(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")}
    res = subprocess.run([sys.executable, "-c", PEAKS, str(tmp_path / "small")], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    peaks = json.loads(res.stdout.strip().splitlines()[-1])
    plain, ckpt = peaks["False"], peaks["True"]
    # measured 260 -> 42 MiB (forward), 267 -> 92 MiB (backward) at this shape: the saved activations go
    assert ckpt["forward"] < 0.5 * plain["forward"]
    assert max(ckpt.values()) < 0.7 * max(plain.values())
