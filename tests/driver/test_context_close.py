"""RunContext.close (driver.context.close_parts): after an error every part closes and the run's own error stays the one the
user sees; after a clean run a failing part is raised."""
from types import SimpleNamespace

import pytest

from vcppo.driver import context
from vcppo.driver.context import RunContext


def _ctx(calls, failing="logger"):
    def part(name):
        def close(final=False):
            calls.append(name)
            if name == failing:
                raise PermissionError(f"[Errno 13] Permission denied: 'run/wandb/debug.log' ({name})")
        return SimpleNamespace(close=close)
    return SimpleNamespace(log=part("logger"), scorer=part("scorer"), timeline=part("timeline"),
                           rollout=part("rollout"), critic=None, run_lock=None)


@pytest.fixture(autouse=True)
def no_process_group(monkeypatch):
    monkeypatch.setattr(context.D, "shutdown", lambda wait_for_peers: None)


def test_after_an_error_a_part_failing_to_close_is_one_line_and_the_run_error_wins(capsys):
    calls = []
    with pytest.raises(OSError, match="disk turned read-only"):
        try:
            raise OSError("disk turned read-only")  # the run's own error
        finally:
            RunContext.close(_ctx(calls), clean=False)
    assert calls == ["logger", "scorer", "timeline", "rollout"]  # the others still closed
    err = capsys.readouterr().err
    assert "the logger failed to close too: PermissionError" in err and err.count("\n") == 1


def test_after_a_clean_run_a_failing_part_is_raised_once_everything_closed():
    calls = []
    with pytest.raises(PermissionError, match="scorer"):
        RunContext.close(_ctx(calls, failing="scorer"), clean=True)
    assert calls == ["logger", "scorer", "timeline", "rollout"]
