"""The tree stays readable: no import cycle inside the package, every driver module imports on its
own, driver modules under 300 lines and functions under 60 (docstrings aside), and nothing in
vcppo/ imports tests/."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "vcppo"
DRIVER_MODULES = sorted(".".join(p.relative_to(PKG / "driver").with_suffix("").parts)
                        for p in (PKG / "driver").rglob("*.py") if p.stem != "__init__")
DRIVER_PACKAGES = ("step", "placement", "durability")  # the driver's sub-packages, as docs/architecture.md names them


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``: they name types for annotations and run nothing."""
    return {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and isinstance(block.test, ast.Name)
            and block.test.id == "TYPE_CHECKING" for stmt in block.body for n in ast.walk(stmt)}


def _imports(path: Path, types: bool = True) -> set[str]:
    """vcppo modules imported anywhere in the file (top level or inside functions); ``types`` False:
    without the imports that only name types (under ``if TYPE_CHECKING:``)."""
    out = set()
    tree = ast.parse(path.read_text())
    skip = set() if types else _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vcppo"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("vcppo"))
    return out


def import_graph(types: bool = True) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    return {name: {m for m in _imports(path, types) if m in files and m != name} for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_in_the_package():
    assert find_cycle(import_graph()) is None, find_cycle(import_graph())


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


IMPORT_EACH_ALONE = """
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "vcppo" or m.startswith("vcppo.")]:
        del sys.modules[loaded]  # the package from scratch: only the module's own imports load it
    try:
        importlib.import_module(name)
    except Exception:
        failed[name] = traceback.format_exc()[-2000:]
print(json.dumps(failed))
"""


def test_each_driver_module_imports_on_its_own():
    """Each with none of the package loaded before it (what an import cycle or a missing import
    breaks). One interpreter: third-party libraries stay loaded between modules, the package is
    dropped from sys.modules and imported afresh for each (cheaper than a process per module)."""
    res = subprocess.run([sys.executable, "-c", IMPORT_EACH_ALONE, *(f"vcppo.driver.{m}" for m in DRIVER_MODULES)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    failed = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(DRIVER_MODULES) >= 10 and not failed, failed


def test_driver_modules_and_functions_stay_small():
    too_long = []
    for path in (PKG / "driver").rglob("*.py"):
        lines = path.read_text().splitlines()
        if len(lines) > 300:
            too_long.append(f"{path.relative_to(PKG)}: {len(lines)} lines")
    for path in PKG.rglob("*.py"):  # no module of the package above 450 lines
        n = len(path.read_text().splitlines())
        if n > 450:
            too_long.append(f"{path.relative_to(PKG)}: {n} lines")
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _code_lines(node)
                if n > 60:
                    too_long.append(f"{path.relative_to(PKG)}:{node.name}: {n} lines")
    assert not too_long, too_long


def _code_lines(fn: ast.FunctionDef) -> int:
    """Lines of a function without its docstring (a long notation block is documentation)."""
    first = fn.body[0]
    doc = (first.end_lineno - first.lineno + 1) if (isinstance(first, ast.Expr) and isinstance(
        getattr(first, "value", None), ast.Constant) and isinstance(first.value.value, str)) else 0
    return fn.end_lineno - fn.lineno + 1 - doc


def test_the_package_never_imports_tests():
    offenders = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                 if "tests" in {n.split(".")[0] for n in _plain_imports(p)} or "conftest" in p.read_text()]
    assert not offenders, offenders


def _plain_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


# Layers from the bottom: an import may only point down (pure math never sees an engine, engines
# never see the environments or the driver, the driver never sees the commands built on it).
LAYERS = ["vcppo.algos", "vcppo.engines", "vcppo.envs", "vcppo.driver", "vcppo.commands"]


def test_no_import_points_up_a_layer():
    layer = lambda mod: next((i for i, f in enumerate(LAYERS) if mod == f or mod.startswith(f + ".")), None)  # noqa: E731
    up = [f"{src} -> {dst}" for src, dsts in import_graph().items() for dst in dsts
          if layer(src) is not None and layer(dst) is not None and layer(dst) > layer(src)]
    assert not up, up


def test_methods_are_rows_of_the_table():
    """An estimator or a policy loss is picked through vcppo.methods' rows (their functions), never by a
    branch on its name anywhere in the package: a new method is one function and one row."""
    branch = re.compile(r"(advantage_estimator|policy_loss)\s*(==|!=|in\s*\()|==\s*[\"'](gspo|gae|grpo|rloo)[\"']")
    hits = [f"{p.relative_to(PKG)}: {line.strip()}" for p in PKG.rglob("*.py") if p.name not in ("methods.py",)
            for line in p.read_text().splitlines() if branch.search(line)]
    assert not hits, hits


def test_the_step_reads_the_same_whatever_the_placement():
    """rl_step meets the critic through one protocol (driver/step/critic_side.py): no branch on where the
    critic lives, and no engine class of its own in the step."""
    source = (PKG / "driver" / "step" / "rl_step.py").read_text()
    for placement_word in ("critic_remote", "RemoteCritic", "CriticEngine", "critic_apart", "Placement", "isinstance("):
        assert placement_word not in source, placement_word
    worker = (PKG / "driver" / "placement" / "critic_worker.py").read_text()
    assert "CriticHalf(" in worker and "update_critic" not in worker  # the same half as the local critic's


def test_the_driver_is_its_wiring_and_three_packages():
    """driver/ holds the run's state (state.py), its wiring (context: the run's parts, built and closed;
    engines: the engines they hold), the run (ppo), the phase loops
    (loops.py) and three sub-packages: the step, placement and durability; a new module goes into one of them."""
    top = sorted(p.stem for p in (PKG / "driver").glob("*.py") if p.stem != "__init__")
    packages = sorted(p.name for p in (PKG / "driver").iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert top == ["context", "engines", "loops", "ppo", "state"] and packages == sorted(DRIVER_PACKAGES), (top, packages)
    assert not any(any((PKG / "driver" / pkg).glob("*/__init__.py")) for pkg in DRIVER_PACKAGES)  # one level


def test_the_run_state_is_the_bottom_of_the_driver():
    """Phase and RunState (driver/state.py) import nothing of the driver: every part of it may read them."""
    assert not {m for m in import_graph()["vcppo.driver.state"] if m.startswith("vcppo.")}


# driver/'s internal order, bottom first: the run's state; durability (checkpoint files, resume checks,
# guards); the step; the wiring that builds and closes a run's parts (context, engines); the placements,
# each built on the wiring; the phase loops; the run.
DRIVER_ORDER = [["state"], ["durability"], ["step"], ["context", "engines"], ["placement"], ["loops"],
                ["ppo"]]


def driver_level(module: str) -> int | None:
    if not module.startswith("vcppo.driver."):
        return None
    head = module.split(".")[2]
    return next(i for i, names in enumerate(DRIVER_ORDER) if head in names)


def upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` from a part of driver/ to one above it in DRIVER_ORDER."""
    return [f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts
            if driver_level(src) is not None and driver_level(dst) is not None and driver_level(dst) > driver_level(src)]


def test_nothing_in_the_driver_imports_upward():
    """Each part of driver/ imports only the parts below it in DRIVER_ORDER (a type named for an
    annotation, under ``if TYPE_CHECKING:``, runs nothing and does not count)."""
    assert sorted(n for names in DRIVER_ORDER for n in names) == sorted(
        [p.stem for p in (PKG / "driver").glob("*.py") if p.stem != "__init__"] + list(DRIVER_PACKAGES))
    up = upward(import_graph(types=False))
    assert not up, up


def test_the_order_check_sees_an_upward_import():
    assert upward({"vcppo.driver.step.rl_step": {"vcppo.driver.context"}}) == ["vcppo.driver.step.rl_step -> vcppo.driver.context"]
    assert not upward({"vcppo.driver.context": {"vcppo.driver.step.rl_step", "vcppo.algos.gae"}})
    resume = "vcppo.driver.durability.resume"  # names RunContext under `if TYPE_CHECKING:` only
    assert "vcppo.driver.context" in import_graph(types=True)[resume]
    assert "vcppo.driver.context" not in import_graph(types=False)[resume]


PLACEMENT_READ = re.compile(r"\bcfg\.placement\b|\.placement\.(mode|rollout_ranks|critic_ranks)\b"
                            r"|[!=]=\s*[\"'](split|colocated)[\"']|\bdist\.role\s*(==|!=|in\b)")


def test_placement_is_asked_not_read():
    """Where the parts live is answered by vcppo.config.placement.Placement (built from the config): no
    module reads placement.mode / rollout_ranks / critic_ranks or compares a rank's role itself."""
    allowed = {"config/placement.py", "config/schema.py"}
    hits = [f"{p.relative_to(PKG)}: {line.strip()}" for p in PKG.rglob("*.py")
            if str(p.relative_to(PKG)) not in allowed for line in p.read_text().splitlines()
            if PLACEMENT_READ.search(line.split("#")[0]) and not line.lstrip().startswith(("#", '"', "'"))]
    assert not hits, hits
    for read in ('if cfg.placement.mode == "split":', 'if dist.role != "train":', "pl = cfg.placement"):
        assert PLACEMENT_READ.search(read), read


def test_one_gae_pass_per_step():
    """The step estimates the advantages in one call (``estimate``, whose one GAE pass also gives the
    critic's targets); ``critic_targets`` runs only on the critic's side, for a critic on ranks of its
    own; no other driver module runs a GAE scan (tests/driver/test_methods_table.py counts the calls)."""
    step = PKG / "driver" / "step"
    assert len(re.findall(r"\bestimate\(", (step / "rl_step.py").read_text())) == 1
    calls = {p.name: len(re.findall(r"\bcritic_targets\(", p.read_text())) for p in step.glob("*.py")}
    assert {k: v for k, v in calls.items() if v} == {"advantages.py": 1, "critic_side.py": 1}  # its def, its one call
    scans = [str(p.relative_to(PKG)) for p in (PKG / "driver").rglob("*.py")
             if re.search(r"decoupled_gae\(|estimators\.gae\(", p.read_text())]
    assert scans == ["driver/step/advantages.py"], scans
