"""`vcppo <command>`: one entry point; each command lives in its own module with `main(argv)`."""
from __future__ import annotations

import importlib
import sys

# command -> (module with a `main(argv: list[str]) -> int | None`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("vcppo.demo", "the CPU demo end to end: data -> SFT -> RM -> VC-PPO -> eval -> report"),
    "data": ("vcppo.data.cli", "make synthetic long-CoT task data: vcppo data make --task NAME --out FILE"),
    "model": ("vcppo.models.cli", "build a local tokenizer + model of a named size: vcppo model make"),
    "sft": ("vcppo.driver.sft", "cold-start SFT of the policy on the task's traces"),
    "rm": ("vcppo.driver.rm", "train an outcome reward model (scalar head at the last token)"),
    "train": ("vcppo.driver.ppo", "value pretraining + PPO / GRPO / VAPO: vcppo train CONFIG [k=v ...]"),
    "eval": ("vcppo.driver.evaluate", "evaluate a policy checkpoint on a split (pass@1, pass@k)"),
    "bench": ("vcppo.bench", "benchmarks: vcppo bench gae [--json PATH]"),
    "report": ("vcppo.report", "markdown + PNG report of one or more run directories"),
    "sweep": ("vcppo.sweep", "expand a sweep file into runs, run them, collect a table"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: vcppo <command> [args]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The deepspeed launcher passes --local_rank=N first; the rank is also in the environment.
    argv = [a for a in argv if not a.startswith("--local_rank")]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        import difflib
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"vcppo: unknown command '{name}'{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
