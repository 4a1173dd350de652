"""A local character-level tokenizer (no hub download), saved in Hugging Face format.

One token per ASCII character: a byte-level BPE with all 256 byte symbols and NO merges, in the
same pipeline transformers' ``Qwen2Tokenizer`` uses (so ``AutoTokenizer`` on a Qwen2 model dir,
which picks that class, tokenises identically; other text degrades to one token per UTF-8
byte, never to ``<unk>``). ``<think>`` and ``</think>`` are single tokens that are never split;
chat turns are wrapped Qwen-style in ``<|im_start|>role\\n ... <|im_end|>\\n``. As in
Qwen2.5-Instruct, the end-of-sequence token the policy emits to stop is ``<|im_end|>``
(``tokenizer.eos_token``); ``<eos>`` also exists (an end-of-document token, listed with
``<|im_end|>`` in the model's ``generation_config`` so either stops generation). ``<pad>`` pads.

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


# transformers' Qwen2Tokenizer pre-tokenisation regex (models/qwen2/tokenization_qwen2.py).
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
                           r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def byte_vocab() -> list[str]:
    """The 256 byte-level symbols; printable ASCII first (digits, letters, punctuation, ' ',
    '\\n'), so the ids of task text are small and stable."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()  # byte -> unicode symbol mapping used by GPT-2 / Qwen
    mapping = {b: _bytes_to_unicode()[b] for b in range(256)}
    assert set(mapping.values()) == set(alphabet)
    first = [mapping[ord(c)] for c in string.printable if c not in "\r\x0b\x0c"]
    rest = [mapping[b] for b in range(256) if mapping[b] not in first]
    return first + rest


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode symbol table (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) \
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def build_tokenizer(out_dir: str | os.PathLike | None = None):
    """Build the char-level tokenizer; save it to ``out_dir`` (if given) and return it.

    Returns a ``transformers.PreTrainedTokenizerFast``.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # The exact pipeline transformers' Qwen2Tokenizer rebuilds on load (NFC, Qwen split regex,
    # byte-level), with a BPE that has one token per byte and NO merges: so one ASCII character
    # is one token, and the tokenizer behaves the same whether it is loaded as Qwen2Tokenizer
    # (AutoTokenizer does that for a dir whose config.json says model_type=qwen2), as
    # TokenizersBackend, or by vLLM.
    vocab: dict[str, int] = {}
    for t in SPECIAL_TOKENS + ADDED_TOKENS + byte_vocab():
        vocab.setdefault(t, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], dropout=None, unk_token=None,
                               continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
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
