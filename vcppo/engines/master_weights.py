"""fp32 master weights taken from the checkpoint's own fp32 values when a module trains in bf16 / fp16.

DeepSpeed makes a half-precision module's fp32 master copy from the module's half-precision weights,
so every master starts exactly on the bf16 grid. The forward runs round-to-nearest(master): an
element's bf16 weight stays where it was until its master has moved half a bf16 step (2^-9 of its
magnitude), and AdamW moves a master by about the lr a step, so at lr 5e-6 a weight of 0.05 needs
~24 same-signed steps before the policy sees any change, and most steps are lost (measured with
`vcppo bench precision`: docs/performance.md, "Does bf16 train as far as fp32?").

Masters set from the checkpoint's fp32 values sit off the grid: the bf16 weights already are their
rounding (nothing changes at step 0), and every later rounding is unbiased, so
the bf16 module follows its masters as autocast's casts follow fp32 weights. A checkpoint stored in
bf16 has no more precision to give; its tensors are left as they are.
"""
from __future__ import annotations

import glob
import os

import torch

_PREFIXES = ("module.", "_orig_mod.", "base_model.model.", "backbone.", "model.")


def canonical_name(name: str) -> str:
    """A parameter's name with its wrappers' prefixes (DeepSpeed, compile, peft, a value model's
    backbone, a causal LM's ``model.``) and peft's ``.base_layer`` removed: the same string for
    the module's parameter and the checkpoint's tensor."""
    changed = True
    while changed:
        changed = False
        for pre in _PREFIXES:
            if name.startswith(pre):
                name, changed = name[len(pre):], True
    return name.replace(".base_layer.", ".")


def _full_shape(p: torch.nn.Parameter) -> tuple[int, ...]:
    return tuple(p.ds_shape) if hasattr(p, "ds_shape") else tuple(p.shape)


def _unfused_masters(optimizer) -> dict[int, torch.Tensor]:
    """{id(module parameter): its fp32 copy} of DeepSpeed's unfused wrapper (no ZeRO); {} otherwise."""
    by_param = {}
    for low, high in zip(getattr(optimizer, "fp16_groups", []) or [], getattr(optimizer, "fp32_groups", []) or []):
        if isinstance(low, (list, tuple)) and isinstance(high, (list, tuple)):
            by_param.update({id(p): m for p, m in zip(low, high) if m.shape == p.shape})
    return by_param


def _setter(optimizer):
    """``set(param, fp32 full tensor)`` for DeepSpeed's optimizer wrappers: ZeRO 1-3 and the bf16
    optimizer link each parameter to its fp32 partition (``deepspeed.utils.safe_set_full_fp32_param``);
    without ZeRO the unfused wrapper keeps per-parameter fp32 copies beside the module's."""
    from deepspeed.utils import safe_set_full_fp32_param
    by_param = _unfused_masters(optimizer)

    def set_master(p: torch.nn.Parameter, value: torch.Tensor) -> bool:
        if hasattr(p, "ds_id") or hasattr(p, "_hp_mapping"):
            safe_set_full_fp32_param(p, value.to(p.device))
            return True
        master = by_param.get(id(p))
        if master is None:
            return False
        master.data.copy_(value.to(master.device, master.dtype))
        return True
    return set_master


def masters_from_checkpoint(module: torch.nn.Module, optimizer, source_dir: str | None) -> int:
    """Set the fp32 master of every trainable parameter of ``module`` that ``source_dir``'s
    safetensors hold in fp32 (same shape) to that value. Call right after ``deepspeed.initialize``
    (before any step or checkpoint load). Returns how many parameters were set (0 when the module
    is fp32, the checkpoint is half precision, or it is not a safetensors directory)."""
    first = next((p for p in module.parameters()), None)
    if first is None or first.dtype == torch.float32 or not source_dir or not os.path.isdir(source_dir):
        return 0
    from safetensors import safe_open
    files = sorted(glob.glob(os.path.join(source_dir, "*.safetensors")))
    handles = [safe_open(f, framework="pt") for f in files]
    from vcppo.models.value_model import HEAD_FILE, HEAD_KEYS
    where = {}
    for f, h in zip(files, handles):
        head = os.path.basename(f) == HEAD_FILE  # a value model's heads, saved beside its backbone
        for key in h.keys():
            where.setdefault(canonical_name(HEAD_KEYS.get(key, key) if head else key), (h, key))
    set_master = _setter(optimizer)
    n = 0
    for name, p in module.named_parameters():
        hit = where.get(canonical_name(name)) if p.requires_grad else None
        if hit is None:
            continue
        h, key = hit
        if h.get_slice(key).get_dtype() != "F32":
            continue
        value = h.get_tensor(key)
        if tuple(value.shape) == _full_shape(p) and set_master(p, value):
            n += 1
    return n


def full_masters(module: torch.nn.Module, optimizer) -> dict[str, torch.Tensor]:
    """{parameter name: its whole fp32 master on the CPU} of every trainable parameter that has one
    (collective under ZeRO-3: every rank calls it, in the same order). Exports that a later run
    trains on (the value-pretraining cache) write these, so that run's masters continue where
    these stopped instead of from their bf16 rounding."""
    from deepspeed.utils import safe_get_full_fp32_param
    by_param = _unfused_masters(optimizer)
    out = {}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        m = by_param.get(id(p))
        if m is None and (hasattr(p, "ds_id") or hasattr(p, "_hp_mapping")):
            m = safe_get_full_fp32_param(p)
        if m is not None:
            out[name] = m.detach().float().cpu().clone()
    return out
