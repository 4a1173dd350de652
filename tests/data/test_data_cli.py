"""`vcppo data make` / `stats` through the real dispatcher."""
import json

import pandas as pd

from vcppo.cli import main
from vcppo.data import tasks


def test_data_make_all_splits(tmp_path, capsys):
    out = tmp_path / "add"
    assert main(["data", "make", "--task", "add", "--out", str(out), "--n", "60", "--n-eval", "20",
                 "--difficulty", "4", "--seed", "2"]) == 0
    dfs = {s: pd.read_parquet(out / f"{s}.parquet") for s in tasks.SPLITS}
    assert [len(dfs[s]) for s in tasks.SPLITS] == [60, 20, 20]
    assert set(dfs["train"].columns) >= {"prompt", "answer", "solution"}
    assert not set(dfs["train"].prompt) & set(dfs["test"].prompt)
    meta = json.loads((out / "stats.json").read_text())
    assert meta["difficulty"] == 4 and meta["trace_tokens"]["val"]["n"] == 20
    assert dfs["val"].to_dict("records") == tasks.generate("add", "val", 20, difficulty=4, seed=2)


def test_data_make_single_split_jsonl_and_stats(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    assert main(["data", "make", "--split", "test", "--out", str(path), "--n", "10"]) == 0
    assert len(path.read_text().splitlines()) == 10
    capsys.readouterr()
    assert main(["data", "stats", str(path)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["n"] == 10 and stats["min"] >= 100


def test_data_make_verl_format_loads_as_verl_data(tmp_path):
    from vcppo.data.dataset import load_prompts
    from vcppo.models.tokenizer import build_tokenizer
    out = tmp_path / "verl"
    assert main(["data", "make", "--task", "add", "--out", str(out), "--n", "12", "--n-eval", "4",
                 "--difficulty", "3", "--format", "verl"]) == 0
    plain = tasks.generate("add", "val", 4, difficulty=3, seed=0)
    df = pd.read_parquet(out / "val.parquet")
    row = df.iloc[1]
    assert row["data_source"] == "vcppo/add" and list(row["prompt"]) == [{"role": "user", "content": plain[1]["prompt"]}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": plain[1]["answer"]}
    assert row["extra_info"] == {"split": "val", "index": 1, "task": "add", "difficulty": 3}
    assert "answer" not in df.columns and row["solution"] == plain[1]["solution"]
    ps = load_prompts(out / "val.parquet", build_tokenizer(), answer_field="reward_model.ground_truth",
                      shuffle_seed=None)
    assert [str(r["answer"]) for r in ps.rows()] == [r["answer"] for r in plain]
    assert ps[1]["answer"].reward_info["extra_info"]["index"] == 1
