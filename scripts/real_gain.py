"""What a real model's rise under RL is made of: answer format, or the answer itself.

Reads the greedy responses `vcppo eval ... eval.samples_jsonl=FILE` wrote (`make demo-real` writes them
beside its figures: runs/demo-real/{test,heldout}_{base,rl}.samples.jsonl) and prints, per file:

- correct: the last number is the answer (what the reward scores);
- answer anywhere: some number in the response is the answer (the model computed it, wherever it
  put it). correct - anywhere <= 0; the gap is the format part of the error: the right number written
  but not last (a check, a restated question, a trailing remark);
- the median length in tokens, and how many responses end on their last number (a terse answer).

    python scripts/real_gain.py runs/demo-real                # the four files of a demo-real run
    python scripts/real_gain.py A.samples.jsonl B.samples.jsonl

A rise in "answer anywhere" is the model computing sums it got wrong before; a rise in "correct" with
"answer anywhere" flat is the model learning where to put the number.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_SPECIAL = re.compile(r"(<\|[^|<>]*\|>\s*)+$")  # a chat template's end token the sampler kept (<|im_end|>)


def _numbers(text: str) -> list[float]:
    out = []
    for tok in _NUMBER.findall(text):
        try:
            out.append(float(tok.replace(",", "")))
        except ValueError:
            pass
    return out


def summarise(records: list[dict], answers: list[str] | None = None) -> dict:
    """The figures of one file's records ({response, correct, length}; the answer is taken from the
    record's ``answer`` when present, else ``answers``)."""
    n = len(records)
    anywhere = ends = 0
    for i, r in enumerate(records):
        truth = r.get("answer", answers[i] if answers else None)
        nums = _numbers(r["response"])
        if truth is not None and float(str(truth).replace(",", "")) in nums:
            anywhere += 1
        tail = _SPECIAL.sub("", r["response"].rstrip()).rstrip().rstrip(".").rstrip()
        ends += bool(re.search(r"\d$", tail))
    return {"n": n, "correct": sum(bool(r["correct"]) for r in records) / n, "answer_anywhere": anywhere / n,
            "median_length": statistics.median(r["length"] for r in records), "ends_on_number": ends / n}


def _files(args: list[str]) -> list[Path]:
    if len(args) == 1 and Path(args[0]).is_dir():
        return sorted(Path(args[0]).glob("*.samples.jsonl"))
    return [Path(a) for a in args]


def main(argv: list[str]) -> int:
    files = _files(argv)
    if not files:
        raise SystemExit("real_gain: no *.samples.jsonl files given (vcppo eval ... eval.samples_jsonl=FILE)")
    print("| file | n | correct (last number) | answer anywhere | format gap | median length | ends on a number |")
    print("|---|---|---|---|---|---|---|")
    for path in files:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        s = summarise(records)
        print(f"| {path.name.replace('.samples.jsonl', '')} | {s['n']} | {s['correct']:.3f} | "
              f"{s['answer_anywhere']:.3f} | {s['answer_anywhere'] - s['correct']:.3f} | {s['median_length']:.0f} | "
              f"{s['ends_on_number']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
