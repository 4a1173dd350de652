"""Which directories score as reward models, and the error for those that cannot (no engine)."""
import json

import pytest

from vcppo.models.reward_model import HF_SEQ_CLS, VCPPO, reward_model_format


def _config(path, **fields):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(fields))
    return str(path)


def _vcppo_dir(path, **heads):
    import torch
    from safetensors.torch import save_file
    d = _config(path, architectures=["Qwen2Model"])
    (path / "vcppo_value_model.json").write_text("{}")
    save_file({"weight": torch.zeros(1, 4), "bias": torch.zeros(1), **heads}, str(path / "value_head.safetensors"))
    return d


def test_the_two_formats(tmp_path):
    assert reward_model_format(_vcppo_dir(tmp_path / "rm")) == VCPPO
    hf = _config(tmp_path / "hf", architectures=["Qwen2ForSequenceClassification"], num_labels=1)
    assert reward_model_format(hf) == HF_SEQ_CLS
    by_labels = _config(tmp_path / "hf2", architectures=["LlamaForSequenceClassification"], id2label={"0": "s"})
    assert reward_model_format(by_labels) == HF_SEQ_CLS


def test_directories_without_a_score_head_are_named(tmp_path):
    with pytest.raises(ValueError, match="no score head"):
        reward_model_format(_config(tmp_path / "lm", architectures=["Qwen2ForCausalLM"]))
    with pytest.raises(ValueError, match="one label"):
        reward_model_format(_config(tmp_path / "cls", architectures=["Qwen2ForSequenceClassification"], num_labels=3))
    import torch
    with pytest.raises(ValueError, match="confidence head"):  # a critic, not a reward model
        reward_model_format(_vcppo_dir(tmp_path / "critic", **{"confidence.weight": torch.zeros(1, 3)}))
    with pytest.raises(ValueError, match="no config.json"):
        reward_model_format(str(tmp_path))
