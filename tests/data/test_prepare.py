"""`vcppo data prepare`: small files in each upstream schema (parquet, jsonl, a save_to_disk
directory) become verl-format rows as verl's preprocessing writes them; bad input is one line
naming the file and the field."""
import json

import datasets
import pandas as pd
import pytest

from vcppo.cli import main
from vcppo.data.prepare import DAPO_PROMPT, GSM8K_INSTRUCTION, MATH_INSTRUCTION
from vcppo.rewards.verifier import RewardScorer

GSM8K = [{"question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
          "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 72"},
         {"question": "How many cents are in $12.34?", "answer": "1,234 cents\n#### 1,234"}]
MATH = [{"problem": "What is $\\frac{1}{2}+\\frac{1}{4}$?", "level": "Level 1", "type": "Prealgebra",
         "solution": "We get $\\frac{2}{4}+\\frac{1}{4}=\\boxed{\\frac{3}{4}}$."},
        {"problem": "Find $x$.", "level": "Level 2", "type": "Algebra",
         "solution": "First $\\boxed{1}$, then $x = \\boxed{\\{2, 3\\}}$."},
        {"problem": "Old style.", "level": "Level 1", "type": "Algebra", "solution": "So $\\fbox{7}$."}]
MATH500 = [{"problem": "Compute $2+2$.", "solution": "$2+2=\\boxed{4}$", "answer": "4", "subject": "Algebra",
            "level": 1, "unique_id": "test/algebra/1.json"}]
DAPO = [{"data_source": "math_dapo", "ability": "MATH",
         "prompt": [{"role": "user", "content": DAPO_PROMPT.format(problem="What is 6 * 7?")}],
         "reward_model": {"style": "rule-lighteval/MATH_v2", "ground_truth": "42"},
         "extra_info": {"index": "9a3b-uuid"}}]
AIME = [{"ID": "2024-I-1", "Problem": "Every morning Aya walks.", "Solution": "... so 204.", "Answer": 204},
        {"ID": "2024-I-2", "Problem": "Find xy.", "Solution": "... so 25.", "Answer": 25}]


def prepare(*args):
    return main(["data", "prepare", *map(str, args)])


def read(path):
    return pd.read_parquet(path).to_dict("records")


