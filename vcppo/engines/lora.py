"""LoRA adapters on a DeepSpeed engine's model (Hu et al. 2021, "LoRA"), through ``peft``.

A targeted linear layer computes ``W x + s B A x`` with ``W`` (out, in) frozen, ``A`` (r, in),
``B`` (out, r) trained and ``s = alpha / r``. ``B`` starts at zero, so a model with fresh adapters is
the model without them. What leaves the engine is the plain model's view:

* :func:`merge_adapters` turns the engine's gathered parameters (peft's names) into HF-named full
  weights with ``W' = W + s B A`` -- what vLLM loads after an update and what the export writes;
* :func:`adapters_disabled` runs the base model (``W x``): the frozen reference policy without a
  second copy of the weights;
* :func:`save_adapter` writes peft's adapter-only directory (``adapter_config.json`` +
  ``adapter_model.safetensors``), which ``peft.PeftModel.from_pretrained`` and vLLM's LoRA load.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Iterable, Iterator

import torch

from vcppo.config.schema import LoRAConfig

ADAPTER = "default"  # peft's name of the one adapter a model gets here
_PEFT_PREFIX = "base_model.model."
_BASE = ".base_layer"
_A, _B = f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight"


def enabled(lora: LoRAConfig | None) -> bool:
    return lora is not None and lora.rank > 0


def peft_config(lora: LoRAConfig, task_type: str | None = None):
    """peft's ``LoraConfig`` of ours (``target_modules`` [all-linear] is peft's 'all-linear')."""
    from peft import LoraConfig

    targets = list(lora.target_modules)
    return LoraConfig(r=int(lora.rank), lora_alpha=float(lora.alpha), lora_dropout=float(lora.dropout),
                      target_modules="all-linear" if targets == ["all-linear"] else targets,
                      bias="none", task_type=task_type)


def add_adapters(model: torch.nn.Module, lora: LoRAConfig, task_type: str | None = None) -> torch.nn.Module:
    """``model`` wrapped in a ``peft.PeftModel`` with fresh adapters; its own weights frozen.

    A's random start is drawn from the process's seed (``torch.initial_seed()``: the run's
    ``trainer.seed``), whatever was drawn before: every rank starts from the same adapters (ZeRO-3
    partitions each rank's own copy) and a run repeats exactly, with or without vLLM beside it."""
    from peft import get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch.initial_seed())
        return get_peft_model(model, peft_config(lora, task_type))


def peft_model_in(module: torch.nn.Module):
    """The ``PeftModel`` in ``module`` (itself, or a value model's backbone), or None."""
    from peft import PeftModel

    for candidate in (module, getattr(module, "backbone", None)):
        if isinstance(candidate, PeftModel):
            return candidate
    return None


def hf_name(name: str) -> str:
    """A peft parameter name -> the plain model's (``base_model.model.`` and ``.base_layer`` dropped)."""
    return name.replace(_PEFT_PREFIX, "").replace(_BASE + ".", ".")


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_scalings(module: torch.nn.Module, strip=lambda n: n) -> dict[str, float]:
    """{the layer's name (as ``strip`` makes parameter names): s = alpha / r} of every LoRA layer."""
    from peft.tuners.lora import LoraLayer

    return {strip(name): float(layer.scaling[ADAPTER]) for name, layer in module.named_modules()
            if isinstance(layer, LoraLayer) and ADAPTER in layer.scaling}


def merge_adapters(named: Iterable[tuple[str, torch.Tensor]],
                   scalings: dict[str, float]) -> Iterator[tuple[str, torch.Tensor]]:
    """A stream of full parameters with peft's names -> the plain model's, adapters merged.

    A LoRA layer ``L`` contributes ``L.base_layer.weight`` W (out, in), ``L.lora_A.default.weight``
    A (r, in) and ``L.lora_B.default.weight`` B (out, r), in any order and across buckets; it comes
    out once, as ``L.weight`` = W + s B A in W's dtype (the product in fp32). Every other tensor
    passes through renamed.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in named:
        for suffix, part in ((_BASE + ".weight", "W"), (_A, "A"), (_B, "B")):
            if name.endswith(suffix) and name[:-len(suffix)] in scalings:
                layer = name[:-len(suffix)]
                parts = pending.setdefault(layer, {})
                parts[part] = t
                if len(parts) == 3:
                    del pending[layer]
                    yield hf_name(layer) + ".weight", merged_weight(parts["W"], parts["A"], parts["B"],
                                                                  scalings[layer])
                break
        else:
            yield hf_name(name), t
    if pending:
        raise ValueError(f"LoRA layers left incomplete by the parameter stream: {sorted(pending)[:3]}")


def merged_weight(W: torch.Tensor, A: torch.Tensor, B: torch.Tensor, scaling: float) -> torch.Tensor:
    """W (out, in) + scaling * B (out, r) @ A (r, in), computed in fp32, returned in W's dtype."""
    return (W.float() + scaling * (B.float() @ A.float())).to(W.dtype)


