"""Which directories score as reward models, and the error for those that cannot (no engine)."""
import json

import pytest

from vcppo.models.reward_model import HF_SEQ_CLS, VCPPO, reward_model_format


def _config(path, **fields):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(fields))
    return str(path)


def test_the_two_formats(tmp_path):
    vcppo_dir = _config(tmp_path / "rm", architectures=["Qwen2Model"])
    (tmp_path / "rm" / "vcppo_value_model.json").write_text("{}")
    assert reward_model_format(vcppo_dir) == VCPPO
    hf = _config(tmp_path / "hf", architectures=["Qwen2ForSequenceClassification"], num_labels=1)
    assert reward_model_format(hf) == HF_SEQ_CLS
    by_labels = _config(tmp_path / "hf2", architectures=["LlamaForSequenceClassification"], id2label={"0": "s"})
    assert reward_model_format(by_labels) == HF_SEQ_CLS


def test_directories_without_a_score_head_are_named(tmp_path):
    with pytest.raises(ValueError, match="no score head"):
        reward_model_format(_config(tmp_path / "lm", architectures=["Qwen2ForCausalLM"]))
    with pytest.raises(ValueError, match="one label"):
        reward_model_format(_config(tmp_path / "cls", architectures=["Qwen2ForSequenceClassification"], num_labels=3))
    with pytest.raises(ValueError, match="no config.json"):
        reward_model_format(str(tmp_path))
