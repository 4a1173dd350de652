"""The tree stays readable: no import cycle inside the package, every import of the package points down
its layers (type-only ones too), every driver module imports on its own, driver modules under 300
lines and functions under 60 (docstrings aside), and nothing in vcppo/ imports tests/. Imports and
names are read from the syntax tree (ast), never from the text."""
import ast
import functools
import json
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
    tree = _tree(path)
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


@functools.lru_cache(maxsize=None)
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
                 if {"tests", "conftest"} & {n.split(".")[0] for n in _plain_imports(p)}]
    assert not offenders, offenders


def _plain_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _py(rel: str) -> Path:
    return PKG / rel


# The package's layers, bottom first: an import may point down or inside its own layer, never up. Every
# package and module of vcppo/ has one (test_every_package_has_a_layer). A layer's members:
#   the package itself and the errors a user reads; pure tensor math, the methods table, the run's
#   records, the stage types; the config (the schema, its rules, what a resume may change); the
#   distributed runtime (process groups, collectives, split's transport); metrics files and the sandbox; rewards and models; data; the engines; the multi-turn environments; the
#   pre-flight (what a command's config needs of this machine); the driver; the CLI's dispatcher; the
#   benches; the planner; report and sweep; the commands.
LAYERS = [
    ["vcppo", "vcppo.errors"],
    ["vcppo.algos", "vcppo.methods", "vcppo.records", "vcppo.experience"],
    ["vcppo.config"],
    ["vcppo.runtime"],
    ["vcppo.tracking", "vcppo.sandbox"],
    ["vcppo.rewards", "vcppo.models"],
    ["vcppo.data"],
    ["vcppo.engines"],
    ["vcppo.envs"],
    ["vcppo.preflight"],
    ["vcppo.driver"],
    ["vcppo.cli"],
    ["vcppo.bench"],
    ["vcppo.plan"],
    ["vcppo.report", "vcppo.sweep"],
    ["vcppo.commands"],
]


def layer(module: str) -> int | None:
    for i, names in enumerate(LAYERS):
        if any(module == n or (n != "vcppo" and module.startswith(n + ".")) for n in names):
            return i
    return None