def adapters_disabled(module: torch.nn.Module):
    """Context: ``module`` computes with its base weights only (a no-op without adapters)."""
    peft_model = peft_model_in(module)
    return peft_model.disable_adapter() if peft_model is not None else nullcontext()


@contextmanager
def _quiet_peft_save():
    """peft's save looks the base model up on the hub to compare embeddings; nothing is on a hub here."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def save_adapter(module: torch.nn.Module, adapter_state: dict[str, torch.Tensor], directory: str,
                 base_model_path: str) -> None:
    """peft's adapter-only directory for ``module``'s adapters (``adapter_state``: the gathered
    adapter tensors, peft's names), with ``base_model_name_or_path`` = ``base_model_path``."""
    peft_model = peft_model_in(module)
    if peft_model is None:
        raise ValueError("this model has no LoRA adapters to save")
    cfg = peft_model.peft_config[ADAPTER]
    old_base = cfg.base_model_name_or_path
    cfg.base_model_name_or_path = base_model_path
    try:
        with _quiet_peft_save():
            peft_model.save_pretrained(directory, state_dict=adapter_state, save_embedding_layers=False)
    finally:
        cfg.base_model_name_or_path = old_base


# -------------------------------------------------------------------------------------------------
# Checks before any engine starts

def linear_layer_shapes(model_dir: str, causal_lm: bool) -> tuple[dict[str, tuple[int, int]], set[str]]:
    """({name: (in_features, out_features)} of the model's linear layers, names of its other
    modules), read from its config alone (built on the meta device: no weights loaded).
    ``causal_lm``: the policy (LM head included), else the backbone a value model adapts."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = (AutoModelForCausalLM if causal_lm else AutoModel).from_config(config)
    linear = {n: (m.in_features, m.out_features) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return linear, {n for n, _ in model.named_modules() if n and n not in linear}


def target_problem(lora: LoRAConfig, linear: dict[str, tuple[int, int]], others: set[str]) -> str | None:
    """Why adapters of ``lora`` cannot go on a model with these layers (None: they can). A target
    matches a module whose name is it or ends with '.' + it (peft's rule for a list of names)."""
    targets = list(lora.target_modules)
    if not targets:
        return "target_modules is empty (use [all-linear] for every linear layer)"
    if targets == ["all-linear"]:
        chosen = {n: s for n, s in linear.items() if n.rsplit(".", 1)[-1] != "lm_head"}
    else:
        def hits(names, t):
            return [n for n in names if n == t or n.endswith("." + t)]
        for t in targets:
            if t == "lm_head":
                return "target 'lm_head': the LM head gets no adapter (often tied to the embedding)"
            if not hits(linear, t):
                kind = f"'{t}' is not a linear layer" if hits(others, t) else f"no layer is named '{t}'"
                names = sorted({n.rsplit(".", 1)[-1] for n in linear} - {"lm_head"})
                return f"{kind}; the model's linear layers: {names}"
        chosen = {n: s for n, s in linear.items() if any(n == t or n.endswith("." + t) for t in targets)}
    narrow = min(chosen.items(), key=lambda kv: min(kv[1]), default=None)
    if narrow is not None and lora.rank > min(narrow[1]):
        return (f"rank {lora.rank} exceeds the width of layer '{narrow[0]}' ({min(narrow[1])}: in {narrow[1][0]}, "
                f"out {narrow[1][1]}); a rank above it adds no capacity")
    return None
