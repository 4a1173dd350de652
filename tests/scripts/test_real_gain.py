"""scripts/real_gain.py: the format part of a real model's errors against the answer part."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import real_gain  # noqa: E402


def test_summary_separates_a_misplaced_answer_from_a_wrong_one():
    records = [
        {"answer": "32", "response": 'The final answer after "####" is 32.', "correct": True, "length": 12},
        {"answer": "32", "response": "23 + 9 = 32. Let me check: 23 + 9 is 32, done in 2 steps", "correct": False,
         "length": 20},
        {"answer": "32", "response": "It is 31.", "correct": False, "length": 4},
        {"answer": "1,000", "response": "1000<|im_end|>", "correct": True, "length": 1},
    ]
    s = real_gain.summarise(records)
    assert s["correct"] == 0.5 and s["answer_anywhere"] == 0.75  # the second wrote 32, then a 2
    assert s["ends_on_number"] == 0.75 and s["median_length"] == 8


def test_cli_reads_a_run_directory(tmp_path):
    rec = {"answer": "7", "response": "7", "correct": True, "length": 1}
    (tmp_path / "test_base.samples.jsonl").write_text(json.dumps(rec) + "\n")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "real_gain.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| test_base | 1 | 1.000 | 1.000 | 0.000 | 1 | 1.000 |" in out
