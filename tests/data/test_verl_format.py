"""verl-format prompt data: chat-message prompts through the chat template, dotted answer
paths, data_source / extra_info riding along to the reward function, errors naming the field."""
import copy
import json

import pytest

from vcppo.errors import DataError
from vcppo.data.dataset import format_prompt, load_prompts
from vcppo.models.tokenizer import build_tokenizer
from vcppo.rewards.routing import GroundTruth


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def verl_rows(n=6):
    return [{"data_source": "add" if i % 2 else "other",
             "prompt": [{"role": "system", "content": "Think step by step."},
                        {"role": "user", "content": f"{i}+1=?"}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
             "extra_info": {"split": "train", "index": i},
             "answer": "WRONG"}  # a top-level answer as well: the dotted path must win
            for i in range(n)]


@pytest.fixture()
def verl_parquet(tmp_path):
    import pandas as pd
    path = tmp_path / "verl.parquet"
    pd.DataFrame(verl_rows()).to_parquet(path)
    return path


def test_verl_parquet_loads_through_the_chat_template(verl_parquet, tok):
    ps = load_prompts(verl_parquet, tok, answer_field="reward_model.ground_truth", shuffle_seed=None)
    assert len(ps) == 6 and ps.reward_info_fields == ("data_source", "extra_info")
    row = ps[3]
    text = tok.decode(row["prompt_ids"])
    assert text == ("<|im_start|>system\nThink step by step.<|im_end|>\n<|im_start|>user\n3+1=?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert "role" not in text and "[{" not in text  # never the Python repr of the message list
    assert row["answer"] == "4" and isinstance(row["answer"], GroundTruth)
    assert row["answer"].reward_info == {"data_source": "add", "extra_info": {"split": "train", "index": 3}}
    streamed = ps.stream(seed=0, shuffle=False).next_batch(2)
    assert [r["answer"].reward_info["data_source"] for r in streamed] == ["other", "add"]
    assert ps.rows()[5]["answer"].reward_info["extra_info"]["index"] == 5


def test_verl_jsonl_loads_the_same(tmp_path, tok, verl_parquet):
    path = tmp_path / "verl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in verl_rows()))
    a = load_prompts(path, tok, answer_field="reward_model.ground_truth", shuffle_seed=None)
    b = load_prompts(verl_parquet, tok, answer_field="reward_model.ground_truth", shuffle_seed=None)
    assert a.dataset["prompt_ids"] == b.dataset["prompt_ids"] and a.dataset["answer"] == b.dataset["answer"]


def test_chat_messages_without_a_chat_template_are_an_error(verl_parquet, tok):
    # A DataError (the CLI's one line, exit 2) naming the file, the row and the field.
    with pytest.raises(DataError, match=r"verl.parquet: row 0, field 'prompt': the prompt is a list of chat "
                                        r"messages, which needs the tokenizer's chat template"):
        load_prompts(verl_parquet, tok, answer_field="reward_model.ground_truth", use_chat_template=False)
    untemplated = copy.deepcopy(tok)
    untemplated.chat_template = None
    with pytest.raises(DataError, match="row 0, field 'prompt': .*needs the tokenizer's chat template"):
        load_prompts(verl_parquet, untemplated, answer_field="reward_model.ground_truth")
    with pytest.raises(TypeError, match="text or a list of chat messages, got int"):
        format_prompt(tok, 5)


@pytest.mark.parametrize("field,named", [
    ("reward_modl.ground_truth", r"answer_field 'reward_modl.ground_truth': 'reward_modl' is not a column of "
                                 r".*verl.parquet; available columns: .*reward_model"),
    ("reward_model.truth", r"'reward_model' in .*verl.parquet has no field 'truth'; its fields: "
                           r"\['style', 'ground_truth'\]"),
    ("data_source.x", r"'data_source' in .*verl.parquet holds .*string.*, not a struct with a field 'x'"),
])
def test_a_wrong_answer_path_names_the_field_and_the_file(verl_parquet, tok, field, named):
    with pytest.raises(DataError, match=named):
        load_prompts(verl_parquet, tok, answer_field=field)


def test_without_the_dotted_path_the_top_level_answer_is_used(verl_parquet, tok):
    ps = load_prompts(verl_parquet, tok, shuffle_seed=None)
    assert set(ps.dataset["answer"]) == {"WRONG"}  # what the file says; the user picks the field


def test_reward_info_fields_chosen_checked_and_reserved(verl_parquet, tok):
    ps = load_prompts(verl_parquet, tok, answer_field="reward_model.ground_truth", reward_info=["ability"])
    assert ps[0]["answer"].reward_info == {"ability": "math"}
    with pytest.raises(DataError, match=r"data.reward_info_fields \['abilty'\] not columns of .*verl.parquet"):
        load_prompts(verl_parquet, tok, answer_field="reward_model.ground_truth", reward_info=["abilty"])


def test_reserved_reward_info_field_and_bad_messages(tmp_path, tok):
    import pandas as pd
    path = tmp_path / "bad.parquet"
    pd.DataFrame([{"prompt": "1+1=?", "answer": "2", "finish_reason": "x"}]).to_parquet(path)
    with pytest.raises(DataError, match="would shadow arguments"):
        load_prompts(path, tok, reward_info=["finish_reason"])
    msgs = tmp_path / "msgs.jsonl"
    msgs.write_text(json.dumps({"prompt": [{"role": "user", "content": "a"}], "answer": "1"}) + "\n"
                    + json.dumps({"prompt": [{"role": "user", "content": None}], "answer": "1"}) + "\n"
                    + json.dumps({"prompt": [], "answer": "1"}) + "\n")
    with pytest.raises(DataError, match=r"msgs.jsonl: 1 empty or null message list\(s\) .* \(row 3\)"):
        load_prompts(msgs, tok)
    msgs.write_text(json.dumps({"prompt": [{"role": "user", "content": None}], "answer": "1"}) + "\n")
    with pytest.raises(DataError, match=r"holds chat messages, and in row 1 a message's 'role' or "
                                        r"'content' is null"):
        load_prompts(msgs, tok)
