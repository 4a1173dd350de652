"""The run directory's JSON-lines records (``metrics.jsonl``, ``config_history.jsonl``), read the way a
damaged checkpoint is: what cannot be read is named and skipped, never a traceback."""
from __future__ import annotations

import json
from pathlib import Path


def read_records(path: Path, say=None) -> list[dict]:
    """The JSON records of a ``.jsonl`` file, one per line. A line that is not one (a stray byte, a
    line cut by a kill) is named by ``say`` (one line each) and skipped; a file that cannot be read
    at all is named once and reads as no records."""
    path = Path(path)
    if not path.exists():
        return []
    say = say or (lambda message: None)
    try:
        data = path.read_bytes()
    except OSError as e:
        say(f"{path} cannot be read ({e.strerror or type(e).__name__}): read as empty")
        return []
    records = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError and json's errors alike
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            say(f"{path} line {number} is not a JSON record ({raw[:60]!r}...): skipped")
    return records
