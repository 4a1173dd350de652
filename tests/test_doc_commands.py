"""Every command line in README.md and docs/ is one that parses: a `vcppo` line resolves its config
through the CLI's own loader (no engine starts, no path needs to exist), a `deepspeed` / `torchrun`
line goes through that launcher's own argument parser, a launch script or make target exists.
(docs/history.md is a dated log of what ran then, and is not checked.)"""
import re
import shlex
from pathlib import Path

import pytest

from vcppo.cli import COMMANDS, CONFIG_COMMANDS
from vcppo.config.load import load_config, split_command_line

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md"] + sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in ("history.md",))
PROGRAMS = ("vcppo", "deepspeed", "torchrun", "sbatch", "make")


def command_lines(path: Path) -> list[str]:
    """The lines of a doc's shell blocks that run one of our programs (continuations joined,
    comments and leading VAR=value assignments dropped)."""
    out = []
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", path.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            words = line.split()
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                words = words[1:]
            if words and (words[0] in PROGRAMS or re.fullmatch(r"launch/\S+\.sh", words[0])):
                out.append(" ".join(words))
    return out


CASES = [(p.name, line) for p in DOCS for line in command_lines(p)]


def check_vcppo(args: list[str]) -> None:
    """``vcppo <command> ...``: the command exists; a config command's config resolves (the preset,
    every key=value); other commands' flags are ones their module reads."""
    args = [a for a in args if a != "..."]
    name, rest = args[0], args[1:]
    assert name in COMMANDS, f"unknown command {name!r}"
    if name in CONFIG_COMMANDS:
        default = None if name == "train" else ("demo" if name == "demo" else "base")
        if name == "eval":  # MODEL_DIR DATA [key=value ...]: the positional paths need not exist here
            rest = [a for a in rest if "=" in a]
        config, overrides = split_command_line(rest, default)
        load_config(config, overrides)
        return
    module = REPO / (COMMANDS[name][0].replace(".", "/"))
    sources = [p.read_text() for p in ([module.with_suffix(".py")] if module.with_suffix(".py").exists()
                                       else module.glob("*.py"))]
    if name == "bench":
        from vcppo.bench import BENCHMARKS
        assert rest[0] in BENCHMARKS, f"unknown benchmark {rest[0]!r}"
        sources = [(REPO / BENCHMARKS[rest[0]][0].replace(".", "/")).with_suffix(".py").read_text()]
    for flag in (a.split("=")[0] for a in rest if a.startswith("--")):
        assert any(f'"{flag}"' in s for s in sources), f"{flag} is not a flag of vcppo {name}"


def check_line(line: str) -> None:
    words = shlex.split(line.replace("<", "").replace(">", "").replace("[", "").replace("]", ""))
    program, args = words[0], words[1:]
    if program == "vcppo":
        check_vcppo(args)
    elif program == "deepspeed":
        from deepspeed.launcher.runner import parse_args
        parsed = parse_args(args)
        assert parsed.module and parsed.user_script == "vcppo.cli", "run the trainer as --module vcppo.cli"
        check_vcppo(parsed.user_args)
    elif program == "torchrun":
        from torch.distributed.run import get_args_parser
        parsed = get_args_parser().parse_args(args)
        assert parsed.module and parsed.training_script == "vcppo.cli"
        check_vcppo(parsed.training_script_args)
    elif program == "make":
        targets = re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M)
        assert args[0] in targets, f"no make target {args[0]}"
    elif program == "launch/two_nodes.sh":  # up|down|run STATE, or on STATE NODE [env VAR=value ...] COMMAND
        assert args[0] in ("up", "on", "down", "run") and (REPO / program).is_file(), f"not two_nodes.sh: {line}"
        if args[0] == "on":
            command = [w for w in args[3:] if w != "env" and not re.fullmatch(r"[A-Z_]+=\S*", w)]
            check_line(shlex.join(command))
    else:  # a launch script, directly or through sbatch: it exists, and the vcppo part resolves
        script = next(w for w in words if w.startswith("launch/"))
        assert (REPO / script).is_file(), f"no script {script}"
        preset_and_overrides = words[words.index(script) + 1:]
        check_vcppo(["train", *preset_and_overrides])


@pytest.mark.parametrize("doc, line", CASES, ids=[f"{d}:{line[:60]}" for d, line in CASES])
def test_documented_command_parses(doc, line):
    try:
        check_line(line)
    except SystemExit as e:  # an argparse refusal
        pytest.fail(f"{doc}: `{line}` is refused by its parser (exit {e.code})")


def test_the_checker_refuses_what_users_would_hit():
    with pytest.raises(SystemExit):
        check_line("deepspeed --num_gpus 8 -m vcppo.cli train vcppo")  # DeepSpeed's launcher has no -m
    with pytest.raises(Exception, match="actor.lrr"):
        check_line("vcppo train vcppo actor.lrr=1e-6")
    with pytest.raises(AssertionError, match="--fast"):
        check_line("vcppo bench gae --fast")
    assert len(CASES) > 30  # the README and docs hold this many; a regex that finds none fails here
