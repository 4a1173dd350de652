"""Checks of prompt data that name the file, the line or row, and the field.

They run when the prompts are loaded, before any engine starts, so a bad file costs seconds, not
a vLLM + DeepSpeed start-up, and the message says where to look instead of a bare
``StopIteration`` or ``UnicodeDecodeError ... position 0``.

- ``check_source(path)``: before ``datasets`` reads the file. JSON / JSON-lines: every line is
  UTF-8 (else file, line and column named); JSON-lines: every non-blank line is a JSON object; not
  empty. Parquet: readable, at least one row.
- ``check_rows(ds, path, ...)``: after reading. The prompt field holds text or lists of chat
  messages (each with a text role and content); no prompt is null or blank; the answer field
  holds text or numbers; no answer is null (rows named, 1-based, in file order).
"""
from __future__ import annotations

import gzip
import json

from vcppo.errors import DataError

SHOW_ROWS = 5  # rows named in a message


def _open_binary(path: str):
    return gzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb")


def _check_json_lines(path: str, each_line_is_a_row: bool) -> None:
    rows = 0
    with _open_binary(path) as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}, line {number}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                                f"column {e.start + 1}); re-encode the file as UTF-8") from None
            if not line.strip():
                continue
            rows += 1
            if each_line_is_a_row:
                try:
                    row = json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}, line {number}: not valid JSON ({e.msg} at column {e.pos + 1})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}, line {number}: a JSON-lines row must be an object "
                                    f"{{\"field\": value, ...}}, got {type(row).__name__}")
    if rows == 0:
        raise DataError(f"{path} is empty: no rows")


def _check_parquet(path: str) -> None:
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception as e:  # ArrowInvalid and friends: not a parquet file
        raise DataError(f"{path} is not a readable parquet file: {e}") from None
    if rows == 0:
        raise DataError(f"{path} has zero rows")


def check_source(path: str) -> None:
    """The file-level checks of the module docstring (directories are checked after loading)."""
    lower = path.lower()
    if lower.endswith(".parquet"):
        _check_parquet(path)
    elif lower.endswith((".jsonl", ".jsonl.gz")):
        _check_json_lines(path, each_line_is_a_row=True)
    elif lower.endswith((".json", ".json.gz")):
        _check_json_lines(path, each_line_is_a_row=False)  # may be one JSON array over many lines


def _rows(indices: list[int]) -> str:
    shown = ", ".join(str(i + 1) for i in indices[:SHOW_ROWS])
    return f"row{'s' if len(indices) > 1 else ''} {shown}{', ...' if len(indices) > SHOW_ROWS else ''}"


def _is_text(feature) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def _is_scalar(feature) -> bool:
    dtype = getattr(feature, "dtype", "")
    return _is_text(feature) or dtype.startswith(("int", "uint", "float", "bool")) or dtype == "null"


def _first_of_type(values: list, allowed, feature) -> str:
    """Where a column's type goes wrong: the first row whose value is not ``allowed``."""
    for i, v in enumerate(values):
        if v is not None and (not isinstance(v, allowed) or isinstance(v, bool)):
            return f"row {i + 1} holds {type(v).__name__} {str(v)[:80]!r}"
    return f"the column's type is {feature}"


def is_chat_messages(feature) -> bool:
    item = getattr(feature, "feature", None)  # a list column of {"role", "content", ...} structs
    return isinstance(item, dict) and {"role", "content"} <= set(item)


def _check_messages(prompts: list, path: str, prompt_field: str) -> None:
    """Chat-message prompts: a non-empty list per row, every message with a text role and content."""
    empty = [i for i, p in enumerate(prompts) if not p]
    if empty:
        raise DataError(f"{path}: {len(empty)} empty or null message list(s) in prompt field '{prompt_field}' "
                        f"({_rows(empty)})")
    bad = [i for i, p in enumerate(prompts)
           if any(not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str) for m in p)]
    if bad:
        raise DataError(f"{path}: prompt field '{prompt_field}' holds chat messages, and in {_rows(bad)} "
                        "a message's 'role' or 'content' is null")


def check_rows(ds, path: str, prompt_field: str, answer_field: str) -> None:
    """The row-level checks of the module docstring, on the columns already renamed to
    ``prompt`` / ``answer`` (``prompt_field`` / ``answer_field`` are their names in the file)."""
    if len(ds) == 0:
        raise DataError(f"{path} has zero rows")
    prompt, answer = ds.features["prompt"], ds.features["answer"]
    if is_chat_messages(prompt):
        _check_messages(ds["prompt"], path, prompt_field)
    elif not _is_text(prompt):
        raise DataError(f"{path}: prompt field '{prompt_field}' must hold text or a list of chat messages "
                        f"({{\"role\", \"content\"}}), but {_first_of_type(ds['prompt'], str, prompt)}")
    if not _is_scalar(answer):
        raise DataError(f"{path}: answer field '{answer_field}' must hold text or numbers, but "
                        f"{_first_of_type(ds['answer'], (str, int, float), answer)}")
    blank = [i for i, p in enumerate(ds["prompt"]) if p is None or (isinstance(p, str) and not p.strip())]
    if blank:
        raise DataError(f"{path}: {len(blank)} empty or null prompt(s) in field '{prompt_field}' ({_rows(blank)})")
    missing = [i for i, a in enumerate(ds["answer"]) if a is None]
    if missing:
        raise DataError(f"{path}: {len(missing)} null answer(s) in field '{answer_field}' ({_rows(missing)}); "
                        "such rows would train silently with every sample scored wrong")


def all_too_long(num_total: int, shortest: int, max_prompt_tokens: int, path: str) -> DataError:
    """The error when the length filter dropped every prompt (reported before engines start)."""
    return DataError(f"all {num_total} prompts in {path} are longer than max_prompt_tokens={max_prompt_tokens} "
                     f"tokens (the shortest has {shortest}); raise data.max_prompt_tokens or shorten the prompts")
