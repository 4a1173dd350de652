"""Where the standard math data sets live on the Hugging Face Hub, and the evaluation benchmarks built
on them: ``vcppo data prepare DATASET`` without ``--in`` and ``vcppo eval --benchmark NAME`` read the
upstream files from the local Hugging Face cache (``HF_HOME``; downloaded there when online).

A source is a data set repository and the files of one split, as glob patterns tried in order (the
first that matches is the split). The files are read and written in verl's format by
:func:`vcppo.data.prepare.prepare`, so a benchmark gets the prompt format and ``data_source`` that
verl's preprocessing gives it, and the verl-parity scorer routes on that ``data_source``.
"""
from __future__ import annotations

import difflib
import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

from vcppo.errors import DataError


@dataclass(frozen=True)
class HubSource:
    """A split of a data set repository: ``repo_id`` and the file ``patterns`` (globs, the first that
    matches wins), relative to the repository's root."""

    repo_id: str
    patterns: tuple[str, ...]


# (prepare's data set name, split) -> where its upstream files are.
SOURCES: dict[tuple[str, str], HubSource] = {
    ("gsm8k", "train"): HubSource("openai/gsm8k", ("main/train-*.parquet",)),
    ("gsm8k", "test"): HubSource("openai/gsm8k", ("main/test-*.parquet",)),
    ("math", "train"): HubSource("DigitalLearningGmbH/MATH-lighteval", ("data/train-*.parquet",)),
    ("math", "test"): HubSource("DigitalLearningGmbH/MATH-lighteval", ("data/test-*.parquet",)),
    ("math500", "test"): HubSource("HuggingFaceH4/MATH-500", ("test.jsonl",)),
    ("dapo-math", "train"): HubSource("BytedTsinghua-SIA/DAPO-Math-17k", ("data/*.parquet",)),
    ("aime", "test"): HubSource("HuggingFaceH4/aime_2024", ("data/train-*.parquet", "*.parquet", "*.jsonl")),
}


@dataclass(frozen=True)
class Benchmark:
    """An evaluation set: the prepare ``recipe`` and ``split`` that read it, where it lives, and the
    ``data_source`` its rows carry (the scorer's route)."""

    name: str
    recipe: str
    split: str
    source: HubSource
    data_source: str | None = None  # None: the recipe's own


# Sources: GSM8K's and MATH-500's as verl's and lighteval's tasks read them; AIME 2024 and 2025 as
# lighteval's aime24 / aime25 tasks (HuggingFaceH4/aime_2024, yentinglin/aime_2025).
BENCHMARKS: dict[str, Benchmark] = {
    "gsm8k": Benchmark("gsm8k", "gsm8k", "test", SOURCES[("gsm8k", "test")]),
    "math500": Benchmark("math500", "math500", "test", SOURCES[("math500", "test")]),
    "aime24": Benchmark("aime24", "aime", "test", SOURCES[("aime", "test")], "aime2024"),
    "aime25": Benchmark("aime25", "aime", "test",
                        HubSource("yentinglin/aime_2025", ("data/train-*.parquet", "*.parquet", "*.jsonl")),
                        "aime2025"),
}


def benchmark(name: str) -> Benchmark:
    """The benchmark ``name``; a DataError naming the ones there are otherwise."""
    if name not in BENCHMARKS:
        close = difflib.get_close_matches(name, list(BENCHMARKS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DataError(f"--benchmark: unknown benchmark {name!r}{hint}; one of {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def source_of(dataset: str, split: str) -> HubSource:
    """Where ``dataset``'s ``split`` lives; a DataError saying to pass ``--in`` when we do not know."""
    if (dataset, split) not in SOURCES:
        known = ", ".join(f"{d} {s}" for d, s in SOURCES)
        raise DataError(f"prepare: no Hugging Face source known for {dataset} split {split!r} (known: {known}); "
                        "pass the downloaded file with --in")
    return SOURCES[(dataset, split)]


def split_files(snapshot: str, source: HubSource) -> list[str]:
    """The files of ``source``'s split in a snapshot directory: those of the first pattern that matches."""
    root = Path(snapshot)
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink())
    for pattern in source.patterns:
        found = [n for n in names if fnmatch.fnmatch(n, pattern)]
        if found:
            return [str(root / n) for n in found]
    raise DataError(f"{source.repo_id}: no file matching {' / '.join(source.patterns)} in {snapshot} "
                    f"(its files: {names[:8]}{' ...' if len(names) > 8 else ''}); pass the file with --in")


def fetch(source: HubSource, what: str) -> list[str]:
    """The local files of ``source`` (the Hugging Face cache; downloaded into it when online)."""
    from vcppo.models.hub import HubId, resolve_once

    snapshot = resolve_once(HubId(source.repo_id), what, repo_type="dataset", allow_patterns=list(source.patterns))
    files = split_files(snapshot, source)
    print(f"vcppo: {what}: {source.repo_id} -> {', '.join(os.path.relpath(f, snapshot) for f in files)} "
          f"(snapshot {Path(snapshot).name})", flush=True)
    return files


def _is_verl_file(path: str) -> bool:
    """The file is verl-format already (prepare's ``VERL_COLUMNS``): a prepared file."""
    if not path.endswith(".parquet") or not os.path.isfile(path):
        return False
    import pyarrow.parquet as pq

    from vcppo.data.prepare import VERL_COLUMNS

    return set(VERL_COLUMNS) <= set(pq.read_schema(path).names)


def benchmark_files(names: list[str], given: list[str], workdir: str) -> list[str]:
    """The verl-format files of benchmarks ``names``: ``given`` (the user's file, for one benchmark)
    as it is when prepared already, else prepared from it; without ``given``, prepared from the
    Hugging Face cache. Prepared files are written under ``workdir``."""
    from vcppo.data.prepare import prepare

    marks = [benchmark(n) for n in names]
    if given and len(marks) != 1:
        raise DataError(f"--benchmark: one benchmark reads the given data file(s) {given}, got {len(marks)} "
                        f"({', '.join(names)}); drop the files to read every benchmark from the cache")
    files = []
    for mark in marks:
        if given and all(_is_verl_file(p) for p in given):
            files += given
            continue
        source = given or fetch(mark.source, f"--benchmark {mark.name}")
        out = os.path.join(workdir, f"{mark.name}.parquet")
        n, _ = prepare(mark.recipe, source, out, mark.split, data_source=mark.data_source)
        print(f"vcppo: --benchmark {mark.name}: {n} prompts", flush=True)
        files.append(out)
    return files
