"""Where a prompt row's fields sit in a file: chat-message prompts, dotted answer paths, and the
per-row fields handed to the reward function (verl's data format).

A verl-format row::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "Natalia sold ..."}],
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0}}

- A prompt is text or a list of chat messages (``{"role", "content"}``). Messages always go
  through the tokenizer's chat template; they are never turned into text with ``str()`` (that
  showed the policy ``[{'role': 'user', ...}]``).
- ``answer_field`` may be a dotted path into struct columns (``reward_model.ground_truth``).
- The reward-info fields (``data_source`` and ``extra_info`` when the file has them, or the columns
  named by ``data.reward_info_fields``) reach the reward function as keyword arguments.
"""
from __future__ import annotations

from vcppo.data.checks import is_chat_messages  # noqa: F401 (re-exported)
from vcppo.errors import DataError

DEFAULT_REWARD_INFO_FIELDS = ("data_source", "extra_info")
# keyword arguments the scorer itself passes to reward functions: a data field may not shadow them
RESERVED_REWARD_ARGUMENTS = ("finish_reason", "correct", "wrong")


def _struct_keys(feature) -> list[str] | None:
    return list(feature) if isinstance(feature, dict) else None


def nested_column(ds, dotted: str, key_name: str, path: str) -> list:
    """The values at ``dotted`` (``reward_model.ground_truth``), one per row; a missing column or
    sub-field, or a step into something that is not a struct, is a DataError naming it and the file."""
    top, *steps = dotted.split(".")
    if top not in ds.column_names:
        raise DataError(f"{key_name} {dotted!r}: {top!r} is not a column of {path}; available columns: "
                        f"{list(ds.column_names)}")
    feature, walked = ds.features[top], top
    for step in steps:
        keys = _struct_keys(feature)
        if keys is None:
            raise DataError(f"{key_name} {dotted!r}: {walked!r} in {path} holds {feature}, not a struct with "
                            f"a field {step!r}")
        if step not in keys:
            raise DataError(f"{key_name} {dotted!r}: {walked!r} in {path} has no field {step!r}; its fields: {keys}")
        feature, walked = feature[step], f"{walked}.{step}"
    values = ds[top]
    for step in steps:
        values = [None if v is None else v[step] for v in values]
    return list(values)


def use_column(ds, field: str, name: str, key_name: str, path: str):
    """``ds`` with the values at ``field`` (a column or a dotted path) as column ``name``; a column
    already called ``name`` is replaced (a verl file may hold a top-level ``answer`` as well)."""
    if "." not in field and field in ds.column_names:
        if field == name:
            return ds
        ds = ds.remove_columns(name) if name in ds.column_names else ds
        return ds.rename_column(field, name)
    values = nested_column(ds, field, key_name, path)
    ds = ds.remove_columns(name) if name in ds.column_names else ds
    return ds.add_column(name, values)


def reward_info_fields(columns: list[str], requested: list[str] | None, path: str) -> tuple[str, ...]:
    """The columns handed to the reward function: ``requested`` (each must exist), or by default
    those of :data:`DEFAULT_REWARD_INFO_FIELDS` the file has."""
    if requested is None:
        return tuple(f for f in DEFAULT_REWARD_INFO_FIELDS if f in columns)
    missing = [f for f in requested if f not in columns]
    if missing:
        raise DataError(f"data.reward_info_fields {missing} not columns of {path}; available columns: {columns}")
    reserved = [f for f in requested if f in RESERVED_REWARD_ARGUMENTS]
    if reserved:
        raise DataError(f"data.reward_info_fields: {reserved} would shadow arguments the scorer passes "
                        f"to reward functions ({list(RESERVED_REWARD_ARGUMENTS)}); rename the column(s)")
    return tuple(requested)


def to_verl_rows(rows: list[dict], data_source: str, split: str) -> list[dict]:
    """Task rows (``prompt``, ``answer``, ``solution``, ...) in verl's format: the prompt as one user
    message, the answer at ``reward_model.ground_truth``, ``data_source`` and ``extra_info``
    (split, index and the task's other fields). ``solution`` stays a top-level column, so
    ``vcppo sft`` and ``vcppo data stats`` read the same file."""
    out = []
    for index, row in enumerate(rows):
        extra = {k: v for k, v in row.items() if k not in ("prompt", "answer", "solution")}
        out.append({"data_source": data_source,
                    "prompt": [{"role": "user", "content": row["prompt"]}],
                    "ability": "code" if row.get("task") == "code" else "math",
                    "reward_model": {"style": "rule", "ground_truth": row["answer"]},
                    "extra_info": {"split": split, "index": index, **extra},
                    "solution": row["solution"]})
    return out
