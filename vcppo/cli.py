"""`vcppo <command>`: one entry point; each command lives in its own module with `main(argv)`.

The training commands (train, sft, rm, eval, demo) all read one config schema the same way:
``vcppo <command> [CONFIG] [section.key=value ...]`` (docs/config.md). A config problem is
reported as one line naming the key, with exit code 2, before any engine starts.
"""
from __future__ import annotations

import difflib
import importlib
import sys
import traceback

from vcppo.errors import ConfigError

# command -> (module with a `main(argv: list[str]) -> int | None`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("vcppo.commands.demo", "the CPU demo end to end: data -> SFT -> [RM] -> VC-PPO -> eval -> report"),
    "data": ("vcppo.commands.data", "task data: vcppo data make --task NAME --out FILE; gsm8k/math/... to verl's format: vcppo data prepare"),
    "model": ("vcppo.commands.model", "build a local tokenizer + model of a named size: vcppo model make"),
    "sft": ("vcppo.commands.sft", "cold-start SFT of the policy: vcppo sft [CONFIG] sft.init_model=DIR [k=v ...]"),
    "rm": ("vcppo.commands.rm", "train an outcome reward model (scalar head at the last token): vcppo rm [CONFIG] [k=v ...]"),
    "train": ("vcppo.commands.train", "value pretraining + PPO / GRPO / VAPO: vcppo train CONFIG [k=v ...]"),
    "eval": ("vcppo.commands.evaluate", "pass@1 / pass@k of any HF causal LM: vcppo eval MODEL_DIR DATA [k=v ...]"),
    "plan": ("vcppo.commands.plan", "does a run fit its GPUs, and how long is a step: vcppo plan CONFIG [k=v ...] --gpu h100"),
    "bench": ("vcppo.bench", "benchmarks: vcppo bench NAME [options] (vcppo bench -h lists them)"),
    "report": ("vcppo.commands.report", "markdown + PNG report of one or more run directories"),
    "sweep": ("vcppo.commands.sweep", "expand a sweep file into runs, run them, collect a table"),
}


# The commands that read the config schema: `vcppo <command> [CONFIG] [key=value ...]`.
CONFIG_COMMANDS = ("train", "sft", "rm", "eval", "demo")
# eval also takes the model directory and the data file as arguments (vcppo.commands.evaluate).
EVAL_USAGE = ("usage: vcppo eval MODEL_DIR DATA [section.key=value ...]",
              "       vcppo eval [CONFIG] MODEL_DIR DATA [section.key=value ...]",
              "       vcppo eval [CONFIG] MODEL --benchmark NAMES [section.key=value ...]",
              "       vcppo eval [CONFIG] eval.model_path=DIR eval.data_files=FILE [section.key=value ...]",
              "MODEL_DIR: any Hugging Face causal-LM directory; DATA: .parquet / .jsonl / .json (plain or verl format)",
              "MODEL_DIR / MODEL may also be a run's checkpoint (checkpoints/step_N): its policy is exported first",
              "MODEL: a model directory or a hub id (org/name[@revision])",
              "--benchmark NAMES: standard benchmarks, comma-separated: gsm8k, math500, aime24, aime25 (every prompt,",
              "                   verl's scorers; the files come from the Hugging Face cache, or eval.data_files)")


def usage(prog: str, table: dict[str, tuple[str, str]], heading: str = "commands") -> str:
    width = max(map(len, table))
    lines = [f"usage: {prog} <{heading[:-1]}> [args]", "", f"{heading}:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in table.items()]
    return "\n".join(lines)


def pick(prog: str, table: dict[str, tuple[str, str]], argv: list[str], heading: str = "commands"):
    """``(module, rest of argv)`` of the entry ``argv[0]`` names, or an exit code after printing the
    usage (no argument, -h) or an unknown-name error with the closest name."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(prog, table, heading))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in table:
        close = difflib.get_close_matches(name, table, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"{prog}: unknown {heading[:-1]} '{name}'{hint}\n\n{usage(prog, table, heading)}", file=sys.stderr)
        return 2
    return importlib.import_module(table[name][0]), rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The deepspeed launcher passes --local_rank=N first; the rank is also in the environment.
    argv = [a for a in argv if not a.startswith("--local_rank")]
    name = argv[0] if argv else ""
    if name in CONFIG_COMMANDS and argv[1:2] in (["-h"], ["--help"]):
        usage_line = "\n".join(EVAL_USAGE) if name == "eval" else f"usage: vcppo {name} [CONFIG] [section.key=value ...]"
        print(f"vcppo {name}: {COMMANDS[name][1]}\n\n{usage_line}\n"
              "CONFIG: a shipped preset (vcppo/configs/*.yaml) or a YAML file; every key: docs/config.md")
        return 0
    picked = pick("vcppo", COMMANDS, argv)
    if isinstance(picked, int):
        return picked
    module, rest = picked
    try:
        return int(module.main(rest) or 0)
    except ConfigError as e:
        print(f"vcppo {name}: {e}", file=sys.stderr)
        return 2


def entry() -> None:
    """The ``vcppo`` console script and ``python -m vcppo.cli``: :func:`main`, then an exit that a
    multi-rank run cannot turn into an abort after its work is done (dist.exit_process)."""
    from vcppo.runtime import lifetime
    lifetime.mark_ends_after_command()
    try:
        code = main()
    except Exception as error:
        dist = sys.modules.get("vcppo.runtime.dist")
        hint = dist.peer_loss_hint(error) if dist is not None else None
        if hint is None:
            raise
        traceback.print_exc()
        print(f"[vcppo] {hint}", file=sys.stderr, flush=True)
        dist.exit_process(1)
    dist = sys.modules.get("vcppo.runtime.dist")  # only loaded by commands that start engines
    if dist is None:
        sys.exit(code)
    dist.exit_process(code)


if __name__ == "__main__":
    entry()
