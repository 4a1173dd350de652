"""verl-parity scorers (vcppo.rewards.verl_parity): verl's gsm8k / MATH / DAPO rules case by case,
quirks included; the cases where they and our verifier disagree; and reward.verl_parity routing
verl's data_sources to them through RewardScorer (exact names, the aime* prefix, user entries first)."""
import pytest

from vcppo.config.load import load_config
from vcppo.rewards.routing import GroundTruth, SourceTable
from vcppo.rewards.verifier import RewardScorer, score
from vcppo.rewards.verl_parity import VERL_DATA_SOURCES, functions_by_source, gsm8k, math, math_dapo
from vcppo.errors import ConfigError

FAR = "\n" + "I checked every step again. " * 12  # > 300 characters

GSM8K_CASES = [
    ("48 + 24 = 72\n#### 72", "72", 1.0),
    ("#### 1,234", "1234", 1.0),                      # commas dropped
    ("#### -5", "-5", 1.0),
    ("#### 72.", "72", 0.0),                          # compared as text: "72." is not "72"
    ("####72", "72", 0.0),                            # strict format: one space after ####
    ("#### $72", "72", 0.0),
    ("#### 3\nno, wait\n#### 72", "72", 1.0),         # the last one
    ("#### 72" + FAR, "72", 0.0),                     # further than 300 characters from the end
    ("x" * 1000 + "\n#### 72", "72", 1.0),            # a long response, the answer in its tail
    ("<think>so #### 72</think>\nThe answer is 70.", "72", 1.0),  # the think part is read
    ("</think>\n\\boxed{72}", "72", 0.0),             # a box is not read
    ("#### 72", "73", 0.0),
    (None, "72", 0.0),
]

MATH_CASES = [
    ("\\boxed{\\frac{1}{2}}", "\\frac12", 1.0),
    ("\\boxed{\\dfrac{1}{2}}", "0.5", 1.0),           # 0.5 -> \frac{1}{2}, dfrac -> frac
    ("\\boxed{3/4}", "\\frac{3}{4}", 1.0),
    ("\\boxed{k = 5}", "5", 1.0),                     # a short "k =" is dropped
    ("\\boxed{5\\text{ cm}}", "5", 1.0),              # a unit after "\text{ " is dropped
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{\\left(1, 2\\right)}", "(1,2)", 1.0),
    ("\\boxed{3} then \\boxed{5}", "5", 1.0),         # the last box
    ("\\fbox{5}", "5", 0.0),                          # found, but upstream cannot unwrap \fbox
    ("so \\boxed 5$ done", "5", 1.0),                 # "\boxed " with a space, up to a $
    ("\\boxed 3$ then \\boxed{5}", "5", 0.0),         # ... and that form wins wherever it is
    ("<think>\\boxed{4}</think>", "4", 1.0),          # the think part is read
    ("\\boxed{2x+1}", "1+2x", 0.0),                   # text, not mathematics
    ("\\boxed{0.50}", "\\frac{1}{2}", 0.0),
    ("\\boxed{\\sqrt}", "\\sqrt", 1.0),               # normalisation fails: raw strings compared
    ("\\boxed{5", "5", 0.0),                          # never closes
    ("the answer is 5", "5", 0.0),
    (None, "5", 0.0),
]

DAPO_CASES = [
    ("Answer: 34", "34", 1.0),
    ("answer : 34", "34", 1.0),                       # case and blanks
    ("Answer: $34$", "34", 1.0),
    ("Answer: 1,000", "1000", 1.0),
    ("Answer: x = 34", "34", 1.0),                    # the part after the last =
    ("Answer: 34 dollars", "34", 1.0),                # unit words removed
    ("Answer: \\boxed{34}", "34", 1.0),
    ("Answer: \\frac12", "\\frac{1}{2}", 1.0),
    ("Answer: tx", "tan x", 1.0),                     # quirk: "an " is removed everywhere
    ("Answer: 3\nAnswer: 34", "34", 1.0),             # the last line
    ("Answer:\n34", "34", 1.0),                       # the blanks after the colon span a line break
    ("</think>\n\\boxed{34}", "34", -1.0),            # a bare box is not read
    ("Answer: 34" + FAR, "34", -1.0),                 # further than 300 characters from the end
    ("<think>\nAnswer: 34\n</think>\nI am done.", "34", 1.0),  # the think part is read
    ("<think>Answer: 34</think>", "34", -1.0),        # ... to the end of its line: "34</think>"
    ("Answer: 0.5", "\\frac{1}{2}", -1.0),
    ("Answer: 033", "33", -1.0),
    (None, "34", -1.0),
]


@pytest.mark.parametrize("text,truth,expected", GSM8K_CASES)
def test_gsm8k(text, truth, expected):
    assert gsm8k(text, truth) == expected


@pytest.mark.parametrize("text,truth,expected", MATH_CASES)
def test_math(text, truth, expected):
    assert math(text, truth) == expected


@pytest.mark.parametrize("text,truth,expected", DAPO_CASES)
def test_math_dapo(text, truth, expected):
    assert math_dapo(text, truth) == expected


