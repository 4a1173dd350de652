"""Reward-model directories the trainer scores with, and the per-position score module.

Two formats:

* ``vcppo`` — what `vcppo rm` writes (:mod:`vcppo.models.value_model`). Its head was trained on
  the critic's reading of the last response token: the output at the position that PREDICTS
  that token (V of the state before it), so that is where it is read.
* ``hf_sequence_classification`` — any transformers ``*ForSequenceClassification`` checkpoint
  with one label (the usual open-source RM). transformers pools the output of the last token that
  is not the pad id (the last token itself, or, where pad == eos, the one before a final eos);
  here the backbone and its ``score`` head run on every position and the engine reads that
  position, which gives transformers' number in a left-padded, right-padded or packed row.
"""
from __future__ import annotations

import json
import os

import torch
from torch import nn

from vcppo.models.value_model import HEAD_FILE, is_value_model_dir

VCPPO, HF_SEQ_CLS = "vcppo", "hf_sequence_classification"


def reward_model_format(path: str) -> str:
    """``VCPPO`` or ``HF_SEQ_CLS``; ValueError saying what is missing otherwise (read from the
    directory's files only: no weights are loaded)."""
    if is_value_model_dir(path):
        from safetensors import safe_open
        with safe_open(os.path.join(path, HEAD_FILE), framework="pt") as heads:
            if any(k.startswith("confidence.") for k in heads.keys()):
                raise ValueError(f"{path} is a critic with a confidence head (it reads the sampler's logprobs), "
                                 "not a reward model")
        return VCPPO
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ValueError(f"{path} has no config.json: not a model directory")
    try:
        config = json.loads(open(config_file).read())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {config_file}: {e}") from None
    archs = config.get("architectures") or []
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ValueError(f"{path} has no score head: neither a `vcppo rm` directory (no "
                         f"vcppo_value_model.json) nor a *ForSequenceClassification checkpoint "
                         f"(architectures: {archs or 'none'})")
    labels = config.get("num_labels", len(config.get("id2label") or {}) or 2)
    if labels != 1:
        raise ValueError(f"{path}: a reward model scores with one label, this classifier has {labels} "
                         "(num_labels in config.json)")
    return HF_SEQ_CLS


class PerPositionScore(nn.Module):
    """An HF sequence classifier's backbone and ``score`` head, applied at every position:
    (B, L) scores (fp32), of which the caller reads the one it needs."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        head = getattr(classifier, "score", None)  # the decoder classifiers' name (Llama, Qwen2, Mistral, GPT-2)
        if not isinstance(head, nn.Linear):
            raise ValueError(f"{type(classifier).__name__}: no linear `score` head to apply per position "
                             "(supported: decoder-only *ForSequenceClassification models)")
        self.backbone = classifier.base_model
        self.score = head

    @property
    def config(self):
        return self.backbone.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs) -> torch.Tensor:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False, **kwargs)
        return self.score(out.last_hidden_state).squeeze(-1).float()


def load_score_module(path: str, fmt: str, dtype: torch.dtype) -> nn.Module:
    """A module mapping tokens to (B, L) per-position scores, from a directory of format ``fmt``
    (:func:`reward_model_format`)."""
    if fmt == VCPPO:
        from vcppo.models.value_model import ValueModel
        return ValueModel.from_pretrained(path, dtype=dtype)
    from transformers import AutoModelForSequenceClassification
    return PerPositionScore(AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype))
