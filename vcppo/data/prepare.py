"""`vcppo data prepare DATASET --in PATH --out FILE.parquet`: a standard math data set the user
downloaded, in its upstream schema, written as verl writes it (verl's ``data_source`` names, its
instruction suffixes, its ground-truth extraction), so verl and vcppo train on the same rows.

PATH is a parquet / jsonl / json file or a ``datasets`` ``save_to_disk`` directory (``--split``
picks a split of a saved ``DatasetDict``; one that holds a single split is read whatever its name).

- ``gsm8k`` (``question``, ``answer`` ending in ``#### 72``): ``openai/gsm8k``; the question plus
  verl's "####" instruction; ground truth the first ``#### N``, commas dropped; ``extra_info`` also
  keeps the raw question and answer.
- ``math`` (``problem``, ``solution``; ``level``, ``type`` kept): ``DigitalLearningGmbH/MATH-lighteval``;
  the problem plus verl's ``\\boxed{}`` instruction; ground truth the solution's last box.
- ``math500`` (``problem``, ``solution``, ``answer``; ``subject``, ``level``, ``unique_id`` kept):
  ``HuggingFaceH4/MATH-500``; as ``math``, ground truth the ``answer`` column.
- ``dapo-math`` (verl's format already: ``prompt`` messages, ``reward_model``): as it is
  (``math_dapo``), with ``extra_info.split`` added.
- ``aime`` (``Problem`` / ``problem``, ``Answer`` / ``answer``; ``ID`` and the rest kept, or a
  verl-format file, kept as it is): ``aime2024``; DAPO-Math-17k's ``Answer:`` prompt around the
  problem; ground truth the answer as text.

verl's scripts: ``examples/data_preprocess/gsm8k.py`` and ``math_dataset.py`` (instruction
suffixes, ``reward_model: {style: rule, ground_truth}``, ``extra_info: {split, index}``, the columns
they consume removed and the others kept, as ``datasets.map`` leaves them). verl has no script for
MATH-500 or AIME: MATH-500 follows ``math_dataset.py``; AIME gets the prompt of DAPO-Math-17k,
since verl scores ``aime*`` sources by their ``Answer:`` line (``verl/utils/reward_score/__init__.py``).
A MATH solution whose last box is ``\\fbox{}`` (verl's script stops there) gives its content.
Rows are 1-based in messages; a missing column, an unreadable file or a row without an answer is
a :class:`~vcppo.errors.DataError` naming the file and the field.
"""
from __future__ import annotations

import difflib
import os
from typing import Any, Callable

from vcppo.errors import DataError
from vcppo.rewards.verl_parity import gsm8k_final_number, last_box, unbox

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
DAPO_PROMPT = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
               "Remember to put your answer on its own line after \"Answer:\".")
VERL_COLUMNS = ("prompt", "reward_model")  # a file that has these is verl-shaped already


def _text(row: dict, column: str, index: int, path: str) -> str:
    value = row[column]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{path}: row {index + 1}, field {column!r}: expected text, got {value!r:.80}")
    return value


