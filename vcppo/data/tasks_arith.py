"""Tasks ``arith`` and ``arith_words``: arithmetic a pretrained instruct model answers in plain words,
for training a real model (SmolLM2-135M-Instruct) on a CPU.

``arith``: ``What is 23 + 45 - 12? Put the final answer after "####".``
``arith_words``: the same sums as a templated word problem (``Mia has 23 stickers. She buys 45
more. Then she gives away 12. How many stickers does Mia have now? Put ...``).

Knobs: ``difficulty`` = digits per number at most (each number's digit count drawn uniformly from
1..difficulty, 1..4: one-digit sums are what SmolLM2 gets mostly right, two-digit ones mostly wrong), ``operands``
= how many numbers (``operands - 1`` steps, each ``+`` or ``-``; a running total never goes below
zero). The prompt asks for GSM8K's answer format and the ``solution`` column is written in it
(one line per step, then ``#### N``), so ``vcppo sft`` could train on it; rows carry
``data_source`` ``vcppo/arith`` (or ``vcppo/arith_words``), which the reward
:func:`vcppo.rewards.last_number.last_number` scores by the last number of the response (an instruct
model writes ``The final answer after "####" is 32.``, which verl's strict gsm8k scorer gives 0).

Prompts are plain text: the trainer wraps them in the model's own chat template
(``data.use_chat_template``), system prompt included.
"""
from __future__ import annotations

import random
from typing import Callable

from vcppo.data.distinct import distinct_rows

INSTRUCTION = 'Put the final answer after "####".'
NAMES = ("Mia", "Leo", "Ana", "Sam", "Ivy", "Tom", "Zoe", "Max", "Eva", "Ben")
PRONOUN = {"Mia": "She", "Ana": "She", "Ivy": "She", "Zoe": "She", "Eva": "She"}
OBJECTS = ("stickers", "apples", "marbles", "coins", "books", "cards", "shells", "pencils")
GAINS = ("{p} buys {x} more.", "{p} finds {x} more.", "{p} gets {x} more from a friend.")
LOSSES = ("{p} gives away {x}.", "{p} loses {x}.", "{p} uses {x}.")


def sample_terms(rng: random.Random, digits: int, operands: int) -> list[tuple[str, int]]:
    """``[("+", a), (op, b), ...]``: ``operands`` numbers of 1..``digits`` digits (the count uniform), each
    later one added or subtracted, the running total staying >= 0."""
    terms, total = [], 0
    for i in range(operands):
        d = rng.randint(1, digits)
        x = rng.randint(0 if d == 1 else 10 ** (d - 1), 10 ** d - 1)
        op = "+" if i == 0 or x > total or rng.random() < 0.5 else "-"
        total += x if op == "+" else -x
        terms.append((op, x))
    return terms


def value(terms: list[tuple[str, int]]) -> int:
    return sum(x if op == "+" else -x for op, x in terms)


def expression(terms: list[tuple[str, int]]) -> str:
    return " ".join([str(terms[0][1])] + [f"{op} {x}" for op, x in terms[1:]])


def plain_prompt(terms: list[tuple[str, int]], rng: random.Random) -> str:
    return f"What is {expression(terms)}? {INSTRUCTION}"


def word_prompt(terms: list[tuple[str, int]], rng: random.Random) -> str:
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    pronoun = PRONOUN.get(name, "He")
    parts = [f"{name} has {terms[0][1]} {obj}."]
    for i, (op, x) in enumerate(terms[1:]):
        sentence = rng.choice(GAINS if op == "+" else LOSSES).format(p=pronoun, x=x)
        parts.append(sentence if i == 0 else "Then " + sentence[0].lower() + sentence[1:])
    parts.append(f"How many {obj} does {name} have now? {INSTRUCTION}")
    return " ".join(parts)


def solution(terms: list[tuple[str, int]]) -> str:
    """GSM8K's answer format: a line per step, then ``#### N``."""
    lines, total = [], terms[0][1]
    for op, x in terms[1:]:
        new = total + x if op == "+" else total - x
        lines.append(f"{total} {op} {x} = {new}")
        total = new
    return "\n".join(lines + [f"#### {total}"])


PROMPTS: dict[str, Callable] = {"arith": plain_prompt, "arith_words": word_prompt}


def generate_rows(task: str, split: str, n: int, digits: int, operands: int, seed: int,
                  split_of: Callable[[str], str]) -> list[dict]:
    """``n`` distinct rows of ``split`` (``prompt``, ``answer``, ``solution``, ``task``, ``difficulty``,
    ``operands``, ``data_source``); splits are disjoint by the expression's hash, so a word problem
    and its plain twin always fall in the same split."""
    if not 1 <= digits <= 4:
        raise ValueError(f"{task}: difficulty (digits per number) must be 1..4, not {digits}")
    if operands < 2:
        raise ValueError(f"{task}: operands must be >= 2, not {operands}")
    rng = random.Random(f"{task}|{digits}|{operands}|{split}|{seed}")

    def draw():
        terms = sample_terms(rng, digits, operands)
        return expression(terms), lambda: {
            "prompt": PROMPTS[task](terms, rng), "answer": str(value(terms)), "solution": solution(terms),
            "task": task, "difficulty": digits, "operands": operands, "data_source": f"vcppo/{task}"}

    return distinct_rows(n, split, split_of, draw, f"task={task} difficulty={digits} operands={operands}")
