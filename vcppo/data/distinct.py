"""Drawing the rows of one split: distinct prompts, each in the split its key hashes to."""
from __future__ import annotations

from typing import Callable


def distinct_rows(n: int, split: str, split_of: Callable[[str], str],
                  draw: Callable[[], tuple[str, Callable[[], dict]]], what: str) -> list[dict]:
    """``n`` rows of ``split``: ``draw()`` gives a candidate's key (its prompt, or what the prompt says)
    and a function that builds its row, called only for a key that is new and hashes to ``split``
    (so a row's own random draws happen only for the rows kept). ValueError (naming ``what``) when
    the split's key space is too small for ``n``."""
    rows: list[dict] = []
    seen: set[str] = set()
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 200 * n + 10_000:
            raise ValueError(f"could only find {len(rows)} distinct {split} prompts for {what}; "
                             f"lower n or raise difficulty")
        key, build = draw()
        if key in seen or split_of(key) != split:
            continue
        seen.add(key)
        rows.append(build())
    return rows
