"""Data sets and benchmarks from the Hugging Face cache (vcppo.data.hub_sources): which files a split
is, the errors, and `vcppo data prepare` without --in."""
import json

import pandas as pd
import pytest

from tests.hub_cache import add_snapshot, offline_hub
from vcppo.data import hub_sources
from vcppo.errors import DataError
from vcppo.commands.data import main as data_main
from vcppo.errors import ConfigError


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    return offline_hub(tmp_path, monkeypatch)


def _gsm_rows(n, start=0):
    return [{"question": f"q{i}?", "answer": f"so {i}\n#### {i:,}"} for i in range(start, start + n)]


def _gsm8k(hf_home, tmp_path):
    for split, rows in (("train", _gsm_rows(5, 1000)), ("test", _gsm_rows(3))):
        pd.DataFrame(rows).to_parquet(tmp_path / f"{split}.parquet")
    return add_snapshot(hf_home, "openai/gsm8k", {
        "main/train-00000-of-00001.parquet": tmp_path / "train.parquet",
        "main/test-00000-of-00001.parquet": tmp_path / "test.parquet",
        "socratic/train-00000-of-00001.parquet": tmp_path / "test.parquet"}, repo_type="dataset")


def test_prepare_without_in_reads_the_split_from_the_cache(hf_home, tmp_path, capsys):
    snapshot = _gsm8k(hf_home, tmp_path)
    assert data_main(["prepare", "gsm8k", "--out", str(tmp_path / "out" / "train.parquet")]) == 0
    assert data_main(["prepare", "gsm8k", "--split", "test", "--out", str(tmp_path / "out" / "test.parquet")]) == 0
    train, test = (pd.read_parquet(tmp_path / "out" / f"{s}.parquet") for s in ("train", "test"))
    assert [r["ground_truth"] for r in train["reward_model"]] == ["1000", "1001", "1002", "1003", "1004"]
    assert [e["split"] for e in test["extra_info"]] == ["test"] * 3
    assert f"openai/gsm8k -> main/train-00000-of-00001.parquet (snapshot {snapshot.name})" in capsys.readouterr().out


def test_a_data_set_not_in_the_cache_says_how_to_fetch_it(hf_home, tmp_path):
    with pytest.raises(ConfigError, match=r"^prepare math500: HuggingFaceH4/MATH-500 is not a local path and not in "
                                          r"the Hugging Face cache .*hf download HuggingFaceH4/MATH-500 --repo-type "
                                          r"dataset"):
        data_main(["prepare", "math500", "--out", str(tmp_path / "m.parquet")])


def test_a_split_we_have_no_source_for_asks_for_in(hf_home, tmp_path):
    with pytest.raises(DataError, match="no Hugging Face source known for math500 split 'train'.*pass the "
                                        "downloaded file with --in"):
        data_main(["prepare", "math500", "--split", "train", "--out", str(tmp_path / "m.parquet")])


def test_split_files_takes_the_first_pattern_that_matches(tmp_path):
    for name in ("data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet", "other.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    source = hub_sources.HubSource("org/x", ("data/train-*.parquet", "*.jsonl"))
    assert hub_sources.split_files(str(tmp_path), source) == [
        str(tmp_path / "data/train-00000-of-00002.parquet"), str(tmp_path / "data/train-00001-of-00002.parquet")]
    with pytest.raises(DataError, match=r"org/y: no file matching test-\*.parquet in .*pass the file with --in"):
        hub_sources.split_files(str(tmp_path), hub_sources.HubSource("org/y", ("test-*.parquet",)))


def test_unknown_benchmark_suggests_the_name():
    with pytest.raises(DataError, match="unknown benchmark 'aime2024' \\(did you mean 'aime24'\\?\\); one of "
                                        "gsm8k, math500, aime24, aime25"):
        hub_sources.benchmark("aime2024")


def test_benchmark_files_use_a_prepared_file_as_it_is_and_prepare_a_raw_one(tmp_path, hf_home):
    raw = tmp_path / "aime25.jsonl"
    raw.write_text("".join(json.dumps({"problem": f"p{i}", "answer": str(i)}) + "\n" for i in range(3)))
    (out,) = hub_sources.benchmark_files(["aime25"], [str(raw)], str(tmp_path))
    prepared = pd.read_parquet(out)
    assert set(prepared["data_source"]) == {"aime2025"}  # routed to verl's math_dapo scorer (aime*)
    assert prepared["prompt"][0][0]["content"].startswith("Solve the following math problem step by step.")
    assert hub_sources.benchmark_files(["aime25"], [out], str(tmp_path / "x")) == [out]
    with pytest.raises(DataError, match="one benchmark reads the given data file"):
        hub_sources.benchmark_files(["gsm8k", "aime25"], [out], str(tmp_path))
