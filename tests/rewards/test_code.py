"""The code-execution reward (vcppo.rewards.code): programs from responses, stdin/stdout and assert
cases, per-case limits, partial credit, data_source routing; hostile programs scored wrong, and one
that holds its reward past the pool's limit counted as a timeout, with nothing left running."""
import json
import time
import uuid

import psutil
import pytest

from vcppo.rewards.code import extract_program, parse_cases, pass_rate, score
from vcppo.rewards.routing import GroundTruth
from vcppo.rewards.verifier import RewardScorer

ADD = json.dumps({"inputs": ["2 3\n", "-10 4\n", "0 0\n"], "outputs": ["5\n", "-6\n", "0\n"]})
ADD_ASSERTS = json.dumps({"assert_case": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]})


def _fenced(code: str) -> str:
    return f"<think>sum the two</think>\n```python\n{code}\n```"


def test_program_is_the_last_fence_after_think():
    assert extract_program("<think>```python\nx=1\n```</think>```python\nprint(1)\n```\n```py\nprint(2)\n```") \
        == "print(2)\n"
    assert extract_program("</think>print(3)") == "print(3)" and extract_program("</think>  ") is None


def test_stdin_stdout_cases_all_or_nothing():
    right = _fenced("a, b = map(int, input().split())\nprint(a + b)  ")
    assert score(right, ADD) == 1.0
    assert score(_fenced("a, b = map(int, input().split())\nprint(abs(a + b))"), ADD) == -1.0  # one case wrong
    assert score(right, ADD, finish_reason="length") == -1.0
    assert pass_rate(_fenced("a, b = map(int, input().split())\nprint(abs(a) + b)"), ADD) == pytest.approx(2 / 3)


def test_assert_cases_and_literal_ground_truth():
    assert score(_fenced("def add(a, b):\n    return a + b"), ADD_ASSERTS) == 1.0
    assert pass_rate(_fenced("def add(a, b):\n    return a * b + 1"), ADD_ASSERTS) == 0.5
    mbpp = str({"test_list": ["assert add(1, 2) == 3"]})  # a Python literal, as str() of a dict gives
    assert score(_fenced("def add(a, b):\n    return a + b"), mbpp) == 1.0


def test_bad_ground_truth_names_the_problem():
    for truth, what in (("{", "neither JSON"), ('{"inputs": [1]}', "equal length"), ('{"fn_name": "f"}', "fn_name"),
                        ('{"inputs": [], "outputs": []}', "0 cases"), ('{"assert_case": ["1"], "time_limit": -1}',
                                                                       "time_limit")):
        with pytest.raises(ValueError, match=what):
            parse_cases(truth)


def test_per_case_time_limit():
    truth = {"inputs": [""], "outputs": ["5"]}
    assert score(_fenced("import time\ntime.sleep(1)\nprint(5)"), json.dumps({**truth, "time_limit": 3})) == 1.0
    start = time.monotonic()
    assert score(_fenced("import time\ntime.sleep(8)\nprint(5)"), json.dumps({**truth, "time_limit": 0.5})) == -1.0
    assert time.monotonic() - start < 5.0  # stopped at its limit, not after its sleep


def _marked(marker: str) -> list:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or ())]


def _marking(code: str, marker: str) -> str:
    return _fenced(f"import os, sys\nif len(sys.argv) == 1:\n    os.execv(sys.executable, [sys.executable, '-I', "
                   f"'-S', sys.argv[0], {marker!r}])\n{code}")


def test_hostile_programs_in_the_reward_pool_are_counted_and_contained():
    """Routed by data_source, scored in the pool: a fork bomb, an infinite loop, a flood of output and
    a read of /etc/passwd score wrong; a loop in every one of many cases outlasts the pool's limit
    and is a counted timeout; no process of theirs survives; a right program still scores."""
    marker = f"vcppo-hostile-{uuid.uuid4().hex}"
    one = GroundTruth(json.dumps({"inputs": [""], "outputs": ["root"], "time_limit": 1}), {"data_source": "vcppo/code"})
    # a pool limit well above one case's (a loaded host starts sandboxes slowly) and far below many cases'
    many = GroundTruth(json.dumps({"inputs": [""] * 20, "outputs": ["x"] * 20, "time_limit": 1}),
                       {"data_source": "vcppo/code-partial"})  # partial credit runs every case
    add = GroundTruth(ADD, {"data_source": "vcppo/code"})
    texts = [_marking("while True:\n    try:\n        os.fork()\n    except OSError:\n        pass", marker),
             _marking("while True: pass", marker),
             _fenced("import sys\nwhile True: sys.stdout.write('root' * 10000)"),
             _fenced("print(open('/etc/passwd').read().split(':')[0])"),
             _marking("while True: pass", marker),
             _fenced("a, b = map(int, input().split())\nprint(a + b)")]
    scorer = RewardScorer(functions_by_source={"vcppo/code": "vcppo.rewards.code:score",
                                               "vcppo/code-partial": "vcppo.rewards.code:pass_rate"},
                          num_workers=1, timeout_s=8.0)
    try:
        rewards, metrics = scorer(texts, [one, one, one, one, many, add])
    finally:
        scorer.close()
    assert rewards == [-1.0] * 5 + [1.0]
    assert (metrics["reward/num_timeouts"], metrics["reward/num_failures"]) == (1.0, 1.0)
    time.sleep(0.5)
    assert not _marked(marker)


def test_verl_code_sources_route_here_under_verl_parity():
    truth = [GroundTruth(ADD, {"data_source": source}) for source in ("apps", "taco", "openai/gsm8k")]
    program = _fenced("a, b = map(int, input().split())\nprint(abs(a) + b)")  # passes 2 of 3 cases
    rewards, _ = RewardScorer(verl_parity=True)([program] * 3, truth)
    assert rewards[:2] == [pytest.approx(2 / 3)] * 2 and rewards[2] == 0.0  # gsm8k: verl's strict rule