def up_a_layer(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` from a module to one in a layer above its own (or to one with no layer)."""
    return [f"{src} -> {dst}" for src, dsts in graph.items() for dst in sorted(dsts)
            if layer(src) is not None and (layer(dst) is None or layer(dst) > layer(src))]


def test_every_package_has_a_layer():
    tops = {".".join(("vcppo", *p.relative_to(PKG).with_suffix("").parts[:1])) for p in PKG.glob("*.py")}
    tops |= {f"vcppo.{p.name}" for p in PKG.iterdir() if (p / "__init__.py").exists()}
    tops = {"vcppo" if t == "vcppo.__init__" else t for t in tops} - {"vcppo.__main__"}
    named = [n for names in LAYERS for n in names]
    assert sorted(named) == sorted(tops), (sorted(set(tops) - set(named)), sorted(set(named) - set(tops)))
    assert not [m for m in import_graph() if layer(m) is None and m != "vcppo.__main__"]


def test_no_import_points_up_a_layer():
    """The whole package, imports under ``if TYPE_CHECKING:`` included: a lower layer names nothing of
    a higher one, not even a type (a protocol in the lower layer does that)."""
    up = up_a_layer(import_graph(types=True))
    assert not up, up


def test_the_layer_check_sees_what_the_review_found(tmp_path):
    """Each import the review of the layers found running up (config importing engines, envs, models;
    the driver's type-only imports of its wiring) fails the checks above."""
    found = {"vcppo.config.paths": {"vcppo.engines.lora", "vcppo.models.reward_model", "vcppo.data.hub_sources"},
             "vcppo.config.parallel": {"vcppo.engines.sequence_parallel"},
             "vcppo.config.rules": {"vcppo.envs.base", "vcppo.sandbox.bwrap"},
             "vcppo.config.load": {"vcppo.models.hub"}}
    assert len(up_a_layer(found)) == 7
    assert not up_a_layer({"vcppo.preflight": {"vcppo.engines.lora", "vcppo.config.schema", "vcppo.envs.base"}})
    typed = tmp_path / "rl_step.py"
    typed.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vcppo.driver.context import RunContext\n")
    assert "vcppo.driver.context" in _imports(typed, types=True)  # what import_graph(types=True) reads
    assert upward({"vcppo.driver.step.rl_step": {"vcppo.driver.context"}})


def test_user_errors_are_imported_from_the_bottom():
    """ConfigError and DataError come from vcppo.errors, so a module that only raises one imports no
    layer for it (data and models once imported the config for that alone)."""
    wrong = [f"{p.relative_to(PKG)}:{node.lineno} from {node.module}" for p in PKG.rglob("*.py")
             for node in ast.walk(_tree(p)) if isinstance(node, ast.ImportFrom) and node.module != "vcppo.errors"
             and {a.name for a in node.names} & {"ConfigError", "DataError"}]
    assert not wrong, wrong
    classes = {n.name for n in ast.walk(_tree(_py("errors.py"))) if isinstance(n, ast.ClassDef)}
    assert {"ConfigError", "DataError"} <= classes


METHOD_KEYS = ("advantage_estimator", "policy_loss")
METHOD_TABLES = ("ESTIMATORS", "POLICY_LOSSES")


def _name_of(node: ast.AST) -> str | None:
    """``x`` of a Name ``x``, an attribute ``a.x`` or a call ``x(...)`` / ``a.x(...)``."""
    if isinstance(node, ast.Call):
        node = node.func
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _branches_on(tree: ast.AST, is_key, is_value=lambda n: False, tables: tuple[str, ...] = ()) -> list[int]:
    """Lines where a value ``is_key`` accepts is compared (==, !=, in), matched, or looked up in a dict
    (``d[key]``, ``d.get(key)``) other than ``tables``; or where a constant ``is_value`` accepts (a
    method's or a mode's name) is compared or matched."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(is_key(o) or is_value(o) for o in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif isinstance(node, ast.Match) and (is_key(node.subject) or any(
                is_value(v) for case in node.cases for v in ast.walk(case.pattern))):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and is_key(node.slice) and _name_of(node.value) not in tables:
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and is_key(node.args[0]) and _name_of(node.func.value) not in tables):
            lines.append(node.lineno)
    return lines


def method_branches(tree: ast.AST) -> list[int]:
    """``_branches_on`` a method key (``x.advantage_estimator``, ``x.policy_loss``) or a method's name
    (but "ppo", which is also a phase's name: ``r["phase"] == "ppo"`` picks no method)."""
    from vcppo.driver.state import Phase
    from vcppo.methods import ESTIMATORS, POLICY_LOSSES
    names = (set(ESTIMATORS) | set(POLICY_LOSSES)) - {str(p) for p in Phase}
    return _branches_on(tree, lambda n: isinstance(n, ast.Attribute) and n.attr in METHOD_KEYS,
                        lambda n: isinstance(n, ast.Constant) and n.value in names, METHOD_TABLES)


def test_methods_are_rows_of_the_table():
    """An estimator or a policy loss is picked through vcppo.methods' rows (their functions), never by a
    branch on its name anywhere in the package (a comparison, a match, a dict of its own keyed by it):
    a new method is one function and one row."""
    hits = [f"{p.relative_to(PKG)}:{line}" for p in PKG.rglob("*.py") if p.name != "methods.py"
            for line in method_branches(_tree(p))]
    assert not hits, hits
    for branch in ('if cfg.algorithm.advantage_estimator == "gae": pass', 'x = alg.policy_loss in ("ppo", "gspo")',
                   'f = {"gae": a, "grpo": b}[cfg.algorithm.advantage_estimator]',
                   'f = FNS.get(alg.advantage_estimator)', 'match alg.policy_loss:\n    case "gspo": pass',
                   'if est == "rloo": pass', 'match est:\n    case "grpo": pass'):
        assert method_branches(ast.parse(branch)), branch
    assert not method_branches(ast.parse("row = ESTIMATORS[alg.advantage_estimator]"))
    assert not method_branches(ast.parse('ppo = [r for r in records if r["phase"] == "ppo"]'))


def test_the_step_reads_the_same_whatever_the_placement():
    """rl_step meets the critic through one protocol (driver/step/critic_side.py): no branch on where the
    critic lives, and no engine class of its own in the step."""
    tree = _tree(_py("driver/step/rl_step.py"))
    names = {_name_of(n) for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute))}
    names |= {a.name.rpartition(".")[2] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
              for a in n.names}
    assert not names & {"critic_remote", "RemoteCritic", "CriticEngine", "critic_apart", "Placement", "isinstance"}
    worker = _tree(_py("driver/placement/critic_ranks.py"))
    calls = {_name_of(n) for n in ast.walk(worker) if isinstance(n, ast.Call)}
    assert "CriticHalf" in calls and "update_critic" not in calls  # the same half as the local critic's


def test_the_driver_is_its_wiring_and_three_packages():
    """driver/ holds the run's state (state.py) and the protocols its parts meet (parts.py), its wiring
    (context: the run's parts, built and closed; run_engines: the engines they hold), the run and its
    phase loops (phases.py) and three sub-packages: the step, placement and durability; a new module goes
    into one of them."""
    top = sorted(p.stem for p in (PKG / "driver").glob("*.py") if p.stem != "__init__")
    packages = sorted(p.name for p in (PKG / "driver").iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert top == ["context", "parts", "phases", "run_engines", "state"] and packages == sorted(DRIVER_PACKAGES), \
        (top, packages)
    assert not any(any((PKG / "driver" / pkg).glob("*/__init__.py")) for pkg in DRIVER_PACKAGES)  # one level


def _stems(name: str) -> tuple[str, ...]:
    """A module name's words, each without its plural or verb ending (samples, sampling, sampler: sampl)."""
    out = []
    for word in name.split("_"):
        end = next((e for e in ("ing", "er", "es", "s", "e") if word.endswith(e) and len(word) - len(e) >= 3), "")
        out.append(word[:len(word) - len(end)])
    return tuple(out)


def differ_by_a_suffix(names: list[str]) -> list[tuple[str, str]]:
    """Pairs of ``names`` whose words (``_stems``) are one the other's start: resume / resume_checks,
    samples / sampling, split / split_protocol."""
    return sorted((a, b) for a in names for b in names if a < b and (
        _stems(a)[:len(_stems(b))] == _stems(b) or _stems(b)[:len(_stems(a))] == _stems(a)))


def test_no_two_driver_modules_differ_by_a_suffix():
    """A driver module's name says what it holds: no two names where one is the other plus an ending."""
    names = [m.rpartition(".")[2] for m in DRIVER_MODULES]
    assert not differ_by_a_suffix(names), differ_by_a_suffix(names)
    assert differ_by_a_suffix(["samples", "sampling", "sources", "resume", "resume_checks", "split",
                               "split_protocol", "critic_side", "critic_ranks"]) == [
        ("resume", "resume_checks"), ("samples", "sampling"), ("split", "split_protocol")]


# A driver module named as another module or package of vcppo, and why the name stays.
SHARED_NAMES_KNOWN = {"split": "vcppo/bench/split.py is `vcppo bench split`, the bench of this placement"}


def test_driver_module_names_are_their_own():
    """No basename twice inside driver/, and none that is also another module or a package of vcppo
    (a driver/engines.py beside vcppo/engines/), but the known ones."""
    others = {p.stem for p in PKG.rglob("*.py") if PKG / "driver" not in p.parents} - {"__init__", "__main__"}
    others |= {p.parent.name for p in PKG.rglob("__init__.py") if PKG / "driver" not in p.parents}
    names = [m.rpartition(".")[2] for m in DRIVER_MODULES]
    twice = sorted({n for n in names if names.count(n) > 1})
    shared = sorted(set(names) & others)
    assert not twice and shared == sorted(SHARED_NAMES_KNOWN), (twice, shared)


# What a reader of one step reads beside docs/architecture.md's list: the run's state, the protocols the
# step takes, its timer.
STEP_SUPPORT = {"state.py", "parts.py", "step/timeline.py"}


def one_step_files() -> list[str]:
    """The files docs/architecture.md lists for reading one step (paths under vcppo/driver/)."""
    doc = (PKG.parent / "docs" / "architecture.md").read_text()
    block = doc.split("<!-- one-step files -->", 1)[1].split("<!-- /one-step files -->", 1)[0]
    return [line.split()[0] for line in block.splitlines() if line.strip() and not line.startswith("```")]


def test_one_step_reads_in_eight_files():
    """docs/architecture.md lists at most 8 driver files for one step; each exists, and every driver
    module rl_step imports (type-only ones too) is one of them or the step's support (STEP_SUPPORT)."""
    files = one_step_files()
    assert 1 < len(files) <= 8 and all((PKG / "driver" / f).is_file() for f in files), files
    assert "step/rl_step.py" in files
    imported = {str(Path(*m.split(".")[2:])) + ".py" for m in import_graph(types=True)["vcppo.driver.step.rl_step"]
                if m.startswith("vcppo.driver.") and m in DRIVER_IMPORTABLE}
    assert imported <= set(files) | STEP_SUPPORT, imported - set(files) - STEP_SUPPORT


DRIVER_IMPORTABLE = {f"vcppo.driver.{m}" for m in DRIVER_MODULES}


def test_the_run_state_is_the_bottom_of_the_driver():
    """Phase and RunState (driver/state.py) import nothing of the driver: every part of it may read them;
    the protocols of the run's parts (driver/parts.py) only them."""
    graph = import_graph()
    assert not {m for m in graph["vcppo.driver.state"] if m.startswith("vcppo.driver")}
    assert {m for m in graph["vcppo.driver.parts"] if m.startswith("vcppo.driver")} == {"vcppo.driver.state"}


# driver/'s internal order, bottom first: the run's state and the protocols of its parts; durability
# (checkpoint files, resume checks, guards); the step; the wiring that builds and closes a run's parts
# (context, run_engines); the placements, each built on the wiring; the run and its phase loops.
DRIVER_ORDER = [["state", "parts"], ["durability"], ["step"], ["context", "run_engines"], ["placement"], ["phases"]]


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
    """Each part of driver/ imports only the parts below it in DRIVER_ORDER, a type named for an
    annotation under ``if TYPE_CHECKING:`` included (the step and the checkpoints take the protocols
    of driver/parts.py, not the wiring's classes)."""
    assert sorted(n for names in DRIVER_ORDER for n in names) == sorted(
        [p.stem for p in (PKG / "driver").glob("*.py") if p.stem != "__init__"] + list(DRIVER_PACKAGES))
    up = upward(import_graph(types=True))
    assert not up, up


def test_the_order_check_sees_an_upward_import():
    assert upward({"vcppo.driver.step.rl_step": {"vcppo.driver.context"}}) == ["vcppo.driver.step.rl_step -> vcppo.driver.context"]
    assert upward({"vcppo.driver.durability.resume": {"vcppo.driver.step.sampler"}})
    assert not upward({"vcppo.driver.context": {"vcppo.driver.step.rl_step", "vcppo.algos.gae"}})


PLACEMENT_FIELDS = ("mode", "rollout_ranks", "critic_ranks")
DIST_NAMES = ("dist", "init_run_distributed", "init_distributed")  # what a rank's DistInfo is called
# Known lookups on a rank's role, file -> count: driver/phases.py asks the placement what a rank of each role
# serves (Placement.serves()) and looks its own role up there.
ROLE_LOOKUPS_KNOWN = {"driver/phases.py": 1}


def placement_reads(tree: ast.AST) -> list[int]:
    """Lines that read the placement's config (``cfg.placement``, ``<x>.placement.mode`` / ``rollout_ranks``
    / ``critic_ranks``), compare with a mode's name, or branch on a rank's role (``dist.role`` compared,
    matched or looked up in a dict)."""
    lines = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and (
        (n.attr == "placement" and _name_of(n.value) == "cfg")
        or (n.attr in PLACEMENT_FIELDS and isinstance(n.value, ast.Attribute) and n.value.attr == "placement"))]
    role = lambda n: isinstance(n, ast.Attribute) and n.attr == "role" and _name_of(n.value) in DIST_NAMES  # noqa: E731
    mode = lambda n: isinstance(n, ast.Constant) and n.value in ("split", "colocated")  # noqa: E731
    return lines + _branches_on(tree, role, mode)


