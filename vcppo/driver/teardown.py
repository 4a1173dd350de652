"""Closing a run's parts so that the error a user sees is the run's own.

After an error every part is still closed, and a part that fails too (wandb writing into the run
directory that has just turned read-only) is named in one line, so the run's error stays the one
printed last; after a clean run the first failure is raised once every part has closed.
"""
from __future__ import annotations

import sys
from typing import Callable


def close_parts(parts: list[tuple[str, Callable[[], None]]], clean: bool) -> None:
    """Call each ``(name, close)`` in order, whatever the others do (see the module docstring)."""
    first_failure = None
    for name, close_part in parts:
        try:
            close_part()
        except Exception as e:  # noqa: BLE001 -- reported, and the other parts still close
            if clean:
                first_failure = first_failure or e
            else:
                print(f"[vcppo] while stopping after the error below, the {name} failed to close too: "
                      f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
    if first_failure is not None:
        raise first_failure
