"""`vcppo train` with real engines that cannot make progress: a reward on a scale that
overflows the losses (every optimizer step non-finite, so skipped) and a reward function that
fails on every sample. Both abort at their limit with exit 2 and one clear line, keeping the last
good checkpoint (none written while steps are being skipped) and writing no final export."""
import pytest

from tests.driver.test_train_e2e import base_overrides, train
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete
from vcppo.tracking import read_metrics

pytestmark = [pytest.mark.integration]

REWARDS = '''
def huge(text, truth, **kw):
    return 1e30  # finite, but its square overflows fp32: the critic's value loss is inf


def broken(text, truth, **kw):
    raise RuntimeError("reward backend down")
'''


def _run(art, tmp_path, fn, **extra):
    (tmp_path / "hostile_rewards.py").write_text(REWARDS)  # importable: cwd is on the path
    o = {"reward.function": f"hostile_rewards:{fn}", "reward.num_workers": 0, "trainer.total_steps": 4,
         "trainer.save_every": 1, "trainer.keep_last": 4, "value_pretrain.enabled": False, **extra}
    return train("vcppo", base_overrides(art, tmp_path, **o), cwd=tmp_path, timeout=600)


@pytest.mark.slow
def test_nonfinite_steps_are_skipped_then_abort_keeping_the_last_good_checkpoint(tiny_artifacts, tmp_path):
    res = _run(tiny_artifacts, tmp_path, "huge", **{"trainer.max_nonfinite_steps": 2})
    assert res.returncode == 2, res.stderr[-4000:]
    assert "PPO step 2: 2 steps in a row had optimizer steps skipped" in res.stderr
    assert "Traceback" not in res.stderr
    # the first skipped step is said when it happens, and no checkpoint is written during the streak
    assert "PPO step 1: optimizer step skipped for a non-finite" in res.stderr
    assert "no checkpoint at step 1: the last 1 step(s) were skipped" in res.stderr
    run = tmp_path / "vcppo-seed0"
    recs = sorted(read_metrics(run, "ppo"), key=lambda r: r["step"])
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:  # every critic update was skipped (an inf value loss) and says so; the actor's
        # whitened advantages stay finite, so its updates were applied
        assert r["critic/nonfinite_skipped"] == 1.0 and r["actor/nonfinite_skipped"] == 0.0
    assert list_complete(checkpoint_root(run)) == []  # every step skipped something: none is "good"
    assert not (run / "final").exists()


@pytest.mark.slow
def test_a_reward_function_failing_on_every_sample_aborts(tiny_artifacts, tmp_path):
    res = _run(tiny_artifacts, tmp_path, "broken", **{"trainer.max_failed_reward_steps": 2})
    assert res.returncode == 2, res.stderr[-4000:]
    assert "PPO step 2: the reward function failed on every sample for 2 steps in a row" in res.stderr
    assert "reward backend down" in res.stderr  # the function's own error was shown before
    run = tmp_path / "vcppo-seed0"
    recs = sorted(read_metrics(run, "ppo"), key=lambda r: r["step"])
    assert [r["reward/step_failures"] for r in recs] == [8.0, 8.0]  # 4 prompts x 2 samples
    assert [p.name for p in list_complete(checkpoint_root(run))] == ["step_000001"]
    assert not (run / "final").exists()


@pytest.mark.slow
def test_nonfinite_value_pretraining_aborts_before_publishing_a_critic(tiny_artifacts, tmp_path):
    res = _run(tiny_artifacts, tmp_path, "huge", **{"trainer.max_nonfinite_steps": 2, "value_pretrain.enabled": True,
                                                    "value_pretrain.steps": 4})
    assert res.returncode == 2, res.stderr[-4000:]
    assert "value-pretraining step 2: 2 steps in a row had optimizer steps skipped" in res.stderr
    run = tmp_path / "vcppo-seed0"
    assert [r["critic/nonfinite_skipped"] for r in read_metrics(run, "value_pretrain")] == [1.0, 1.0]
    assert read_metrics(run, "ppo") == []
    assert list_complete(checkpoint_root(run)) == []  # step 1 skipped: its critic is not a good one
    assert not list((tmp_path / "critic_cache").glob("*/vcppo_pretrain.json"))  # nothing published
