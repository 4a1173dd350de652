"""Env turns in the isolated worker pool: an env that raises, hangs, exits or answers garbage ends
its episode as a counted failure while the others go on; a worker that did not serve an episode's
earlier turns replays them."""
import pytest

from vcppo.envs.base import Turn
from vcppo.envs.worker import EnvRunner, EpisodeKey

HOSTILE = "tests.envs.hostile"


def key(env: str, episode: str = "e", actions=()) -> EpisodeKey:
    return EpisodeKey(episode, f"{HOSTILE}:{env}", (), (("answer", "1"),), 0, tuple(actions))


@pytest.mark.parametrize("workers", [0, 2])
def test_hostile_envs_are_counted_and_the_rest_go_on(workers):
    runner = EnvRunner(num_workers=workers, timeout_s=2.0)
    try:
        kinds = ["Raises", "Garbage", "Fine"] + (["Hangs", "Exits"] if workers else [])  # in process: no bound
        out = runner.step([("a", key(k, f"e{i}")) for i, k in enumerate(kinds)])
        assert isinstance(out[kinds.index("Fine")], Turn) and out[kinds.index("Fine")].observation == "ok 1"
        failed = [k for k, o in zip(kinds, out) if isinstance(o, str)]
        assert failed == [k for k in kinds if k != "Fine"]
        assert "the env broke" in out[0] and "finite" in out[1]
        assert runner.num_failures == len(failed) and runner.num_timeouts == (1 if workers else 0)
        if workers:
            assert out[kinds.index("Hangs")] == "timeout: no env answer within 2 s"
            assert "env worker died (exit code 3)" in out[kinds.index("Exits")]
        # the pool still serves: a later turn of the good episode replays or continues it exactly
        third = runner.step([("c", key("Fine", "e2", actions=("a", "b")))])[0]
        assert (third.observation, third.reward, third.terminated) == ("ok 3", 1.0, True)
    finally:
        runner.close()


def test_arguments_the_env_does_not_take_are_named_with_where_they_came_from():
    """`rollout.env=tools` on guess rows (whose extra_info carries the guess env's arguments): every
    episode fails, and the failure says which arguments and from where."""
    runner = EnvRunner(num_workers=0, timeout_s=2.0)
    out = runner.step([("a", EpisodeKey("e", "tools", (("n", 16),), (("answer", "1"),), 0))])[0]
    assert isinstance(out, str) and "env 'tools' does not take the arguments {'n': 16}" in out
    assert "extra_info" in out and runner.num_failures == 1


def test_turns_that_hang_time_out_side_by_side_across_the_pool():
    """Four turns that hang among 32, on 2 workers with a 1.5 s limit: two rounds of timeouts (~3 s), not
    four one after another on the worker that was sent them together (6 s)."""
    import time
    runner = EnvRunner(num_workers=2, timeout_s=1.5)
    try:
        runner.step([("a", key("Fine", "warm"))])  # both workers started
        started = time.perf_counter()
        out = runner.step([("a", key("Hangs" if i < 4 else "Fine", f"e{i}")) for i in range(32)])
        took = time.perf_counter() - started
        assert [isinstance(o, str) for o in out] == [True] * 4 + [False] * 28 and runner.num_timeouts == 4
        assert took < 4.8, f"{took:.1f} s for 4 timeouts of 1.5 s on 2 workers"
    finally:
        runner.close()
