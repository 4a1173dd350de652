"""`vcppo sweep SWEEP [KEY=VALUE ...]`: expand a sweep file into runs, run them one at a time (a finished
run is skipped), and collect a table (:mod:`vcppo.sweep`)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from vcppo.errors import ConfigError
from vcppo.sandbox.lifeline import run_command_tied, run_tied, warm_up
from vcppo.sweep import collect, expand, launch_command, load_sweep, shipped_sweeps, with_overrides


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="vcppo sweep", description="expand a sweep file into runs, run them, collect a table")
    p.add_argument("sweep", help="sweep YAML path, or the name of a shipped sweep "
                                 f"({', '.join(shipped_sweeps())})")
    p.add_argument("set", nargs="*", metavar="KEY=VALUE", help="a top-level sweep key, grid.KEY (one grid axis), "
                                                              "or a config override for every run")
    p.add_argument("--dry-run", action="store_true", help="print the launch commands, run nothing")
    p.add_argument("--collect-only", action="store_true", help="only (re)build the results table")
    p.add_argument("--launcher", help="override the sweep file's launcher")
    p.add_argument("--keep-going", action="store_true", help="continue with the next run when one fails")
    args = p.parse_intermixed_args(argv)
    try:
        path, sweep = load_sweep(args.sweep)
        sweep = with_overrides(sweep, args.set)
    except ConfigError as e:
        print(f"vcppo sweep: {e}", file=sys.stderr)
        return 2
    try:
        runs = expand(sweep)
    except ConfigError as e:
        print(f"vcppo sweep: {path}: {e}", file=sys.stderr)
        return 2
    default = f"{shlex.quote(sys.executable)} -m vcppo.cli"
    launcher = args.launcher or sweep.get("launcher") or default
    out_root = Path(sweep.get("output_root", f"runs/{sweep.get('name', 'sweep')}"))
    pending = [r for r in runs if not (Path(r["run_dir"]) / "final_metrics.json").exists()]
    if launcher == default and len(pending) > 1 and not (args.dry_run or args.collect_only):
        warm_up()  # several runs ahead, each a fork of this process: import once here
    failed = []
    for i, r in enumerate(runs, 1):
        cmd = launch_command(r, launcher)
        if args.dry_run:
            print(shlex.join(cmd))
            continue
        if args.collect_only:
            continue
        if (Path(r["run_dir"]) / "final_metrics.json").exists():
            print(f"[sweep {i}/{len(runs)}] {r['name']}: finished, skipped", flush=True)
            continue
        print(f"[sweep {i}/{len(runs)}] {r['name']}: {shlex.join(cmd)}", flush=True)
        # the run dies with the sweep, however the sweep ends
        rc = run_command_tied(launch_command(r, "")) if launcher == default else run_tied(cmd)
        if rc != 0:
            failed.append(r["name"])
            print(f"[sweep] {r['name']} failed with exit code {rc}", file=sys.stderr)
            if not args.keep_going:
                break
    if args.dry_run:
        return 0
    md, csv_path, rows = collect(runs, out_root)
    print(f"[sweep] {sum(r['finished'] for r in rows)}/{len(rows)} runs finished; table: {md} and {csv_path}")
    return 1 if failed else 0
