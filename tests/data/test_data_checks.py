"""Bad prompt data is named before any engine starts: the file, the line or row, the field."""
import gzip
import json

import pytest

from vcppo.errors import DataError
from vcppo.data.dataset import load_prompts
from vcppo.models.tokenizer import build_tokenizer
from vcppo.errors import ConfigError


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD = {"prompt": "1+2=?", "answer": "3"}


@pytest.mark.parametrize("content,named", [
    (b"", r"is empty: no rows"),
    (b"\n  \n\n", r"is empty: no rows"),
    (b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xff\xfe b", "answer": "2"}\n',
     r"line 2: not UTF-8 text \(byte 0xff at column 13\)"),
    (b'{"prompt": "a", "answer": "1"\n', r"line 1: not valid JSON \(Expecting ',' delimiter at column 30\)"),
    (b'{"prompt": "a", "answer": "1"}\n["a", "1"]\n', r"line 2: a JSON-lines row must be an object"),
])
def test_unreadable_jsonl_names_the_file_and_line(tmp_path, tok, content, named):
    path = tmp_path / "train.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError, match=f"train.jsonl.*{named}|{named}.*") as e:
        load_prompts(path, tok)
    assert "train.jsonl" in str(e.value)


def test_non_utf8_in_a_gzipped_jsonl_and_a_json_array(tmp_path, tok):
    path = tmp_path / "train.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"train.jsonl.gz, line 2: not UTF-8"):
        load_prompts(path, tok)
    array = tmp_path / "train.json"
    array.write_text(json.dumps([GOOD, GOOD], indent=2))  # one JSON document over many lines: fine
    assert len(load_prompts(array, tok)) == 2


def test_zero_row_parquet_and_a_file_that_is_not_parquet(tmp_path, tok):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), path)
    with pytest.raises(DataError, match="train.parquet has zero rows"):
        load_prompts(path, tok)
    path.write_text("not parquet at all")
    with pytest.raises(DataError, match="train.parquet is not a readable parquet file"):
        load_prompts(path, tok)


def test_zero_row_save_to_disk_dir(tmp_path, tok):
    import datasets
    datasets.Dataset.from_dict({"prompt": [], "answer": []}).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(DataError, match="zero rows"):
        load_prompts(tmp_path / "d", tok)


@pytest.mark.parametrize("rows,named", [
    ([GOOD, {"prompt": 5, "answer": "1"}], r"prompt field 'q' must hold text or a list of chat messages .*, but row 2 holds int '5'"),
    ([GOOD, {"prompt": ["a"], "answer": "1"}], r"prompt field 'q' must hold text or a list of chat messages .*, but row 2 holds list"),
    ([{"prompt": 5, "answer": "1"}], r"prompt field 'q' must hold text or a list of chat messages .*, but row 1 holds int"),
    ([GOOD, {"prompt": "", "answer": "1"}], r"1 empty or null prompt\(s\) in field 'q' \(row 2\)"),
    ([GOOD, {"prompt": "   ", "answer": "1"}, {"prompt": None, "answer": "1"}],
     r"2 empty or null prompt\(s\) in field 'q' \(rows 2, 3\)"),
    ([GOOD, {"prompt": "a", "answer": None}], r"1 null answer\(s\) in field 'a' \(row 2\)"),
    ([GOOD, {"prompt": "a"}], r"1 null answer\(s\) in field 'a' \(row 2\)"),        # missing in one row
    ([GOOD, {"prompt": "a", "answer": [1, 2]}], r"answer field 'a' must hold text or numbers, but row 2 holds list"),
    ([GOOD, {"prompt": "a", "answer": {"x": 1}}], r"answer field 'a' must hold text or numbers, but row 2 holds dict"),
])
def test_missing_or_wrongly_typed_fields_are_named(tmp_path, tok, rows, named):
    renamed = [{("q" if k == "prompt" else "a"): v for k, v in r.items()} for r in rows]
    path = _jsonl(tmp_path / "train.jsonl", renamed)
    with pytest.raises(DataError, match=named):
        load_prompts(path, tok, prompt_field="q", answer_field="a")


def test_many_null_answers_name_the_first_rows(tmp_path, tok):
    path = _jsonl(tmp_path / "train.jsonl", [GOOD] + [{"prompt": "a", "answer": None}] * 8)
    with pytest.raises(DataError, match=r"8 null answer\(s\).*rows 2, 3, 4, 5, 6, \.\.\."):
        load_prompts(path, tok)


def test_numeric_answers_are_fine(tmp_path, tok):
    path = _jsonl(tmp_path / "train.jsonl", [{"prompt": "a", "answer": 3}, {"prompt": "b", "answer": 4}])
    assert sorted(load_prompts(path, tok).dataset["answer"]) == ["3", "4"]


def test_prompts_all_too_long_are_reported_with_the_key(tmp_path, tok):
    path = _jsonl(tmp_path / "train.jsonl", [{"prompt": "9" * 300, "answer": "1"}] * 3)
    with pytest.raises(DataError, match=r"all 3 prompts in .*train.jsonl are longer than max_prompt_tokens=10 "
                                        r"tokens \(the shortest has \d+\); raise data.max_prompt_tokens"):
        load_prompts(path, tok, max_prompt_tokens=10)
    assert len(load_prompts(path, tok, max_prompt_tokens=None)) == 3


def test_data_errors_are_config_errors_the_cli_prints_cleanly():
    assert issubclass(DataError, ConfigError) and issubclass(DataError, ValueError)