def test_placement_is_asked_not_read():
    """Where the parts live is answered by vcppo.config.placement.Placement (built from the config): no
    module reads placement.mode / rollout_ranks / critic_ranks or branches on a rank's role itself."""
    allowed = {"config/placement.py", "config/schema.py"}
    hits = {}
    for p in PKG.rglob("*.py"):
        rel = str(p.relative_to(PKG))
        if rel not in allowed and (lines := placement_reads(_tree(p))):
            hits[rel] = lines
    known = {rel: n for rel, n in ROLE_LOOKUPS_KNOWN.items()}
    assert {rel: len(lines) for rel, lines in hits.items()} == known, hits
    for read in ('if cfg.placement.mode == "split": pass', 'if dist.role != "train": pass', "pl = cfg.placement",
                 "n = self.cfg.placement.critic_ranks", "serve = SERVES.get(init_run_distributed(cfg).role)",
                 "serve = {ROLLOUT: a, CRITIC: b}[ctx.dist.role]", "ok = dist.role in (TRAIN, CRITIC)"):
        assert placement_reads(ast.parse(read)), read
    assert not placement_reads(ast.parse("ok = Placement.of(cfg).samples_on(dist.role)"))


def _calls(tree: ast.AST, name: str) -> int:
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Call) and _name_of(n) == name)


def test_one_gae_pass_per_step():
    """The step estimates the advantages in one call (``estimate``, whose one GAE pass also gives the
    critic's targets); ``critic_targets`` runs only on the critic's side, for a critic on ranks of its
    own; no other driver module runs a GAE scan (tests/driver/test_methods_table.py counts the calls)."""
    step = PKG / "driver" / "step"
    assert _calls(_tree(step / "rl_step.py"), "estimate") == 1
    calls = {p.name: _calls(_tree(p), "critic_targets") for p in step.glob("*.py")}
    assert {k: v for k, v in calls.items() if v} == {"critic_side.py": 1}  # its one call (update.py defines it)
    defined = {p.name for p in step.glob("*.py") for n in ast.walk(_tree(p))
               if isinstance(n, ast.FunctionDef) and n.name == "critic_targets"}
    assert defined == {"update.py"}
    scans = [str(p.relative_to(PKG)) for p in (PKG / "driver").rglob("*.py")
             if _calls(_tree(p), "decoupled_gae") or any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                                          and n.func.attr == "gae" and _name_of(n.func.value) == "estimators"
                                                          for n in ast.walk(_tree(p)))]
    assert scans == ["driver/step/update.py"], scans
