"""Value model / reward model: the causal LM's transformer backbone + a scalar head.

On-disk format (shared by the critic and the reward model ``vcppo rm`` trains, so an RM
directory loads as a critic *keeping its head* -- the paper's PPO baseline initialisation):

    <dir>/config.json, model.safetensors   backbone (``AutoModel``), HF format
    <dir>/value_head.safetensors           {"weight": (1, hidden), "bias": (1,)} (+ "confidence.weight"
                                           (1, 3), "confidence.bias" with a confidence head)
    <dir>/vcppo_value_model.json           marker: {"format": "vcppo_value_model", "version": 1, ...}
    tokenizer files                        copied when present in the source

``ValueModel.from_policy`` starts from a causal LM directory (backbone weights only; the LM head
is dropped) with a ZERO-initialised head: every value starts at exactly 0, which is the
unbiased guess for +1/-1 rewards and keeps the first TD errors equal to the rewards instead of
random noise (a random head would add an arbitrary per-token offset that GAE accumulates --
the very value-initialisation bias VC-PPO sec. 4.1 warns about). The head still learns at once:
its gradient is the backbone's hidden state, which is non-zero.
"""
from __future__ import annotations

import json
import os
import shutil

import torch
from torch import nn

MARKER = "vcppo_value_model.json"
HEAD_FILE = "value_head.safetensors"
# the head file's keys -> the ValueModel's parameter names
HEAD_KEYS = {"weight": "value_head.weight", "bias": "value_head.bias",
             "confidence.weight": "confidence_head.weight", "confidence.bias": "confidence_head.bias"}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                    "merges.txt", "chat_template.jinja", "added_tokens.json")


def is_value_model_dir(path: str) -> bool:
    return os.path.exists(os.path.join(path, MARKER))


class FP32Linear(nn.Linear):
    """A linear layer that computes in fp32 whatever its parameters' dtype. Under bf16 training the
    optimizer keeps fp32 master weights, but the module's copy is bf16; a scalar value head computed
    in bf16 would round V(s) to steps of ~0.4% and hand GAE and the value loss bf16 values. Its own
    forward (not a functional call from the parent) so ZeRO-3 gathers its parameters as usual."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        return nn.functional.linear(x.float(), self.weight.float(), bias)


class ValueModel(nn.Module):
    """values = value_head(backbone(input_ids).last_hidden_state).squeeze(-1): (B, L)."""

    def __init__(self, backbone: nn.Module, hidden_size: int | None = None, confidence: bool = False):
        super().__init__()
        self.backbone = backbone
        hidden = hidden_size or backbone.config.hidden_size
        dtype = next(backbone.parameters()).dtype
        self.value_head = FP32Linear(hidden, 1, dtype=dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        # Optional second head on the policy's confidence features (vcppo.algos.confidence), zero at
        # init like the value head, so it starts as the plain critic.
        self.confidence_head = None
        if confidence:
            from vcppo.algos.confidence import N_FEATURES
            self.confidence_head = FP32Linear(N_FEATURES, 1, dtype=dtype)
            nn.init.zeros_(self.confidence_head.weight)
            nn.init.zeros_(self.confidence_head.bias)

    @property
    def config(self):
        return self.backbone.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, confidence=None, **kwargs) -> torch.Tensor:
        """``confidence``: (B, L, 3) features at each position (zeros where no value is read), used
        when the model has a confidence head."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False, **kwargs)
        h = out.last_hidden_state
        values = self.value_head(h).squeeze(-1)  # fp32 (FP32Linear)
        if self.confidence_head is not None:
            if confidence is None:
                raise ValueError("this value model reads confidence features: pass confidence=(B, L, 3)")
            values = values + self.confidence_head(confidence).squeeze(-1)
        return values

    def gradient_checkpointing_enable(self, **kw):
        self.backbone.gradient_checkpointing_enable(**kw)

    # --- construction ----------------------------------------------------------------------
    @classmethod
    def from_policy(cls, policy_dir: str, dtype: torch.dtype = torch.float32, confidence: bool = False) -> "ValueModel":
        """Backbone of a causal LM dir (``AutoModel`` drops the LM head) + zero-init head(s)."""
        from transformers import AutoModel
        backbone = AutoModel.from_pretrained(policy_dir, dtype=dtype)
        return cls(backbone, confidence=confidence)

    @classmethod
    def from_pretrained(cls, path: str, dtype: torch.dtype = torch.float32, confidence: bool = False) -> "ValueModel":
        """A dir written by :meth:`save_pretrained` (critic or reward model), heads included; a
        confidence head it lacks (``confidence=True``, e.g. from a reward model) starts at zero."""
        if not is_value_model_dir(path):
            raise ValueError(f"{path} is not a vcppo value/reward model dir (missing {MARKER}); "
                             "to start from a policy use ValueModel.from_policy")
        from safetensors.torch import load_file
        from transformers import AutoModel
        backbone = AutoModel.from_pretrained(path, dtype=dtype)
        head = load_file(os.path.join(path, HEAD_FILE))
        model = cls(backbone, confidence=confidence or "confidence.weight" in head)
        with torch.no_grad():
            model.value_head.weight.copy_(head["weight"].to(model.value_head.weight.dtype))
            model.value_head.bias.copy_(head["bias"].to(model.value_head.bias.dtype))
            if "confidence.weight" in head:
                model.confidence_head.weight.copy_(head["confidence.weight"].to(model.confidence_head.weight.dtype))
                model.confidence_head.bias.copy_(head["confidence.bias"].to(model.confidence_head.bias.dtype))
        return model

    def save_pretrained(self, path: str, tokenizer_src: str | None = None, extra: dict | None = None,
                        state_dict: dict | None = None) -> None:
        """Write backbone + head + marker. ``state_dict`` (ValueModel names) overrides weights
        (used by the DeepSpeed critic, whose parameters are gathered separately)."""
        save_value_model(self.backbone, path, state_dict=state_dict if state_dict is not None else self.state_dict(),
                         tokenizer_src=tokenizer_src, extra=extra)


def save_value_model(backbone: nn.Module, path: str, state_dict: dict, tokenizer_src: str | None = None,
                     extra: dict | None = None) -> None:
    """Write a ValueModel dir from a full ValueModel-named state dict (``backbone.*``, ``value_head.*``)."""
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    bb = {k[len("backbone."):]: v.detach().cpu().contiguous() for k, v in state_dict.items()
          if k.startswith("backbone.")}
    backbone.save_pretrained(path, state_dict=bb)
    heads = {"weight": state_dict["value_head.weight"], "bias": state_dict["value_head.bias"]}
    if "confidence_head.weight" in state_dict:
        heads.update({"confidence.weight": state_dict["confidence_head.weight"],
                      "confidence.bias": state_dict["confidence_head.bias"]})
    save_file({k: v.detach().cpu().contiguous() for k, v in heads.items()}, os.path.join(path, HEAD_FILE))
    with open(os.path.join(path, MARKER), "w") as f:
        json.dump({"format": "vcppo_value_model", "version": 1, **(extra or {})}, f, indent=1)
    if tokenizer_src:
        for name in _TOKENIZER_FILES:
            p = os.path.join(tokenizer_src, name)
            if os.path.exists(p) and not os.path.exists(os.path.join(path, name)):
                shutil.copy(p, os.path.join(path, name))
