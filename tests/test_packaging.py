"""The built wheel is self-contained: presets and sweeps ship inside the package.

Builds the wheel from a copy of the package sources (a copy, so a stale in-tree ``build/`` cannot
put files into the wheel that ``package_data`` no longer ships), installs it into a fresh venv
without network, and from a working directory outside the repository loads every shipped preset
and expands every shipped sweep there. The fresh venv sees the already-installed dependencies
through a ``.pth`` line naming this interpreter's site-packages; a path added that way does not
get its own ``.pth`` files processed, so the editable install of vcppo there cannot shadow the
wheel (checked: ``vcppo.__file__`` lies inside the fresh venv).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What the wheel is built from: the package and the packaging files (whichever exist).
PACKAGING_FILES = ["setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md"]

# Runs inside the fresh venv (python -I: no PYTHONPATH, no user site, no cwd on sys.path).
CHECK = r"""
import contextlib, io, json, sys
from pathlib import Path

expected, venv, repo = json.loads(sys.argv[1]), Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve()
import vcppo
where = Path(vcppo.__file__).resolve()
assert venv in where.parents and repo not in where.parents, f"vcppo imported from {where}, not the wheel"

from vcppo import sweep
from vcppo.config import load as config
from vcppo.commands import sweep as sweep_command
assert venv in config.CONFIG_DIR.resolve().parents, config.CONFIG_DIR
presets = sorted(p.stem for p in config.CONFIG_DIR.glob("*.yaml"))
assert presets == expected["presets"], f"presets in the wheel: {presets}, in the repo: {expected['presets']}"
for name in presets:
    config.load_config(name)

sweeps = sweep.shipped_sweeps()
assert sweeps == expected["sweeps"], f"sweeps in the wheel: {sweeps}, in the repo: {expected['sweeps']}"
n_runs = {}
for name in sweeps:
    path, spec = sweep.load_sweep(name)
    assert venv in path.resolve().parents, path
    runs = sweep.expand(spec)  # validates every run's config
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = sweep_command.main([name, "--dry-run"])  # what `vcppo sweep NAME --dry-run` does
    assert rc == 0 and len(out.getvalue().splitlines()) == len(runs) > 0, (name, rc, out.getvalue())
    n_runs[name] = len(runs)
print(json.dumps({"vcppo": str(where), "presets": presets, "runs": n_runs}))
"""


def shipped_in_repo() -> dict:
    configs = REPO / "vcppo" / "configs"
    return {"presets": sorted(p.stem for p in configs.glob("*.yaml")),
            "sweeps": sorted(p.stem for p in (configs / "sweeps").glob("*.yaml"))}


def copy_sources(dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in PACKAGING_FILES:
        if (REPO / name).exists():
            shutil.copy2(REPO / name, dst / name)
    shutil.copytree(REPO / "vcppo", dst / "vcppo", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    return dict(env, PYTHONNOUSERSITE="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")


def run(cmd: list, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=clean_env(), capture_output=True, text=True,
                         timeout=timeout)
    shown = " ".join(str(c) if len(str(c)) < 200 else "<...>" for c in cmd)  # not the CHECK script
    assert res.returncode == 0, f"{shown} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def build_wheel(src: Path, out: Path) -> Path:
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", out, src], cwd=out.parent)
    wheels = sorted(out.glob("vcppo-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def make_venv(venv: Path, wheel: Path) -> Path:
    """A fresh venv with the wheel installed (pip of this interpreter, offline) and this
    interpreter's site-packages visible after its own. Returns the venv's python."""
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv.parent)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel],
        cwd=venv.parent)
    site = Path(run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=venv.parent).stdout.strip())
    paths = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_vcppo_test_deps.pth").write_text("".join(f"{p}\n" for p in paths))
    return python


def check_installed(python: Path, venv: Path, workdir: Path) -> dict:
    res = run([python, "-I", "-c", CHECK, json.dumps(shipped_in_repo()), venv, REPO], cwd=workdir)
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_wheel_ships_presets_and_sweeps(tmp_path):
    expected = shipped_in_repo()
    assert "vcppo" in expected["presets"] and "ablation" in expected["sweeps"], expected
    wheel = build_wheel(copy_sources(tmp_path / "src"), tmp_path / "wheels")
    venv = tmp_path / "venv"
    python = make_venv(venv, wheel)
    workdir = tmp_path / "work"  # outside the repository
    workdir.mkdir()
    assert REPO not in workdir.resolve().parents
    summary = check_installed(python, venv, workdir)
    assert summary["presets"] == expected["presets"]
    assert set(summary["runs"]) == set(expected["sweeps"])
    # The console script of the wheel: a shipped sweep by bare name.
    res = run([venv / "bin" / "vcppo", "sweep", "ablation", "--dry-run"], cwd=workdir)
    assert len(res.stdout.strip().splitlines()) == summary["runs"]["ablation"]
    assert not any(workdir.iterdir())  # dry runs write nothing
