"""The run's wiring (driver/context.py): rank-count errors come before the process group exists."""
import pytest

from vcppo.config.load import load_config
from vcppo.config.placement import Placement
from vcppo.driver import context
from vcppo.errors import ConfigError


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
        context.init_run_distributed(cfg := load_config("vcppo", overrides), Placement.of(cfg))
    assert started == []
    monkeypatch.setenv("WORLD_SIZE", "4")
    if key == "actor.sequence_parallel_size":
        context.init_run_distributed(cfg := load_config("vcppo", overrides), Placement.of(cfg))
        assert len(started) == 1


@pytest.mark.extended  # the mechanism's own test: tests/runtime/test_shm_segment.py
@pytest.mark.distributed
def test_a_data_row_error_on_two_ranks_leaves_no_shm_segment(tiny_artifacts, tmp_path):
    """The bad row is found after the process group (and DeepSpeed's shm segments, LOCAL_SIZE set as the
    deepspeed launcher sets it) exists: the error exit leaves nothing in /dev/shm."""
    import os
    from pathlib import Path

    from tests.conftest import ENV, start_process
    from vcppo.runtime.launch_env import free_port
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "", "answer": "3"}\n')
    port = free_port()
    job = dict(ENV, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", LOCAL_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    errs = [tmp_path / f"rank{r}.err" for r in range(2)]
    procs = [start_process("train", "vcppo", f"model.policy_path={tiny_artifacts / 'tiny'}",
                           f"data.train_files={tmp_path / 'bad.jsonl'}", "data.val_files=null",
                           f"trainer.output_root={tmp_path}", "trainer.prompts_per_step=2", "logging.wandb=false",
                           cwd=tmp_path, env=dict(job, RANK=str(r), LOCAL_RANK=str(r)), err=str(errs[r]))
             for r in range(2)]
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [2, 2] and "empty or null prompt" in errs[0].read_text(), errs[0].read_text()[-2000:]
    assert list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_*")) == []
