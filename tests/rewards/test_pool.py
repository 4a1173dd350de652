"""Reward scoring in worker processes: same rewards as serial scoring, a hard timeout per sample
(the stuck worker is replaced), crashes and errors counted, custom functions by dotted path."""
import sys
import time
import types

import pytest

from vcppo.rewards.pool import RewardPool, default_num_workers
from vcppo.rewards.verifier import RewardScorer

T = "<think>\n1+2+0=3\n</think>\n"
TOWER = T + "\\boxed{9^{9^{9^{9}}}}"  # math-verify needs ~5-6 s of one C call to give up on it

HELPERS = '''
import os, sys, time

def sleepy(text, truth, **info):
    if "sleep" in text:
        time.sleep(30)
    return 1.0

def crashy(text, truth, **info):
    if "exit" in text:
        os._exit(3)          # the worker process dies mid-chunk
    if "raise" in text:
        raise RuntimeError("reward exploded")
    if "nan" in text:
        return float("nan")
    return 1.0

def sees_parent_module(text, truth, **info):
    return 1.0 if "vcppo_parent_only_marker" in sys.modules else 0.0

def pid(text, truth, **info):
    return float(os.getpid())
'''


@pytest.fixture()
def helpers(reward_module):
    return reward_module("vcppo_pool_helpers", HELPERS)


def test_pool_scores_like_serial_scoring():
    texts = [T + f"\\boxed{{{i % 7}}}" for i in range(40)] + [T + "\\boxed{0.5}", T + "answer: 1/2", T + "42",
                                                              "<think>42</think>", ""]
    truths = ["3"] * 40 + ["\\frac{1}{2}", "0.5", "42", "42", "1"]
    finish = ["stop"] * 44 + ["length"]
    serial = RewardScorer()(texts, truths, finish)
    pooled_scorer = RewardScorer(num_workers=2, timeout_s=30)
    try:
        pooled = pooled_scorer(texts, truths, finish)
    finally:
        pooled_scorer.close()
    assert pooled == serial
    assert pooled[1]["reward/num_timeouts"] == 0.0


def test_hostile_answer_times_out_is_counted_and_its_worker_replaced(helpers):
    scorer = RewardScorer(num_workers=1, timeout_s=1.0)
    pool = scorer._pool
    try:
        first_pid = pool._workers[0].process.pid
        start = time.perf_counter()
        rewards, metrics = scorer([T + "\\boxed{3}", TOWER, T + "\\boxed{3}", T + "\\boxed{4}"], ["3"] * 4)
        elapsed = time.perf_counter() - start
        assert pool.num_restarts == 1 and pool._workers[0].process.pid != first_pid
    finally:
        scorer.close()
    assert rewards == [1.0, -1.0, 1.0, -1.0]
    assert metrics["reward/num_timeouts"] == 1.0 and metrics["reward/num_failures"] == 1.0
    assert scorer.num_timeouts == 1 and scorer._pool is None
    assert elapsed < 4.5, elapsed  # bounded by the 1 s timeout (+ a replacement), not math-verify's ~5 s


def test_stuck_custom_reward_function_times_out(helpers):
    scorer = RewardScorer(f"{helpers}:sleepy", num_workers=2, timeout_s=0.5)
    pool = scorer._pool
    try:
        start = time.perf_counter()
        rewards, metrics = scorer(["a", "sleep", "b", "c", "sleep", "d"], ["x"] * 6)
        elapsed = time.perf_counter() - start
        again, _ = scorer(["e", "f"], ["x"] * 2)  # replacements work
    finally:
        scorer.close()
    assert rewards == [1.0, -1.0, 1.0, 1.0, -1.0, 1.0] and again == [1.0, 1.0]
    assert metrics["reward/num_timeouts"] == 2.0 and pool.num_restarts == 2
    assert elapsed < 10, elapsed


def test_crashes_errors_and_nan_are_failures_and_the_batch_goes_on(helpers):
    scorer = RewardScorer(f"{helpers}:crashy", num_workers=1, timeout_s=10)
    try:
        texts = ["ok", "exit", "ok", "raise", "nan", "ok", "exit", "ok"]
        rewards, metrics = scorer(texts, ["x"] * len(texts))
    finally:
        scorer.close()
    assert rewards == [1.0, -1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0]
    assert metrics["reward/num_failures"] == 4.0 and metrics["reward/num_timeouts"] == 0.0


def test_workers_do_not_inherit_the_trainers_memory(helpers):
    """fork would copy the parent (vLLM, DeepSpeed, CUDA); workers start from a clean interpreter."""
    sys.modules["vcppo_parent_only_marker"] = types.ModuleType("vcppo_parent_only_marker")
    try:
        scorer = RewardScorer(f"{helpers}:sees_parent_module", num_workers=1, timeout_s=30)
        try:
            rewards, _ = scorer(["a"], ["x"])
            assert scorer._pool._ctx.get_start_method() in ("forkserver", "spawn")
        finally:
            scorer.close()
    finally:
        del sys.modules["vcppo_parent_only_marker"]
    assert rewards == [0.0]


def test_a_reward_function_workers_cannot_import_stops_with_a_clear_error():
    mod = types.ModuleType("vcppo_only_in_this_process")  # importable here, not in a fresh interpreter
    mod.f = lambda text, truth, **info: 1.0
    sys.modules[mod.__name__] = mod
    try:
        scorer = RewardScorer("vcppo_only_in_this_process:f", num_workers=1, timeout_s=5)
        with pytest.raises(RuntimeError, match="num_workers=0"):
            scorer(["a"], ["x"])
        scorer.close()
    finally:
        del sys.modules[mod.__name__]


def test_unpicklable_callable_is_refused():
    with pytest.raises(TypeError, match="num_workers=0"):
        RewardPool(lambda text, truth, **info: 1.0, num_workers=1, timeout_s=1)
    with pytest.raises(ValueError):
        RewardPool("vcppo.rewards.verifier:score", num_workers=1, timeout_s=float("inf"))


def test_serial_path_runs_in_this_process(helpers):
    import os
    rewards, _ = RewardScorer(f"{helpers}:pid", num_workers=0)(["a"], ["x"])
    assert rewards == [float(os.getpid())]  # where breakpoint() works


@pytest.mark.parametrize("cores,ranks,busy,expected", [
    (2, 1, 2, 1),      # CPU run using both cores: at least one worker
    (16, 2, 1, 7),     # 2 GPU ranks leave 14 cores: 7 per rank
    (128, 8, 1, 15),
    (4, 1, 1, 3),
    (8, 4, 4, 1),
])
def test_default_num_workers(cores, ranks, busy, expected):
    assert default_num_workers(cores, ranks, busy) == expected


def test_reward_workers_follows_the_config(monkeypatch):
    import os

    import torch

    from vcppo.config.load import load_config
    from vcppo.driver.context import reward_workers
    assert reward_workers(load_config(None, ["reward.num_workers=3"])) == 3
    assert reward_workers(load_config(None, ["reward.num_workers=0"])) == 0
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert reward_workers(load_config(None, ["trainer.device=cuda"])) == 7   # 2 GPU ranks, 14 idle cores
    assert reward_workers(load_config(None, ["trainer.device=cpu"])) == 1    # CPU ranks use every core
