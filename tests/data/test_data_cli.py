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
