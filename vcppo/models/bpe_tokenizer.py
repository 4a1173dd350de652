"""A byte-level BPE tokenizer trained locally on task data, shaped like Qwen2.5's.

Real checkpoints (Qwen2.5 and most of what verl users train) use a byte-level BPE: the text is
split with Qwen2's pre-tokenisation regex, mapped to byte symbols, and merged. Unlike vcppo's
char-level tokenizer (:mod:`vcppo.models.tokenizer`), where every character and ``</think>`` are
one token each, here strings a trainer must find (``</think>``, stop strings) span several tokens,
and a token may hold several characters. This module builds such a tokenizer with ``tokenizers``'
BPE trainer, from the task's prompts and solutions, without any download:

- special tokens ``<|endoftext|>`` (padding, as in Qwen2.5), ``<|im_start|>``, ``<|im_end|>``
  (the end-of-turn token the policy emits: ``eos_token``);
- a Qwen2.5-style ChatML template, with Qwen2.5's rule of a default system turn when the messages
  have none;
- ``<think>`` / ``</think>``: plain text by default (Qwen2.5's situation: the regex splits
  ``</think>`` into ``</``, ``think``, ``>``, so it is never one token), or, with
  ``think_as_added_tokens``, added tokens that are never split (the situation of models trained
  with them, e.g. QwQ / DeepSeek-R1 distills).
"""
from __future__ import annotations

import os
from typing import Iterable

from vcppo.models.tokenizer import QWEN2_PRETOKENIZE_REGEX, THINK_CLOSE, THINK_OPEN

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
DEFAULT_SYSTEM = "You are a helpful assistant."

# Qwen2.5-Instruct's template without its tool-calling branches.
QWEN25_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def _pipeline():
    """An empty BPE with Qwen2's normaliser, pre-tokeniser and decoder (what transformers'
    Qwen2Tokenizer rebuilds on load, so it tokenises identically when loaded from a model dir)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))  # 256 byte symbols cover any text
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike | None = None, vocab_size: int = 512,
                        think_as_added_tokens: bool = False):
    """Train on ``texts`` (e.g. the task's prompts and solutions); save to ``out_dir`` if given.

    Returns a ``transformers.PreTrainedTokenizerFast`` (eos ``<|im_end|>``, pad ``<|endoftext|>``,
    left padding, the Qwen2.5-style chat template).
    """
    from tokenizers import AddedToken, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = _pipeline()
    specials = [END_OF_TEXT, IM_START, IM_END]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    if think_as_added_tokens:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_OPEN, THINK_CLOSE)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=END_OF_TEXT,
                                 additional_special_tokens=[IM_START], clean_up_tokenization_spaces=False,
                                 model_max_length=1 << 20, padding_side="left")
    hf.chat_template = QWEN25_CHAT_TEMPLATE
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        hf.save_pretrained(str(out_dir))
    return hf


def task_corpus(rows: Iterable[dict]) -> list[str]:
    """The texts to train on: each row's prompt and solution, and the chat-template scaffolding."""
    texts = [f"system\n{DEFAULT_SYSTEM}\nuser\nassistant\n"]  # the template's words (special tokens aside)
    for row in rows:
        texts += [row["prompt"], row["solution"]]
    return texts
