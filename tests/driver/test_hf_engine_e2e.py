"""`vcppo train` with the transformers rollout engine (``rollout.engine=hf``), real engines on the
tiny model: a run in bf16 (the dtype a GPU user trains in), and an fp32 run whose sampler logprobs
the trainer reproduces (mismatch/* near 0) and which, killed with SIGKILL after its first PPO
checkpoint, resumes to the uninterrupted run's metrics exactly."""
import json
import math
import os
import signal
import time

import pytest

from tests.conftest import start_process
from tests.driver.test_exact_resume_e2e import assert_same, records
from tests.driver.test_train_e2e import base_overrides, train
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete

pytestmark = [pytest.mark.integration]


def hf_overrides(art, out, **extra):
    return base_overrides(art, out, **{"rollout.engine": "hf", "trainer.total_steps": 3, "trainer.save_every": 1,
                                       "trainer.keep_last": 5, "value_pretrain.steps": 1, **extra})


def ppo_records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
            if json.loads(x)["phase"] == "ppo"]


@pytest.fixture(scope="module")
def uninterrupted(tiny_artifacts, tmp_path_factory):
    """An fp32 hf run with the sampler's logprobs on: (its output root, its records, its stderr)."""
    root = tmp_path_factory.mktemp("hf_uninterrupted")
    res = train("vcppo", hf_overrides(tiny_artifacts, root, **{"rollout.sampler_logprobs": True}), cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    return root, records(root / "vcppo-seed0"), res.stderr


@pytest.mark.slow
def test_an_hf_run_samples_what_the_trainer_recomputes(uninterrupted):
    root, _, stderr = uninterrupted
    assert "rollout engine: hf (rollout.engine=hf)" in stderr
    ppo = ppo_records(root / "vcppo-seed0")
    assert [r["step"] for r in ppo] == [1, 2, 3]
    for r in ppo:
        assert r["mismatch/logprob_abs_max"] < 1e-4 and abs(r["mismatch/kl_k3"]) < 1e-7
        assert r["rollout/asleep_while_training"] == 0.0  # sleep is a no-op for this engine
        assert r["response/length_mean"] > 0
    assert (root / "vcppo-seed0" / "final" / "actor" / "config.json").exists()


@pytest.mark.slow
def test_a_sigkilled_hf_run_resumes_with_the_uninterrupted_metrics(uninterrupted, tiny_artifacts, tmp_path):
    _, full, _ = uninterrupted
    over = hf_overrides(tiny_artifacts, tmp_path, **{"rollout.sampler_logprobs": True})
    proc = start_process("train", "vcppo", *over, cwd=tmp_path)
    ckpts = checkpoint_root(tmp_path / "vcppo-seed0")
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:  # the first PPO checkpoint (tag 1 + 1)
        if any(p.name >= "step_000002" for p in list_complete(ckpts)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list_complete(ckpts)[-1].name < "step_000004"  # it really was cut short
    res = train("vcppo", over, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from" in res.stderr
    assert_same(records(tmp_path / "vcppo-seed0"), full)


@pytest.mark.slow
def test_a_bf16_run_trains_end_to_end(tiny_artifacts, tmp_path):
    res = train("vcppo", hf_overrides(tiny_artifacts, tmp_path, **{"model.dtype": "bfloat16", "trainer.save_every": 0,
                                                                   "rollout.sampler_logprobs": True}), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    ppo = ppo_records(tmp_path / "vcppo-seed0")
    assert [r["step"] for r in ppo] == [1, 2, 3]
    for r in ppo:
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float))
        # bf16 sampler against bf16 trainer: rounding apart, not fp32's ~1e-6, and far from broken
        assert 0 < r["mismatch/logprob_abs_mean"] < 0.1
    from safetensors.torch import load_file
    weights = load_file(str(next((tmp_path / "vcppo-seed0" / "final" / "actor").glob("*.safetensors"))))
    assert {str(t.dtype) for t in weights.values()} == {"torch.bfloat16"}
