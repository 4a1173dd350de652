"""load_prompts (parquet / jsonl / save_to_disk), errors, length filter, PromptStream resume."""
import json
import logging

import pytest

from vcppo.data import tasks
from vcppo.data.dataset import PromptStream, encode_prompt, load_prompts
from vcppo.models.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def rows():
    return tasks.generate("add", "val", 40, difficulty=4, seed=0)


@pytest.fixture()
def parquet(tmp_path, rows):
    import pandas as pd
    path = tmp_path / "val.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_parquet_chat_template_auto(parquet, tok, rows):
    ps = load_prompts(parquet, tok, shuffle_seed=None)
    assert len(ps) == 40 and ps.num_dropped == 0 and ps.use_chat_template
    r = ps[0]
    assert r["prompt"] == rows[0]["prompt"] and r["answer"] == rows[0]["answer"]
    text = tok.decode(r["prompt_ids"])
    assert text == f"<|im_start|>user\n{rows[0]['prompt']}<|im_end|>\n<|im_start|>assistant\n"
    assert "solution" in ps.dataset.column_names  # other columns kept (SFT uses them)


def test_raw_prompt_without_chat_template(parquet, tok, rows):
    ps = load_prompts(parquet, tok, use_chat_template=False, shuffle_seed=None)
    assert tok.decode(ps[0]["prompt_ids"]) == rows[0]["prompt"]


def test_length_filter_counts_drops(tmp_path, tok, caplog):
    import pandas as pd
    rows = [{"q": "1+2=?", "a": 3}, {"q": "9" * 200 + "+1=?", "a": 1}, {"q": "4+4=?", "a": 8}]
    path = tmp_path / "p.jsonl"
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    limit = len(encode_prompt(tok, "1+2=?"))
    with caplog.at_level(logging.WARNING):
        ps = load_prompts(path, tok, prompt_field="q", answer_field="a", max_prompt_tokens=limit)
    assert ps.num_dropped == 1 and ps.num_total == 3 and len(ps) == 2
    assert "dropped 1 of 3" in caplog.text
    assert sorted(ps.dataset["answer"]) == ["3", "8"]  # answers become strings


def test_tokenizer_without_chat_template(tmp_path, tok, parquet, rows):
    import copy
    t = copy.deepcopy(tok)
    t.chat_template = None
    ps = load_prompts(parquet, t, shuffle_seed=None)  # auto -> raw prompts
    assert not ps.use_chat_template and t.decode(ps[0]["prompt_ids"]) == rows[0]["prompt"]
    with pytest.raises(ValueError, match="chat template"):
        load_prompts(parquet, t, use_chat_template=True)


def test_save_to_disk_dir(tmp_path, tok, rows):
    import datasets
    datasets.DatasetDict({"val": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    assert len(load_prompts(tmp_path / "dd", tok)) == 40
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "d"))
    assert len(load_prompts(tmp_path / "d", tok)) == 40


def test_missing_file_and_field(tmp_path, parquet, tok):
    missing = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        load_prompts(missing, tok)
    with pytest.raises(ValueError, match=r"'question'.*available columns.*prompt"):
        load_prompts(parquet, tok, prompt_field="question")
    with pytest.raises(ValueError, match="'label'"):
        load_prompts(parquet, tok, answer_field="label")


def test_deterministic_shuffle(parquet, tok):
    a = load_prompts(parquet, tok, shuffle_seed=3).dataset["prompt"]
    b = load_prompts(parquet, tok, shuffle_seed=3).dataset["prompt"]
    c = load_prompts(parquet, tok, shuffle_seed=4).dataset["prompt"]
    assert a == b and a != c and sorted(a) == sorted(c)


def test_prompt_stream_epochs_and_resume(parquet, tok):
    ds = load_prompts(parquet, tok).dataset
    s = PromptStream(ds, seed=5)
    first = [r["prompt"] for r in s.next_batch(30)]
    state = s.state_dict()
    rest = [r["prompt"] for r in s.next_batch(30)]  # crosses into epoch 1
    assert s.state_dict()["epoch"] == 1 and s.state_dict()["index"] == 20
    epoch0 = first + rest[:10]
    assert sorted(epoch0) == sorted(ds["prompt"])  # each row once per epoch
    assert rest[10:] != epoch0[:20]  # reshuffled for epoch 1
    s2 = PromptStream(ds, seed=5)
    s2.load_state_dict(json.loads(json.dumps(state)))
    assert [r["prompt"] for r in s2.next_batch(30)] == rest
    assert s2.state_dict() == s.state_dict()


def test_a_read_only_datasets_cache_is_named_with_the_fix(tmp_path, monkeypatch):
    """A read-only HF_HOME (a shared cluster cache) blames the cache and names HF_DATASETS_CACHE, not the
    data file. A read-only tmpfs where the host allows mounting one; else the same refusal injected."""
    import errno
    import subprocess

    import datasets
    import pandas as pd

    from vcppo.errors import DataError
    from vcppo.data.dataset import _read_table
    pd.DataFrame({"prompt": ["1+1"], "answer": ["2"]}).to_parquet(tmp_path / "train.parquet")
    cache = tmp_path / "ro"
    cache.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(cache)],
                                 capture_output=True).returncode == 0
    except OSError:
        mounted = False
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache / "datasets"))
    if not mounted:
        def refuse(*a, **k):
            raise OSError(errno.EROFS, "Read-only file system", str(cache / "datasets"))
        monkeypatch.setattr(datasets.Dataset, "from_parquet", refuse)
    try:
        with pytest.raises(DataError) as err:
            _read_table(str(tmp_path / "train.parquet"))
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(cache)], check=False)
    message = str(err.value)
    assert f"the datasets cache {cache / 'datasets'} is not writable" in message and "set HF_DATASETS_CACHE" in message
