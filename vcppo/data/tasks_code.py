"""Task ``code``: write a program that reads integers from stdin and prints an expression of them,
scored by running it against test cases (the code-execution reward, :mod:`vcppo.rewards.code`).

    prompt:   code: a*3+b-7
    solution: <think>
              </think>
              a,b=map(int,input().split())
              print(a*3+b-7)
    answer:   {"inputs": ["12 5\\n", ...], "outputs": ["34\\n", ...]}    (CASES stdin/stdout pairs)

What a tiny character-level model can learn: the program is a fixed frame around a copy of the
prompt's expression, so a short SFT teaches it, and RL sees rewards that only running the program
gives (a copied expression with a wrong operator fails some cases). ``difficulty``: the most digits
of a constant; ``operands``: the number of inputs (a, b, c, ...), each followed by a constant, with
``+``, ``-`` or ``*`` between neighbours. A row's ``data_source`` in ``--format verl`` is ``vcppo/code``: route it with
``reward.functions_by_source.vcppo/code=vcppo.rewards.code:score``.
"""
from __future__ import annotations

import json
import random
import string

from vcppo.data.distinct import distinct_rows

CASES = 3
OPS = "+-*"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def tokens(names: list[str], ops: list[str], constants: list[int]) -> list:
    """``[a, "*", 3, "+", b, "-", 7]``: each input then a constant, ``ops`` (``2 * len(names) - 1`` of
    them) between neighbours."""
    items = [x for n, c in zip(names, constants) for x in (n, c)]
    out = [items[0]]
    for op, item in zip(ops, items[1:]):
        out += [op, item]
    return out


def evaluate(items: list, values: dict[str, int]) -> int:
    """The value of :func:`tokens`' expression, names replaced by ``values`` (``*`` before ``+`` / ``-``)."""
    numbers = [values.get(x, x) if isinstance(x, str) and x not in OPS else x for x in items]
    terms, signs, product = [], [1], numbers[0]
    for i in range(1, len(numbers), 2):
        op, operand = numbers[i], numbers[i + 1]
        if op == "*":
            product *= operand
        else:
            terms.append(product)
            signs.append(1 if op == "+" else -1)
            product = operand
    terms.append(product)
    return sum(s * t for s, t in zip(signs, terms))


def program(names: list[str], expr: str) -> str:
    """The target program: read the inputs from one line, print the expression."""
    return f"{','.join(names)}=map(int,input().split())\nprint({expr})"


def generate_rows(split: str, n: int, operands: int, digits: int, seed: int, split_of) -> list[dict]:
    """``n`` distinct rows of ``split`` (prompt, answer: the test cases as JSON, solution, task,
    difficulty), deterministic in (operands, digits, split, seed)."""
    if operands > len(string.ascii_lowercase):
        raise ValueError(f"operands must be <= {len(string.ascii_lowercase)} for task code, got {operands}")
    rng = random.Random(f"code|{digits}|{operands}|{split}|{seed}")
    names = list(string.ascii_lowercase[:operands])

    def draw():
        ops = [rng.choice(OPS) for _ in range(2 * operands - 1)]
        items = tokens(names, ops, [rng.randint(1, 10 ** digits - 1) for _ in names])
        expr = "".join(map(str, items))

        def build():
            inputs = [[rng.randint(0, 99) for _ in names] for _ in range(CASES)]
            cases = {"inputs": [" ".join(map(str, v)) + "\n" for v in inputs],
                     "outputs": [f"{evaluate(items, dict(zip(names, v)))}\n" for v in inputs]}
            return {"prompt": f"code: {expr}", "answer": json.dumps(cases),
                    "solution": f"{THINK_OPEN}\n{THINK_CLOSE}\n{program(names, expr)}", "task": "code",
                    "difficulty": digits}
        return f"code: {expr}", build

    return distinct_rows(n, split, split_of, draw, f"task=code difficulty={digits} operands={operands}")