def test_gsm8k_from_parquet(tmp_path):
    pd.DataFrame(GSM8K).to_parquet(tmp_path / "train.parquet")
    out = tmp_path / "out" / "gsm8k.parquet"
    assert prepare("gsm8k", "--in", tmp_path / "train.parquet", "--out", out) == 0
    rows = read(out)
    assert set(rows[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["72", "1234"]
    first = rows[0]
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert list(first["prompt"]) == [{"role": "user", "content": GSM8K[0]["question"] + " " + GSM8K_INSTRUCTION}]
    assert first["reward_model"]["style"] == "rule"
    assert first["extra_info"] == {"split": "train", "index": 0, "answer": GSM8K[0]["answer"],
                                   "question": GSM8K[0]["question"]}
    assert GSM8K_INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'


def test_math_from_jsonl_keeps_level_and_type(tmp_path):
    src = tmp_path / "math.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in MATH))
    out = tmp_path / "math.parquet"
    assert prepare("math", "--in", src, "--out", out, "--split", "test") == 0
    rows = read(out)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["\\frac{3}{4}", "\\{2, 3\\}", "7"]
    assert rows[0]["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert rows[0]["prompt"][0]["content"] == MATH[0]["problem"] + " " + MATH_INSTRUCTION
    assert rows[1]["extra_info"] == {"split": "test", "index": 1}
    assert rows[2]["level"] == "Level 1" and rows[2]["type"] == "Algebra" and "solution" not in rows[2]


def test_math500_from_a_saved_dataset_dict(tmp_path):
    datasets.DatasetDict({"test": datasets.Dataset.from_list(MATH500)}).save_to_disk(str(tmp_path / "m500"))
    out = tmp_path / "math500.parquet"
    assert prepare("math500", "--in", tmp_path / "m500", "--out", out) == 0
    [row] = read(out)
    assert row["data_source"] == "HuggingFaceH4/MATH-500" and row["reward_model"]["ground_truth"] == "4"
    assert row["extra_info"] == {"split": "test", "index": 0}
    assert row["unique_id"] == "test/algebra/1.json" and row["subject"] == "Algebra"
    assert "solution" not in row and "answer" not in row and "problem" not in row


def test_dapo_math_stays_as_it_is(tmp_path):
    pd.DataFrame(DAPO).to_parquet(tmp_path / "dapo.parquet")
    out = tmp_path / "dapo_out.parquet"
    assert prepare("dapo-math", "--in", tmp_path / "dapo.parquet", "--out", out) == 0
    [row] = read(out)
    assert row["data_source"] == "math_dapo" and row["reward_model"]["ground_truth"] == "42"
    assert list(row["prompt"]) == DAPO[0]["prompt"] and row["ability"] == "MATH"
    assert row["extra_info"] == {"index": "9a3b-uuid", "split": "train"}


@pytest.mark.parametrize("lower", [False, True])
def test_aime_upper_or_lower_case_columns(tmp_path, lower):
    aime = [{(k.lower() if lower else k): v for k, v in r.items()} for r in AIME]
    src = tmp_path / "aime.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in aime))
    out = tmp_path / "aime.parquet"
    assert prepare("aime", "--in", src, "--out", out) == 0
    rows = read(out)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["204", "25"]
    assert rows[0]["data_source"] == "aime2024" and rows[0]["extra_info"] == {"split": "test", "index": 0}
    assert rows[0]["prompt"][0]["content"] == DAPO_PROMPT.format(problem="Every morning Aya walks.")
    assert rows[0]["ID" if not lower else "id"] == "2024-I-1" and "Solution" not in rows[0]


def test_aime_already_in_verl_format_passes_through(tmp_path):
    pd.DataFrame(DAPO).to_parquet(tmp_path / "aime_verl.parquet")
    out = tmp_path / "aime.parquet"
    assert prepare("aime", "--in", tmp_path / "aime_verl.parquet", "--out", out) == 0
    [row] = read(out)
    assert row["data_source"] == "math_dapo" and row["extra_info"]["split"] == "test"


def test_prepared_gsm8k_loads_and_scores_as_verl_scores_it(tmp_path):
    from vcppo.data.dataset import load_prompts
    from vcppo.models.tokenizer import build_tokenizer

    pd.DataFrame(GSM8K).to_parquet(tmp_path / "train.parquet")
    assert prepare("gsm8k", "--in", tmp_path / "train.parquet", "--out", tmp_path / "g.parquet") == 0
    prompts = load_prompts(tmp_path / "g.parquet", build_tokenizer(tmp_path / "tok"),
                           answer_field="reward_model.ground_truth", max_prompt_tokens=None, shuffle_seed=None)
    truths = [row["answer"] for row in prompts.rows()]
    assert truths == ["72", "1234"] and truths[0].reward_info["data_source"] == "openai/gsm8k"
    rewards, _ = RewardScorer(verl_parity=True)(["#### 72", "#### 1234"], truths)
    assert rewards == [1.0, 1.0]


def one_line_error(capsys, *args) -> str:
    assert prepare(*args) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # above it: datasets' progress bars, if any
    assert last.startswith("vcppo data: "), last
    return last


def test_errors_name_the_file_and_the_field(tmp_path, capsys):
    pd.DataFrame([{"question": "q?", "solution": "no"}]).to_parquet(tmp_path / "bad.parquet")
    out = tmp_path / "o.parquet"
    err = one_line_error(capsys, "gsm8k", "--in", tmp_path / "bad.parquet", "--out", out)
    assert "bad.parquet" in err and "'answer'" in err and "question" in err
    pd.DataFrame([{"question": "q?", "answer": "no final line"}]).to_parquet(tmp_path / "nofinal.parquet")
    err = one_line_error(capsys, "gsm8k", "--in", tmp_path / "nofinal.parquet", "--out", out)
    assert "nofinal.parquet: row 1, field 'answer'" in err and "####" in err
    pd.DataFrame([{"problem": "p", "solution": "no box"}]).to_parquet(tmp_path / "nobox.parquet")
    err = one_line_error(capsys, "math", "--in", tmp_path / "nobox.parquet", "--out", out)
    assert "nobox.parquet: row 1, field 'solution'" in err
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    err = one_line_error(capsys, "math", "--in", tmp_path / "junk.parquet", "--out", out)
    assert "junk.parquet" in err
    err = one_line_error(capsys, "math", "--in", tmp_path / "missing.jsonl", "--out", out)
    assert "missing.jsonl" in err
    err = one_line_error(capsys, "gsm9k", "--in", tmp_path / "bad.parquet", "--out", out)
    assert "unknown dataset 'gsm9k'" in err and "did you mean 'gsm8k'" in err
    err = one_line_error(capsys, "gsm8k", "--in", tmp_path / "bad.parquet", "--out", tmp_path / "o.jsonl")
    assert ".parquet" in err and not out.exists()
