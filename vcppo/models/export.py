"""Writing a trained policy as a Hugging Face causal-LM directory that vLLM and ``transformers``
load as they load the checkpoint it started from.

``save_causal_lm(state, src, out)`` is what the actor's export (``ActorEngine.export_hf``: the
final policy of a run, ``<run>/final/actor``, and the SFT output) writes on the main rank:

- the weights of ``state`` (full, HF-named tensors) into a model built from ``src``'s config, so
  the exported config (architecture, sizes, ``tie_word_embeddings``, rope, special ids) is the
  source's. With tied embeddings the state has no ``lm_head.weight`` (the gathered parameters hold
  the shared tensor once, as ``model.embed_tokens.weight``) and the head is tied again on load;
  with untied ones (larger Qwen2.5 models) ``lm_head.weight`` is a tensor of its own and must be in
  the state: an untied export without it would write a randomly initialised head. Any other
  missing or unexpected tensor is an error too.
- ``generation_config.json`` of ``src`` when it has one, as it is (its EOS list -- ``<|im_end|>``
  and any other end token, which vLLM stops on -- and sampling defaults), not the one
  ``save_pretrained`` rebuilds from the config, which keeps only ``config.eos_token_id``;
- the tokenizer files of ``src`` (``tokenizer.json``, ``tokenizer_config.json``, the chat
  template, ...), copied byte for byte.

Exporting an exported directory again gives the same files (tests/engines/test_engines.py).
"""
from __future__ import annotations

import os
import shutil

import torch

# Everything a tokenizer (fast or slow, with its chat template) and generation defaults are read
# from; copied as they are when the source has them.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
                   "added_tokens.json", "generation_config.json")


def is_tied(config) -> bool:
    """Whether the LM head shares the input embedding (``tie_word_embeddings``; True when unset,
    transformers' default)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", True))


def check_export_keys(missing: list[str], unexpected: list[str], tied: bool) -> None:
    """Only a tied LM head may be missing from an exported state; nothing may be unexpected."""
    allowed = {"lm_head.weight"} if tied else set()
    bad = [k for k in missing if k not in allowed]
    if bad or unexpected:
        hint = " (untied embeddings: lm_head.weight is a tensor of its own)" if "lm_head.weight" in bad else ""
        raise RuntimeError(f"export: missing {bad}, unexpected {list(unexpected)}{hint}")


def copy_tokenizer_files(src: str, dst: str) -> None:
    """The tokenizer (and generation-config) files of ``src`` into ``dst``, byte for byte; files
    ``dst`` already has are kept."""
    for name in TOKENIZER_FILES:
        p = os.path.join(src, name)
        if os.path.exists(p) and not os.path.exists(os.path.join(dst, name)):
            shutil.copy(p, os.path.join(dst, name))


def save_causal_lm(state: dict[str, torch.Tensor], src: str, out: str, dtype: torch.dtype) -> None:
    """Write ``state`` as an HF causal-LM dir ``out`` with ``src``'s config, generation config and
    tokenizer files (module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    os.makedirs(out, exist_ok=True)
    config = AutoConfig.from_pretrained(src)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    check_export_keys(list(missing), list(unexpected), is_tied(config))
    model.save_pretrained(out)
    generation = os.path.join(src, "generation_config.json")
    if os.path.exists(generation):  # save_pretrained wrote one rebuilt from the config
        shutil.copy(generation, os.path.join(out, "generation_config.json"))
    copy_tokenizer_files(src, out)
