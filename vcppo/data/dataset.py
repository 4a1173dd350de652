"""Prompt loading (Hugging Face ``datasets``) and a resumable prompt stream for the driver.

``load_prompts`` reads parquet / jsonl / json / a ``save_to_disk`` directory, renames the prompt
and answer fields to ``prompt`` / ``answer``, tokenises each prompt (through the tokenizer's chat
template when it has one), drops prompts longer than ``max_prompt_tokens`` (counted, logged and
returned) and shuffles deterministically. ``PromptStream`` hands out batches in a per-epoch order
that depends only on (seed, epoch), and can be checkpointed with ``state_dict``.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from vcppo.data.checks import DataError, all_too_long, check_rows, check_source

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
        cause = e.__cause__ or e.__context__ or e
        raise DataError(f"cannot read {path}: {type(cause).__name__}: {str(cause)[:500]}") from e


def format_prompt(tokenizer, prompt: str, use_chat_template: bool | str = "auto") -> str:
    """The text the policy sees: the chat template with a generation prompt, or the raw prompt.

    ``use_chat_template="auto"`` uses the template iff the tokenizer has one.
    """
    if use_chat_template == "auto":
        use_chat_template = bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True, tokenize=False)
    return prompt


def encode_prompt(tokenizer, prompt: str, use_chat_template: bool | str = "auto") -> list[int]:
    """Token ids of ``format_prompt(...)`` (no extra special tokens: the template has them)."""
    return list(tokenizer.encode(format_prompt(tokenizer, prompt, use_chat_template),
                                 add_special_tokens=False))


@dataclass
class PromptSet:
    """Loaded prompts. ``dataset`` columns: ``prompt`` (raw text), ``prompt_ids`` (list[int]),
    ``answer`` (str) and every other column of the source (e.g. ``solution``)."""

    dataset: Any  # datasets.Dataset
    num_total: int
    num_dropped: int
    use_chat_template: bool
    path: str

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[i]

    def rows(self) -> list[dict]:
        """Every row as a dict (validation and evaluation walk small sets in order)."""
        return [self.dataset[i] for i in range(len(self.dataset))]

    def stream(self, seed: int = 0, shuffle: bool = True) -> "PromptStream":
        return PromptStream(self.dataset, seed=seed, shuffle=shuffle)


def load_prompts(path: str | os.PathLike, tokenizer, prompt_field: str = "prompt",
                 answer_field: str = "answer", max_prompt_tokens: int | None = 512,
                 use_chat_template: bool | str = "auto", shuffle_seed: int | None = 0,
                 split: str | None = None, limit: int | None = None) -> PromptSet:
    """Load, tokenise, length-filter and shuffle prompts.

    path: ``.parquet``, ``.jsonl``/``.json`` or a ``Dataset.save_to_disk`` dir (``split`` picks
    one split of a saved ``DatasetDict``). Missing file -> FileNotFoundError naming it; missing
    field -> ValueError naming it and the available columns; an empty file, undecodable bytes, a
    wrongly typed field, empty prompts, null answers or prompts that are all too long ->
    :class:`~vcppo.data.checks.DataError` naming the file and line / row / field (before any
    engine starts). ``max_prompt_tokens=None`` keeps all. ``shuffle_seed=None`` keeps file order. ``limit`` keeps the first N after shuffling.
    """
    path = os.fspath(path)
    ds = _read_table(path, split)
    cols = list(ds.column_names)
    for name, fld in (("prompt_field", prompt_field), ("answer_field", answer_field)):
        if fld not in cols:
            raise ValueError(f"{name} {fld!r} is not a column of {path}; available columns: {cols}")
    if prompt_field != "prompt":
        if "prompt" in cols:
            ds = ds.remove_columns("prompt")
        ds = ds.rename_column(prompt_field, "prompt")
    if answer_field != "answer":
        if "answer" in ds.column_names:
            ds = ds.remove_columns("answer")
        ds = ds.rename_column(answer_field, "answer")
    check_rows(ds, path, prompt_field, answer_field)
    if use_chat_template == "auto":
        use_chat_template = bool(getattr(tokenizer, "chat_template", None))
    use_chat_template = bool(use_chat_template)

    from datasets import Value

    if ds.features["answer"] != Value("string"):
        ds = ds.cast_column("answer", Value("string"))  # integers, floats -> their text

    def _encode(batch):
        return {"prompt_ids": [encode_prompt(tokenizer, str(p), use_chat_template) for p in batch["prompt"]]}

    ds = ds.map(_encode, batched=True, keep_in_memory=True, load_from_cache_file=False)
    num_total, encoded = len(ds), ds
    if max_prompt_tokens is not None:
        ds = ds.filter(lambda ids: len(ids) <= max_prompt_tokens, input_columns="prompt_ids",
                       keep_in_memory=True, load_from_cache_file=False)
        if len(ds) == 0:
            raise all_too_long(num_total, min(map(len, encoded["prompt_ids"])), max_prompt_tokens, path)
    num_dropped = num_total - len(ds)
    if num_dropped:
        logger.warning("dropped %d of %d prompts from %s longer than max_prompt_tokens=%d",
                       num_dropped, num_total, path, max_prompt_tokens)
    if shuffle_seed is not None:
        ds = ds.shuffle(seed=shuffle_seed, keep_in_memory=True).flatten_indices(keep_in_memory=True)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    logger.info("loaded %d prompts from %s (chat template: %s)", len(ds), path, use_chat_template)
    return PromptSet(ds, num_total=num_total, num_dropped=num_dropped,
                     use_chat_template=use_chat_template, path=path)


class PromptStream:
    """Endless batches over a dataset; epoch e visits every row once in the order
    ``permutation(seed + e)``. Resumable: ``state_dict()`` -> ``{"epoch", "index", "seed"}``."""

    def __init__(self, dataset, seed: int = 0, shuffle: bool = True):
        if len(dataset) == 0:
            raise ValueError("cannot stream an empty prompt set (all prompts filtered out?)")
        self.dataset = dataset
        self.seed = int(seed)
        self.shuffle = shuffle
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
        return [rows[i] for i in range(len(rows))]

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