# (verl scorer, response, ground truth, finish_reason, verl-parity's score, our verifier's score);
# docs/migrating_from_verl.md shows this table
DISAGREEMENTS = [
    (gsm8k, "48 + 24 = 72\n#### 72", "72", "stop", 1.0, -1.0),               # no </think>
    (gsm8k, "<think>48+24=72</think>\n\\boxed{72}", "72", "stop", 0.0, 1.0),  # a box, no ####
    (gsm8k, "<think>so #### 72</think>\nThe answer is 70.", "72", "stop", 1.0, -1.0),
    (math, "<think>so \\boxed{4}</think>", "4", "stop", 1.0, -1.0),          # a box inside the think part
    (math, "<think>...</think>\n\\boxed{4}", "4", "length", 1.0, -1.0),      # truncated
    (math, "<think>...</think>\n\\boxed{2x+1}", "1+2x", "stop", 0.0, 1.0),
    (math, "<think>...</think>\n\\boxed{0.50}", "\\frac{1}{2}", "stop", 0.0, 1.0),
    (math, "<think>...</think>\n\\fbox{5}", "5", "stop", 0.0, 1.0),
    (math_dapo, "Answer: 34", "34", "stop", 1.0, -1.0),                        # no </think>
    (math_dapo, "<think>...</think>\n\\boxed{34}", "34", "stop", -1.0, 1.0),
    (math_dapo, "<think>...</think>\nAnswer: 34" + FAR, "34", "stop", -1.0, 1.0),
    (math_dapo, "<think>...</think>\nAnswer: \\frac{1}{2}", "0.5", "stop", -1.0, 1.0),
    (math_dapo, "<think>...</think>\nAnswer: 033", "33", "stop", -1.0, 1.0),
]


@pytest.mark.parametrize("fn,text,truth,finish,verl,ours", DISAGREEMENTS)
def test_where_verl_parity_and_our_verifier_disagree(fn, text, truth, finish, verl, ours):
    assert fn(text, truth, finish_reason=finish) == verl
    assert score(text, truth, finish_reason=finish) == ours


def rows(*sources):
    return [GroundTruth("72", {"data_source": s, "extra_info": {"index": i}}) for i, s in enumerate(sources)]


def test_the_config_switch_routes_gsm8k_rows_to_the_gsm8k_scorer():
    from vcppo.driver.context import make_scorer

    on = make_scorer(load_config("base", ["reward.verl_parity=true", "reward.num_workers=0"]))
    off = make_scorer(load_config("base", ["reward.num_workers=0"]))
    texts = ["#### 72", "</think>\\boxed{72}", "#### 72", "</think>\\boxed{72}"]
    truths = rows("openai/gsm8k", "openai/gsm8k", "my/own", "my/own")
    assert on(texts, truths)[0] == [1.0, 0.0, -1.0, 1.0]  # verl's rule for gsm8k rows, ours for the rest
    assert off(texts, truths)[0] == [-1.0, 1.0, -1.0, 1.0]
    assert "openai/gsm8k" in on.functions_by_source and not off.functions_by_source


def test_aime_prefix_and_user_entries_win(reward_module):
    mine = reward_module("vcppo_parity_helpers", "def seven(text, truth, **info):\n    return 7.0\n")
    table = functions_by_source({"aime_2025": f"{mine}:seven", "openai/gsm8k": f"{mine}:seven"}, True)
    assert table["math"] == VERL_DATA_SOURCES["math"] and table["openai/gsm8k"] == f"{mine}:seven"
    scorer = RewardScorer(functions_by_source={"aime_2025": f"{mine}:seven", "openai/gsm8k": f"{mine}:seven"},
                          verl_parity=True)
    assert scorer.functions_by_source == table
    texts = ["Answer: 72"] * 5
    rewards, _ = scorer(texts, rows("aime2024", "aime_2025", "openai/gsm8k", "math", "amc"))
    assert rewards == [1.0, 7.0, 7.0, 1.0, -1.0]  # aime*: DAPO's rule; own entries first; amc: our verifier
    assert "aime24" in scorer.functions_by_source and "amc" not in scorer.functions_by_source
    assert functions_by_source({"x": "m:f"}, False) == {"x": "m:f"}


def test_source_table_prefers_exact_keys_then_longer_prefixes():
    table = SourceTable({"a*": 1, "ab*": 2, "abc": 3})
    assert [table.key_for(s) for s in ("abc", "abd", "az", "b", None)] == ["abc", "ab*", "a*", None, None]
    assert "az" in table and "b" not in table and 3 not in table


def test_verl_parity_scores_in_the_worker_pool():
    scorer = RewardScorer(verl_parity=True, num_workers=1, timeout_s=30)
    try:
        rewards, metrics = scorer(["#### 72", "Answer: 72", "\\boxed{72}"],
                                  rows("openai/gsm8k", "aime2024", "HuggingFaceH4/MATH-500"))
    finally:
        scorer.close()
    assert rewards == [1.0, 1.0, 1.0] and metrics["reward/num_failures"] == 0.0


def test_verl_parity_gives_model_without_rule_its_rules():
    keys = ["reward.combine=model_without_rule", "reward.model_path=/some/rm"]
    with pytest.raises(ConfigError, match="needs reward.functions_by_source"):
        load_config("base", keys)
    assert load_config("base", keys + ["reward.verl_parity=true"]).reward.verl_parity is True
