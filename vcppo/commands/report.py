"""`vcppo report RUN_DIR [RUN_DIR ...]`: a markdown page with PNG plots of one or more runs
(:func:`vcppo.report.make_report`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from vcppo.report import make_report


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="vcppo report", description="markdown + PNG report of one or more run directories")
    p.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
    p.add_argument("--out", help="output dir (default: <run>/report for one run, ./report otherwise)")
    p.add_argument("--title", default="vcppo report")
    args = p.parse_args(argv)
    dirs = [Path(r) for r in args.runs]
    for d in dirs:
        if not (d / "metrics.jsonl").exists():
            print(f"vcppo report: {d} has no metrics.jsonl")
            return 2
    out = Path(args.out) if args.out else (dirs[0] / "report" if len(dirs) == 1 else Path("report"))
    page = make_report(dirs, out, args.title)
    print(f"wrote {page}")
    return 0