def _verl_row(data_source: str, content: str, truth: str, split: str, index: int, **extra: Any) -> dict:
    return {"data_source": data_source, "prompt": [{"role": "user", "content": content}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": index, **extra}}


def _gsm8k(row: dict, cols: dict, index: int, split: str, path: str) -> dict:
    question, answer = _text(row, cols["question"], index, path), _text(row, cols["answer"], index, path)
    truth = gsm8k_final_number(answer, last=False)
    if truth is None:
        raise DataError(f"{path}: row {index + 1}, field {cols['answer']!r}: no '#### <number>' final answer")
    return _verl_row("openai/gsm8k", f"{question} {GSM8K_INSTRUCTION}", truth, split, index,
                     answer=answer, question=question)


def solution_answer(solution: str) -> str | None:
    """The last box of a MATH solution, as verl's ``math_dataset.py`` extracts it; a final
    ``\\fbox{...}`` gives its content; None without a box."""
    box = last_box(solution)
    if box is None:
        return None
    answer = unbox(box)
    if answer is None and box.startswith("\\fbox{") and box.endswith("}"):
        answer = box[len("\\fbox{"):-1]
    return answer


def _math(row: dict, cols: dict, index: int, split: str, path: str) -> dict:
    problem, solution = _text(row, cols["problem"], index, path), _text(row, cols["solution"], index, path)
    truth = solution_answer(solution)
    if truth is None:
        raise DataError(f"{path}: row {index + 1}, field {cols['solution']!r}: no \\boxed{{...}} answer")
    return _verl_row("DigitalLearningGmbH/MATH-lighteval", f"{problem} {MATH_INSTRUCTION}", truth, split, index)


def _math500(row: dict, cols: dict, index: int, split: str, path: str) -> dict:
    problem, truth = _text(row, cols["problem"], index, path), _text(row, cols["answer"], index, path)
    return _verl_row("HuggingFaceH4/MATH-500", f"{problem} {MATH_INSTRUCTION}", truth, split, index)


def _aime(row: dict, cols: dict, index: int, split: str, path: str) -> dict:
    problem, truth = _text(row, cols["problem"], index, path), _text(row, cols["answer"], index, path)
    return _verl_row("aime2024", DAPO_PROMPT.format(problem=problem), truth.strip(), split, index)


def _already_verl(row: dict, cols: dict, index: int, split: str, path: str) -> dict:
    """A verl-format row as it is, with ``extra_info.split`` where it has none (and ``data_source``
    ``math_dapo`` where the file has none)."""
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if truth is None:
        raise DataError(f"{path}: row {index + 1}, field 'reward_model.ground_truth': missing")
    extra = dict(row.get("extra_info") or {})
    extra.setdefault("split", split)
    return {"data_source": row.get("data_source") or "math_dapo", "extra_info": extra}


# dataset: (build, the columns it reads {role: accepted names}, the columns it consumes, default split)
RECIPES: dict[str, tuple[Callable, dict[str, tuple[str, ...]], tuple[str, ...], str]] = {
    "gsm8k": (_gsm8k, {"question": ("question",), "answer": ("answer",)}, (), "train"),
    "math": (_math, {"problem": ("problem",), "solution": ("solution",)}, (), "train"),
    "math500": (_math500, {"problem": ("problem",), "answer": ("answer",)}, ("solution",), "test"),
    "dapo-math": (_already_verl, {"prompt": ("prompt",), "reward_model": ("reward_model",)}, (), "train"),
    "aime": (_aime, {"problem": ("Problem", "problem"), "answer": ("Answer", "answer")},
             ("Solution", "solution"), "test"),
}


def _columns(name: str, available: list[str], path: str) -> dict[str, str]:
    """{role: the file's column}; a role none of whose names is a column is a DataError."""
    found = {}
    for role, names in RECIPES[name][1].items():
        column = next((n for n in names if n in available), None)
        if column is None:
            raise DataError(f"{path}: no column {' / '.join(repr(n) for n in names)} ({name} reads "
                            f"{[ns[0] for ns in RECIPES[name][1].values()]}); its columns: {available}")
        found[role] = column
    return found


def _read(path: str, split: str):
    """The rows at ``path`` as a ``datasets.Dataset`` (module docstring); DataError when unreadable."""
    import datasets

    from vcppo.data.dataset import _read_table

    try:
        if not os.path.isdir(path):
            return _read_table(path)
        table = datasets.load_from_disk(path)
        if isinstance(table, datasets.DatasetDict):
            if split not in table and len(table) != 1:
                raise DataError(f"{path}: no split {split!r}; its splits: {list(table)} (pick one with --split)")
            table = table[split] if split in table else next(iter(table.values()))
        return table
    except FileNotFoundError:
        raise DataError(f"{path}: no such file or directory") from None
    except DataError:
        raise
    except Exception as e:  # an unsupported suffix, a damaged directory: one line naming the file
        first_line = (str(e).splitlines() or [""])[0][:300]
        raise DataError(f"cannot read {path}: {type(e).__name__}: {first_line}") from None


def check_dataset(name: str) -> None:
    """A DataError naming the data sets there are, when ``name`` is not one of them."""
    if name not in RECIPES:
        close = difflib.get_close_matches(name, list(RECIPES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DataError(f"prepare: unknown dataset {name!r}{hint}; one of {', '.join(RECIPES)}")


def default_split(name: str) -> str:
    """The split ``name`` is read as without ``--split`` (train; test for math500 and aime)."""
    check_dataset(name)
    return RECIPES[name][3]


def prepare(name: str, source: str | list[str], out: str, split: str | None = None,
            data_source: str | None = None) -> tuple[int, list[str]]:
    """Write ``source`` (data set ``name``'s upstream schema: a path, or the shards of one split) to
    ``out`` in verl's format; ``data_source`` replaces the recipe's (e.g. ``aime2025``).
    Returns (rows written, the data_sources written)."""
    import datasets

    check_dataset(name)
    if not out.endswith(".parquet"):
        raise DataError(f"prepare: --out must be a .parquet file: {out}")
    build, _, also_consumed, _ = RECIPES[name]
    split = split or default_split(name)
    paths = [source] if isinstance(source, str) else list(source)
    table = datasets.concatenate_datasets([_read(p, split) for p in paths]) if len(paths) > 1 else _read(paths[0], split)
    source = paths[0] if len(paths) == 1 else os.path.dirname(paths[0])
    if name == "aime" and all(c in table.column_names for c in VERL_COLUMNS):
        build, name = _already_verl, "dapo-math"  # e.g. the DAPO authors' AIME-2024: verl's format already
    cols = _columns(name, list(table.column_names), source)
    consumed = [] if build is _already_verl else [
        c for c in [*cols.values(), *also_consumed] if c in table.column_names]
    table = table.map(lambda row, index: build(row, cols, index, split, source), with_indices=True,
                      remove_columns=consumed, keep_in_memory=True, load_from_cache_file=False)
    if data_source is not None:
        table = table.map(lambda row: {"data_source": data_source}, keep_in_memory=True, load_from_cache_file=False)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    table.to_parquet(out)
    return len(table), sorted(set(table["data_source"]))
