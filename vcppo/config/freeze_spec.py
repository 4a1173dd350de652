"""``critic.freeze``'s grammar: which of the critic's parameters each spec names (no torch: the config
checks read it; :mod:`vcppo.engines.freeze` applies it).

A spec names a group of the value model's parameters by their names (HF decoder models: Qwen2,
Llama, Mistral, GPT-2; LoRA adapters inside a group belong to it):

    attention    every attention block (``self_attn`` / ``attn`` / ``attention``), SAO's
                 frozen-attention critic
    mlp          every MLP block (``mlp`` / ``feed_forward``)
    embeddings   the token (and position) embeddings
    layers:N     the first N decoder layers, whole

The value head (and a confidence head) always trains.
"""
from __future__ import annotations

import re

GROUPS = {
    "attention": re.compile(r"(^|\.)(self_attn|attn|attention)\."),
    "mlp": re.compile(r"(^|\.)(mlp|feed_forward)\."),
    "embeddings": re.compile(r"(^|\.)(embed_tokens|embed_positions|wte|wpe|word_embeddings)\."),
}
LAYER = re.compile(r"(^|\.)(layers|h)\.(\d+)\.")
HEADS = ("value_head.", "confidence_head.")
SYNTAX = "attention, mlp, embeddings or layers:N (the first N decoder layers)"


def parse(spec: str) -> tuple[str, int]:
    """``spec`` -> (group, N): N the layer count of ``layers:N``, else 0. ValueError with the reason."""
    if spec in GROUPS:
        return spec, 0
    name, _, count = spec.partition(":")
    if name == "layers" and count.isdigit() and int(count) > 0:
        return "layers", int(count)
    raise ValueError(f"{spec!r} is not a module group: use {SYNTAX}")


def matches(spec: str, name: str) -> bool:
    """Whether parameter ``name`` (the value model's, any prefix) belongs to ``spec``'s group."""
    group, n = parse(spec)
    if name.startswith(HEADS) or ".value_head." in name:
        return False
    if group != "layers":
        return bool(GROUPS[group].search(name))
    m = LAYER.search(name)
    return m is not None and int(m.group(3)) < n


def unmatched(specs: list[str], names: list[str]) -> str | None:
    """The first spec that matches none of ``names`` (or names more layers than the model has), None
    when each matches some."""
    layers = {int(m.group(3)) for m in map(LAYER.search, names) if m}
    for spec in specs:
        group, n = parse(spec)
        if group == "layers" and n > len(layers):
            return f"{spec!r} asks for {n} layers, the model has {len(layers)}"
        if not any(matches(spec, name) for name in names):
            return f"{spec!r} matches no parameter of the model"
    return None
