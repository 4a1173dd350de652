"""A write that fails because the disk is full, said as such in one line.

torch's zip writer reports a full disk as ``unexpected pos N vs M`` or ``file write failed``, and a
plain write raises ``OSError: [Errno 28]``; neither names the directory or what it needed. The run's
writes that can meet a full disk (a checkpoint, the run directory's config) go through
:func:`write_error`, which names the directory, the bytes free there and, when known, the bytes needed.
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

from vcppo.errors import ConfigError

_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")  # torch's zip writer, short of space
LOW_SPACE = 64 * 2**20  # below this, a failed torch write is taken for a full disk


class DiskFull(ConfigError):
    """A write that failed for lack of space (the CLI prints it in one line and exits 2)."""


def free_bytes(path: Path) -> int | None:
    """Bytes free on the filesystem holding ``path`` (or its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def tree_bytes(path: Path) -> int | None:
    """Bytes of every file under ``path``; None when there is none."""
    path = Path(path)
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def out_of_space(error: BaseException, where: Path) -> bool:
    """Whether ``error`` (or what caused it) is a write that found no space left at ``where``."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _SPACE_ERRNOS:
            return True
        if isinstance(seen, RuntimeError) and any(t in str(seen) for t in _TORCH_WRITE_FAILED):
            free = free_bytes(where)
            return free is not None and free < LOW_SPACE
        seen = seen.__cause__ or seen.__context__
    return False


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def write_error(what: str, where: Path, error: BaseException, needed: int | None = None,
                after: str = "") -> DiskFull | None:
    """One line for ``what`` failing to be written into ``where`` for lack of space, or None when
    ``error`` is something else. ``needed``: the bytes it takes, when known; ``after``: what the
    user should know next."""
    if not out_of_space(error, where):
        return None
    need = f", about {_size(needed)} needed" if needed else ""
    return DiskFull(f"{what} could not be written to {where}: no space left on device ({_size(free_bytes(where))} "
                    f"free there{need}). Free some space, or set trainer.output_root to a larger disk{after}")
