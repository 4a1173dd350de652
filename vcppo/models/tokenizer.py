"""A local character-level tokenizer (no hub download), saved in Hugging Face format.

One token per printable ASCII character (plus newline and tab); ``<think>`` and ``</think>`` are
single tokens that are never split; chat turns are wrapped Qwen-style in
``<|im_start|>role\\n ... <|im_end|>\\n``. As in Qwen2.5-Instruct, the end-of-sequence token the
policy emits to stop is ``<|im_end|>`` (``tokenizer.eos_token``); ``<eos>`` also exists (an
end-of-document token, listed with ``<|im_end|>`` in the model's ``generation_config`` so
either stops generation). ``<pad>`` pads, ``<unk>`` stands for any other character.

Load it anywhere with ``AutoTokenizer.from_pretrained(path)``, exactly like a real checkpoint.
"""
from __future__ import annotations

import os
import string

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SPECIAL_TOKENS = [PAD, EOS, UNK, IM_START, IM_END]  # skipped by decode(skip_special_tokens=True)
ADDED_TOKENS = [THINK_OPEN, THINK_CLOSE]            # never split, kept when decoding

# Qwen-style ChatML. add_generation_prompt opens the assistant turn; the response (which starts
# with <think>) follows and ends with <|im_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def char_vocab() -> list[str]:
    """The base characters, in id order after the special tokens: printable ASCII + \\n + \\t."""
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]  # digits, letters, punct, ' ', \t, \n
    return chars


def build_tokenizer(out_dir: str | os.PathLike | None = None):
    """Build the char-level tokenizer; save it to ``out_dir`` (if given) and return it.

    Returns a ``transformers.PreTrainedTokenizerFast``.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for tok in SPECIAL_TOKENS + ADDED_TOKENS + char_vocab():
        vocab.setdefault(tok, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character is its own pre-token (including spaces and newlines: [\s\S] matches \n too).
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate, no spaces between characters
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=IM_END,
        unk_token=UNK,
        additional_special_tokens=[EOS, IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
        padding_side="left",  # prompts are left-padded for generation
    )
    hf.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        hf.save_pretrained(str(out_dir))
    return hf


def load_tokenizer(path: str | os.PathLike):
    """``AutoTokenizer.from_pretrained(path)`` — works for ours and for a real Qwen2.5 dir."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
