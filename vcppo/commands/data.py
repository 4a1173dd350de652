"""`vcppo data ...`: make synthetic long-CoT task data and inspect it.

    vcppo data make --task add --out data/add            # DIR: train/val/test.parquet + stats.json
    vcppo data make --task add --out data/add --n 20000 --n-eval 500 --difficulty 7 --seed 0
    vcppo data make --task add --split val --out val.parquet --n 256   # one split, one file
    vcppo data make --task add --out data/add_verl --format verl   # verl's parquet format
    vcppo data stats FILE.parquet [--tokenizer DIR]      # trace length min/median/max
    vcppo data prepare gsm8k --in gsm8k/train.parquet --out data/gsm8k/train.parquet   # verl's format
    vcppo data prepare gsm8k --split test --out data/gsm8k/test.parquet   # from the Hugging Face cache

``prepare`` turns a standard math data set you downloaded (gsm8k, math, math500, dapo-math, aime;
parquet / jsonl / json / a save_to_disk directory) into verl-format parquet as verl's own
preprocessing writes it (:mod:`vcppo.data.prepare`).

With ``--split all`` (the default) ``--out`` is a directory; with one split it is a file
(``.parquet`` or ``.jsonl``). ``--n`` is the train size (or the size of the single split);
``--n-eval`` the size of val and test. ``--format verl`` writes verl's format (``prompt`` as chat
messages, ``reward_model.ground_truth``, ``data_source`` = ``vcppo/<task>``, ``extra_info``); train on
it with ``data.answer_field=reward_model.ground_truth``.
"""
from __future__ import annotations

import argparse
import json
import os


def _write(rows: list[dict], path: str) -> None:
    import pandas as pd

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    df = pd.DataFrame(rows)
    if path.endswith(".jsonl"):
        df.to_json(path, orient="records", lines=True, force_ascii=False)
    elif path.endswith(".parquet"):
        df.to_parquet(path, index=False)
    else:
        raise SystemExit(f"vcppo data: output file must end in .parquet or .jsonl: {path}")


def _formatted(rows: list[dict], fmt: str, task: str, split: str) -> list[dict]:
    from vcppo.data.fields import to_verl_rows

    return to_verl_rows(rows, f"vcppo/{task}", split) if fmt == "verl" else rows


def _read_rows(path: str) -> list[dict]:
    import pandas as pd

    if not os.path.exists(path):
        raise SystemExit(f"vcppo data: no such file: {path}")
    df = pd.read_json(path, lines=True) if path.endswith(".jsonl") else pd.read_parquet(path)
    return df.to_dict("records")


def _parser() -> argparse.ArgumentParser:
    from vcppo.data import tasks

    p = argparse.ArgumentParser(prog="vcppo data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="generate task data")
    mk.add_argument("--task", default="add", choices=tasks.TASKS)
    mk.add_argument("--out", required=True, help="directory (--split all) or .parquet/.jsonl file")
    mk.add_argument("--split", default="all", choices=("all",) + tasks.SPLITS)
    mk.add_argument("--n", type=int, default=None, help="rows (train, or the single split); default 20000 train / 500 eval")
    mk.add_argument("--n-eval", type=int, default=500, help="rows of val and test with --split all")
    mk.add_argument("--difficulty", type=int, default=None, help="digits per operand (add: exactly, default 7; chain: at most, default 4)")
    mk.add_argument("--operands", type=int, default=None, help="numbers to add (add: exactly, default 2; chain: at most, 2..K per prompt, default 12)")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--format", default="plain", choices=("plain", "verl"),
                    help="plain: prompt / answer / solution columns; verl: verl's parquet format")
    st = sub.add_parser("stats", help="trace length statistics of a data file")
    st.add_argument("path")
    st.add_argument("--tokenizer", default=None, help="count with this tokenizer (default: char-level)")
    pr = sub.add_parser("prepare", help="a standard math data set you downloaded -> verl-format parquet")
    pr.add_argument("dataset", metavar="{gsm8k,math,math500,dapo-math,aime}", help="the data set's upstream schema")
    pr.add_argument("--in", dest="source", metavar="PATH", default=None,
                    help="the downloaded data: .parquet / .jsonl / .json or a save_to_disk directory (default: "
                         "the data set's files in the Hugging Face cache, downloaded there when online)")
    pr.add_argument("--out", metavar="FILE.parquet", required=True, help="the verl-format file to write")
    pr.add_argument("--split", default=None, choices=("train", "test"),
                    help="extra_info.split, and the split read from a saved DatasetDict (default: train; "
                         "test for math500 and aime)")
    return p


def _prepare(args: argparse.Namespace) -> int:
    from vcppo.data.hub_sources import fetch, source_of
    from vcppo.data.prepare import default_split, prepare

    source = args.source
    if source is None:
        split = args.split or default_split(args.dataset)
        source = fetch(source_of(args.dataset, split), f"prepare {args.dataset}")
    n, sources = prepare(args.dataset, source, args.out, args.split)
    print(f"{args.dataset}: {n} rows -> {args.out}  data_source {', '.join(sources)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from vcppo.data import tasks

    args = _parser().parse_args(argv)
    if args.cmd == "prepare":
        return _prepare(args)
    if args.cmd == "stats":
        tok = None
        if args.tokenizer:
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(args.tokenizer)
        print(json.dumps(tasks.trace_length_stats(_read_rows(args.path), tok)))
        return 0

    if args.split == "all":
        if args.out.endswith((".parquet", ".jsonl")):
            raise SystemExit("vcppo data: --split all writes a directory; give --out DIR or pick --split")
        sizes = {"train": args.n or 20000, "val": args.n_eval, "test": args.n_eval}
        stats = {}
        for split, n in sizes.items():
            rows = tasks.generate(args.task, split, n, args.difficulty, args.seed, args.operands)
            path = os.path.join(args.out, f"{split}.parquet")
            _write(_formatted(rows, args.format, args.task, split), path)
            stats[split] = tasks.trace_length_stats(rows)
            print(f"{split}: {n} rows -> {path}  trace tokens {stats[split]}")
        spec = tasks.make_spec(args.task, args.difficulty, args.operands)
        meta = {"task": spec.name, "difficulty": spec.difficulty, "operands": spec.operands,
                "seed": args.seed, "trace_tokens": stats}
        with open(os.path.join(args.out, "stats.json"), "w") as f:
            json.dump(meta, f, indent=2)
    else:
        n = args.n or (20000 if args.split == "train" else 500)
        rows = tasks.generate(args.task, args.split, n, args.difficulty, args.seed, args.operands)
        _write(_formatted(rows, args.format, args.task, args.split), args.out)
        print(f"{args.split}: {n} rows -> {args.out}  trace tokens {tasks.trace_length_stats(rows)}")
    return 0
