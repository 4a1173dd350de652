"""The wheels ``launch/gpu_check.sh`` carries to the lent GPU machine, which has no package registry.

    python -m vcppo.bench.gpu_carry list  DIR [--json PATH]   the carry list, sizes where DIR holds the wheels
    python -m vcppo.bench.gpu_carry build DIR                 download / build the wheels into DIR/part<i> (here)
    python -m vcppo.bench.gpu_carry install DIR SITE          on the GPU machine: install the carried wheels
                                                              (any DIR/part<i> there) whose module does not
                                                              import there into SITE

The machine (shared/gpu/README.md): Python 3.12, torch + CUDA, transformers, peft, accelerate,
safetensors, tokenizers, triton, numpy, psutil, msgpack, ninja and their dependencies. A call to
it takes 64 MiB of files in all, the working tree included. What `vcppo train`, `vcppo plan` and
`vcppo bench step --trl` import beyond that image is :data:`CARRIED`, at the versions installed
here (the ones the CPU suite tests). pyarrow's wheel alone is ~55 MB, so the list is cut into
parts of at most :data:`PART_BYTES` (DIR/part1, DIR/part2, ...), one carried per call, each
installed into the same SITE (a warm machine keeps it between calls); ``install`` skips a wheel
whose module the machine already imports.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

PYTHON = "3.12"  # the lent machine's
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
CALL_BYTES = 64 * 2 ** 20   # what one call to the machine carries, working tree included
PART_BYTES = 56 * 2 ** 20   # the wheels of one call: the rest is the tree's (~3 MiB) and a margin

# (distribution, module that imports it): beyond the image, what the check's commands import.
CARRIED = (
    ("deepspeed", "deepspeed"), ("hjson", "hjson"), ("py-cpuinfo", "cpuinfo"),
    ("pydantic", "pydantic"), ("pydantic_core", "pydantic_core"), ("annotated-types", "annotated_types"),
    ("typing-inspection", "typing_inspection"),
    ("omegaconf", "omegaconf"), ("antlr4-python3-runtime", "antlr4"),
    ("datasets", "datasets"), ("pyarrow", "pyarrow"), ("pandas", "pandas"), ("python-dateutil", "dateutil"),
    ("tzdata", "tzdata"), ("multiprocess", "multiprocess"), ("dill", "dill"), ("xxhash", "xxhash"),
    ("fsspec", "fsspec"),
    ("math-verify", "math_verify"), ("latex2sympy2_extended", "latex2sympy2_extended"),
    ("trl", "trl"),
)
PINNED = {"trl": "1.12.0"}  # the `trl` extra's pin (PPOTrainer exists up to 1.12.0), installed here or not


@dataclass
class Wheel:
    name: str
    module: str
    version: str
    file: str | None = None   # its file in DIR, once built
    bytes: int | None = None


def version_here(name: str) -> str:
    if name in PINNED:
        return PINNED[name]
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        raise SystemExit(f"gpu_carry: {name} is not installed here, so its version is unknown "
                         "(make install installs it)") from None


def _norm(name: str) -> str:
    return name.lower().replace("-", "_")


def carry_list(directory: str | os.PathLike) -> list[Wheel]:
    """Every carried wheel with its version; file and size where ``directory`` holds it."""
    files = {}
    if Path(directory).is_dir():
        for f in Path(directory).glob("**/*.whl"):
            name, version = f.name.split("-")[:2]
            files[(_norm(name), version)] = f
    out = []
    for name, module in CARRIED:
        w = Wheel(name, module, version_here(name))
        f = files.get((_norm(name), w.version))
        if f is not None:
            w.file, w.bytes = str(f.relative_to(directory)), f.stat().st_size
        out.append(w)
    return out


def parts(wheels: list[Wheel], limit: int = PART_BYTES) -> list[list[str]]:
    """Wheel files in parts of at most ``limit`` bytes each (largest first, first part that fits);
    a wheel over the limit is a part of its own (it cannot be carried: :func:`summary` says so)."""
    out: list[tuple[int, list[str]]] = []
    for w in sorted((w for w in wheels if w.bytes is not None), key=lambda w: -w.bytes):
        for i, (size, names) in enumerate(out):
            if size + w.bytes <= limit:
                out[i] = (size + w.bytes, names + [w.file])
                break
        else:
            out.append((w.bytes, [w.file]))
    return [names for _, names in out]


def summary(directory: str | os.PathLike) -> dict:
    wheels = carry_list(directory)
    known = [w.bytes for w in wheels if w.bytes is not None]
    return {"python": PYTHON, "call_limit_bytes": CALL_BYTES, "part_limit_bytes": PART_BYTES,
            "wheels": [asdict(w) for w in wheels], "missing": [w.name for w in wheels if w.file is None],
            "total_bytes": sum(known), "parts": parts(wheels),
            "fits_one_call": not any(w.file is None for w in wheels) and sum(known) <= PART_BYTES}


def build(directory: str) -> dict:
    """Download the platform wheels for the machine's Python; build DeepSpeed as a pure-Python wheel
    (no op compiled: the engines use torch's AdamW); lay them out in parts, one per call."""
    staging = Path(directory) / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    for w in carry_list(directory):
        if w.file is not None:
            continue
        if w.name == "deepspeed":
            env = dict(os.environ, DS_BUILD_OPS="0", DS_ACCELERATOR="cuda")
            cmd = [sys.executable, "-m", "pip", "wheel", f"deepspeed=={w.version}", "--no-deps",
                   "--no-build-isolation", "-w", str(staging)]
        else:
            env = None
            cmd = [sys.executable, "-m", "pip", "download", f"{w.name}=={w.version}", "--no-deps", "-d", str(staging),
                   "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
                   *[a for p in PLATFORMS for a in ("--platform", p)]]
        subprocess.run(cmd, check=True, env=env)
    for i, files in enumerate(parts(carry_list(directory)), 1):
        (Path(directory) / f"part{i}").mkdir(exist_ok=True)
        for f in files:
            if Path(f).parent.name != f"part{i}":
                os.replace(Path(directory) / f, Path(directory) / f"part{i}" / Path(f).name)
    return summary(directory)


# Prints the JSON list of the modules (argv) that do not import, trying each in one process.
PROBE = """
import importlib, json, sys
bad = []
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
    except Exception:
        bad.append(m)
print(json.dumps(bad))
"""


def install(directory: str, site: str) -> dict:
    """pip-install (no index, no dependencies) each carried wheel in ``directory`` whose module
    does not import here into ``site``; returns what was installed and what the machine had."""
    wheels = carry_list(directory)
    broken = set(json.loads(subprocess.run([sys.executable, "-c", PROBE, *[w.module for w in wheels]],
                                           capture_output=True, text=True, check=True).stdout))
    have, installed = [], []
    for w in wheels:
        if w.module not in broken:
            have.append(w.name)
        elif w.file is not None:
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                            "--target", site, str(Path(directory) / w.file)], check=True)
            installed.append(w.name)
    return {"installed": installed, "already_there": have}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vcppo.bench.gpu_carry", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("list", "build", "install"))
    ap.add_argument("paths", nargs="+", help="DIR (install: DIR SITE)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.action == "install":
        if len(args.paths) != 2:
            ap.error("install needs DIR and SITE")
        res = install(*args.paths)
    else:
        res = build(args.paths[0]) if args.action == "build" else summary(args.paths[0])
    text = json.dumps(res, indent=1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
