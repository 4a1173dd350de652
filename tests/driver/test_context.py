"""The run's wiring (driver/context.py): rank-count errors come before the process group exists."""
import pytest

from vcppo.config.load import load_config
from vcppo.driver import context
from vcppo.config.schema import ConfigError


@pytest.mark.parametrize("overrides, key", [
    (["actor.sequence_parallel_size=4"], "actor.sequence_parallel_size"),  # SP 4 on 2 ranks
    (["trainer.prompts_per_step=3"], "trainer.prompts_per_step"),
])
def test_a_rank_count_error_exits_before_deepspeed_builds_its_shm_segments(overrides, key, monkeypatch):
    """DeepSpeed's CPU shm collective makes a /dev/shm segment per rank at init_distributed, which only a
    clean end of a run removes: an error that the launched rank count decides must come before it."""
    started = []
    monkeypatch.setattr(context.D, "get_info", lambda: None)
    monkeypatch.setattr(context.D, "init_distributed", lambda *a, **k: started.append(a))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        context.init_run_distributed(load_config("vcppo", overrides))
    assert started == []
    monkeypatch.setenv("WORLD_SIZE", "4")
    if key == "actor.sequence_parallel_size":
        context.init_run_distributed(load_config("vcppo", overrides))
        assert len(started) == 1
