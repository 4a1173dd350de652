"""Prompt loading (Hugging Face ``datasets``) and a resumable prompt stream for the driver.

``load_prompts`` reads parquet / jsonl / json / a ``save_to_disk`` directory, renames the prompt
and answer fields to ``prompt`` / ``answer``, tokenises each prompt (through the tokenizer's chat
template when it has one), drops prompts longer than ``max_prompt_tokens`` (counted, logged and
returned) and shuffles deterministically. ``PromptStream`` hands out batches in a per-epoch order
that depends only on (seed, epoch), and can be checkpointed with ``state_dict``.
"""
from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from vcppo.data.checks import all_too_long, check_rows, check_source
from vcppo.errors import DataError
from vcppo.data.fields import reward_info_fields, use_column
from vcppo.rewards.routing import GroundTruth

logger = logging.getLogger(__name__)


def _read_table(path: str, split: str | None = None):
    import datasets

    if not os.path.exists(path):
        raise FileNotFoundError(f"prompt data not found: {path}")
    if os.path.isdir(path):
        try:
            ds = datasets.load_from_disk(path)
        except Exception as e:  # a saved zero-row Dataset has no data files: an IndexError inside datasets
            raise DataError(f"cannot read {path} (a save_to_disk directory with zero rows, or damaged): "
                            f"{type(e).__name__}: {str(e)[:300]}") from e
        if isinstance(ds, datasets.DatasetDict):
            if split is None:
                if len(ds) != 1:
                    raise ValueError(f"{path} holds splits {list(ds)}; pass split=")
                split = next(iter(ds))
            if split not in ds:
                raise ValueError(f"split {split!r} not in {path} (available: {list(ds)})")
            ds = ds[split]
        return ds
    ext = path.lower()
    if not ext.endswith((".parquet", ".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        raise ValueError(f"unsupported prompt file {path!r}: expected .parquet, .jsonl/.json or a "
                         "save_to_disk directory")
    check_source(path)
    try:
        if ext.endswith(".parquet"):
            return datasets.Dataset.from_parquet(path, keep_in_memory=True)
        return datasets.Dataset.from_json(path, keep_in_memory=True)
    except Exception as e:  # datasets wraps the cause (e.g. mixed types in a column) in a generic error
        cache = unwritable_cache(e, datasets.config.HF_DATASETS_CACHE)
        if cache is not None:
            raise DataError(f"cannot read {path}: the datasets cache {cache} is not writable, and `datasets` keeps "
                            "its lock and cache files there even for a local file (HF_HOME read-only, as a shared "
                            "model cache often is?): set HF_DATASETS_CACHE to a writable directory") from None
        cause = e.__cause__ or e.__context__ or e
        raise DataError(f"cannot read {path}: {type(cause).__name__}: {str(cause)[:500]}") from e


def unwritable_cache(error: BaseException, cache: str | os.PathLike) -> str | None:
    """``cache`` when ``error`` (or its cause) is a write refused inside it (read-only, no permission)."""
    cache = os.path.realpath(cache)
    while error is not None:
        name = getattr(error, "filename", None)
        if isinstance(error, OSError) and error.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and name \
                and os.path.realpath(name).startswith(cache):
            return cache
        error = error.__cause__ or error.__context__
    return None


def format_prompt(tokenizer, prompt: str | list[dict], use_chat_template: bool | str = "auto") -> str:
    """The text the policy sees: the chat template with a generation prompt, or the raw prompt.

    ``prompt`` is text (one user turn) or a list of chat messages (``{"role", "content"}``, verl's
    format), which always needs the chat template: with ``use_chat_template=False`` or a tokenizer
    without one it is a ValueError (joining the messages some other way would show the policy a
    format it was never trained on). ``use_chat_template="auto"`` uses the template iff the
    tokenizer has one. Anything else (a number, a dict) is a TypeError, never its ``str()``.
    """
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template == "auto":
        use_chat_template = has_template
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
        if not use_chat_template:
            raise ValueError("the prompt is a list of chat messages, which needs the tokenizer's chat template: "
                             "set data.use_chat_template to auto or true (and use a tokenizer that has one)")
    else:
        raise TypeError(f"a prompt must be text or a list of chat messages, got {type(prompt).__name__}")
    if not use_chat_template:
        return prompt
    if not has_template:
        raise ValueError("use_chat_template=True but the tokenizer has no chat template")
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def encode_prompt(tokenizer, prompt: str | list[dict], use_chat_template: bool | str = "auto") -> list[int]:
    """Token ids of ``format_prompt(...)`` (no extra special tokens: the template has them)."""
    return list(tokenizer.encode(format_prompt(tokenizer, prompt, use_chat_template),
                                 add_special_tokens=False))


@dataclass
class PromptSet:
    """Loaded prompts. ``dataset`` columns: ``prompt`` (text or chat messages), ``prompt_ids``
    (list[int]), ``answer`` (str) and every other column of the source (e.g. ``solution``).

    Rows handed out (``rows()``, ``stream()``, ``[i]``) hold the answer as a
    :class:`~vcppo.rewards.routing.GroundTruth` carrying the row's ``reward_info_fields``."""

    dataset: Any  # datasets.Dataset
    num_total: int
    num_dropped: int
    use_chat_template: bool
    path: str
    reward_info_fields: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        return with_reward_info(self.dataset[i], self.reward_info_fields)

    def rows(self) -> list[dict]:
        """Every row as a dict (validation and evaluation walk small sets in order)."""
        return [self[i] for i in range(len(self.dataset))]

    def stream(self, seed: int = 0, shuffle: bool = True) -> "PromptStream":
        return PromptStream(self.dataset, seed=seed, shuffle=shuffle, reward_info_fields=self.reward_info_fields)


def with_reward_info(row: dict, fields: tuple[str, ...]) -> dict:
    """``row`` with its answer as a GroundTruth holding ``fields`` (what the reward function gets)."""
    if row.get("answer") is not None:
        row["answer"] = GroundTruth(row["answer"], {f: row.get(f) for f in fields})
    return row


def _select_fields(ds, path: str, prompt_field: str, answer_field: str):
    """``ds`` with the prompt and the answer (a column or a dotted path) as ``prompt`` / ``answer``."""
    ds = use_column(ds, prompt_field, "prompt", "prompt_field", path)
    ds = use_column(ds, answer_field, "answer", "answer_field", path)
    check_rows(ds, path, prompt_field, answer_field)
    from datasets import Value

    if ds.features["answer"] != Value("string"):
        ds = ds.cast_column("answer", Value("string"))  # integers, floats -> their text
    return ds


def _length_filter(ds, max_prompt_tokens: int | None, path: str):
    """(kept rows, number dropped) by prompt length; an error when none is left."""
    if max_prompt_tokens is None:
        return ds, 0
    kept = ds.filter(lambda ids: len(ids) <= max_prompt_tokens, input_columns="prompt_ids",
                     keep_in_memory=True, load_from_cache_file=False)
    if len(kept) == 0:
        raise all_too_long(len(ds), min(map(len, ds["prompt_ids"])), max_prompt_tokens, path)
    if len(kept) < len(ds):
        logger.warning("dropped %d of %d prompts from %s longer than max_prompt_tokens=%d",
                       len(ds) - len(kept), len(ds), path, max_prompt_tokens)
    return kept, len(ds) - len(kept)


def load_prompts(path: str | os.PathLike, tokenizer, prompt_field: str = "prompt",
                 answer_field: str = "answer", max_prompt_tokens: int | None = 512,
                 use_chat_template: bool | str = "auto", shuffle_seed: int | None = 0,
                 split: str | None = None, limit: int | None = None,
                 reward_info: list[str] | None = None) -> PromptSet:
    """Load, tokenise, length-filter and shuffle prompts.

    path: ``.parquet``, ``.jsonl``/``.json`` or a ``Dataset.save_to_disk`` dir (``split`` picks
    one split of a saved ``DatasetDict``). The prompt field holds text or chat messages; the
    answer field may be a dotted path (``reward_model.ground_truth``); ``reward_info`` names the
    columns the reward function gets (default: ``data_source`` / ``extra_info`` where present) —
    see :mod:`vcppo.data.fields`. Missing file -> FileNotFoundError naming it; missing field ->
    DataError (a ValueError) naming it and the available columns; an empty file, undecodable
    bytes, a wrongly typed field, empty prompts, null answers or prompts that are all too long ->
    :class:`~vcppo.errors.DataError` naming the file and line / row / field (before any
    engine starts). ``max_prompt_tokens=None`` keeps all. ``shuffle_seed=None`` keeps file order.
    ``limit`` keeps the first N after shuffling.
    """
    path = os.fspath(path)
    ds = _select_fields(_read_table(path, split), path, prompt_field, answer_field)
    info_fields = reward_info_fields(list(ds.column_names), reward_info, path)
    if use_chat_template == "auto":
        use_chat_template = bool(getattr(tokenizer, "chat_template", None))
    use_chat_template = bool(use_chat_template)

    def _encode(batch, rows):
        ids = []
        for row, prompt in zip(rows, batch["prompt"]):
            try:
                ids.append(encode_prompt(tokenizer, prompt, use_chat_template))
            except (ValueError, TypeError) as e:  # one line naming file, row and field, not a map traceback
                raise DataError(f"{path}: row {row}, field '{prompt_field}': {e}") from None
        return {"prompt_ids": ids}

    ds = ds.map(_encode, batched=True, with_indices=True, keep_in_memory=True, load_from_cache_file=False)
    num_total = len(ds)
    ds, num_dropped = _length_filter(ds, max_prompt_tokens, path)
    if shuffle_seed is not None:
        ds = ds.shuffle(seed=shuffle_seed, keep_in_memory=True).flatten_indices(keep_in_memory=True)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    logger.info("loaded %d prompts from %s (chat template: %s)", len(ds), path, use_chat_template)
    return PromptSet(ds, num_total=num_total, num_dropped=num_dropped, use_chat_template=use_chat_template,
                     path=path, reward_info_fields=info_fields)


class PromptStream:
    """Endless batches over a dataset; epoch e visits every row once in the order
    ``permutation(seed + e)``. Resumable: ``state_dict()`` -> ``{"epoch", "index", "seed"}``."""

    def __init__(self, dataset, seed: int = 0, shuffle: bool = True, reward_info_fields: tuple[str, ...] = ()):
        if len(dataset) == 0:
            raise ValueError("cannot stream an empty prompt set (all prompts filtered out?)")
        self.dataset = dataset
        self.seed = int(seed)
        self.shuffle = shuffle
        self.reward_info_fields = tuple(reward_info_fields)
        self.epoch = 0
        self.index = 0
        self._order = self._make_order(0)

    def _make_order(self, epoch: int) -> np.ndarray:
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng(self.seed + epoch).permutation(n)

    def next_batch(self, n: int) -> list[dict]:
        """The next ``n`` rows (dicts); crosses into the next epoch (reshuffled) when needed."""
        out: list[int] = []
        while len(out) < n:
            if self.index >= len(self._order):
                self.epoch += 1
                self.index = 0
                self._order = self._make_order(self.epoch)
            take = min(n - len(out), len(self._order) - self.index)
            out.extend(int(i) for i in self._order[self.index:self.index + take])
            self.index += take
        rows = self.dataset.select(out)
        return [with_reward_info(rows[i], self.reward_info_fields) for i in range(len(rows))]

    def __iter__(self) -> Iterator[dict]:
        while True:
            yield self.next_batch(1)[0]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.seed = int(state.get("seed", self.seed))
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])
        self._order = self._make_order(self.epoch)
