"""The house's rules, measured on its sources: the import graph (function-local imports included) has
no circle and no arrow from a lower layer to a higher one; a backend's name is spelled by its own module
only; no package module and no file under tests/ outgrows 500 lines; data/ holds data
and provenance only; experiments/ imports nothing of the package and scripts/ none of its private names;
no run id is pinned in the package; the rooms that meet it spell no list of axis names (the axis table does)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest

from dsa_lab.axes import NAMES as AXIS_NAMES
from dsa_lab.kernels import backend_names, get_backend

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dsa_lab"
TESTS = REPO / "tests"
# The layer order, lowest first: a module may import its own layer and those below, never one above.
LAYERS = (
    ("foundation", ("dsa_lab.errors", "dsa_lab.paths", "dsa_lab.markup")),
    ("cache", ("dsa_lab.batch", "dsa_lab.batch.cache")),  # batch/: the step as data, its files in this order
    ("workload", ("dsa_lab.batch.workload",)),
    ("acceptance", ("dsa_lab.batch.acceptance",)),
    ("metadata", ("dsa_lab.batch.metadata",)),
    ("plan", ("dsa_lab.batch.plan",)),
    ("kernels", ("dsa_lab.kernels",)),
    ("top-k", ("dsa_lab.topk",)),
    ("decode", ("dsa_lab.decode", "dsa_lab.invariance")),
    ("policy", ("dsa_lab.policy",)),
    ("axes", ("dsa_lab.axes",)),
    ("model", ("dsa_lab.model",)),
    ("environment", ("dsa_lab.env_info",)),
    ("store", ("dsa_lab.store",)),
    ("harness", ("dsa_lab.bench",)),
    ("profiling", ("dsa_lab.profiling",)),
    ("analysis", ("dsa_lab.analysis",)),
    ("plots", ("dsa_lab.plots",)),
    ("notebook", ("dsa_lab.notebook",)),
    ("explorers", ("dsa_lab.explorers",)),
    ("studies", ("dsa_lab.studies",)),
    ("report", ("dsa_lab.report",)),
    (
        "commands",
        (
            "dsa_lab.cli",
            "dsa_lab.profiling.__main__",
            "dsa_lab.policy.cli",
            "dsa_lab.model.cli",
            "dsa_lab.profiling.cli",
            "dsa_lab.report.cli",
        ),
    ),
)
MAX_LINES = 500
# Issue 30's rules, held in every room ("": the ground floor's modules): no module over 450 lines, and no list of
# 3 or more axis names but the axis table's own (axes.py).
ROOMS_HELD = (
    "batch",
    "bench",
    "store",
    "kernels",
    "profiling",
    "model",
    "policy",
    "analysis",
    "plots",
    "notebook",
    "explorers",
    "studies",
    "report",
    "",
)
ROOM_MAX_LINES = 450
AXIS_LIST_MIN = 3
# The kernels/ modules (or family folders, gluon/) that define a registered backend: importing one names it.
BACKEND_MODULES = {
    parts[2]
    for parts in (type(get_backend(name)).__module__.split(".") for name in backend_names())
    if parts[:2] == ["dsa_lab", "kernels"]
}
MAX_CELL_LINES = 12
CODE_SUFFIXES = {".py", ".sh", ".diff", ".patch", ".ipynb", ".c", ".cu", ".cpp", ".h"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package modules `name` imports anywhere in its source (function-local imports included)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target.startswith("dsa_lab") and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(name: str) -> int:
    matches = [
        (len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes if name == p or name.startswith(p + ".")
    ]
    if name == "dsa_lab":
        return 0
    assert matches, f"{name}: in no layer of LAYERS (declare it)"
    return max(matches)[1]


def test_every_module_has_a_layer_and_imports_nothing_above_it() -> None:
    for name in MODULES:  # one that imports nothing of the package is declared too
        layer(name)
    upward = [
        f"{a} ({LAYERS[layer(a)][0]}) -> {b} ({LAYERS[layer(b)][0]})"
        for a, targets in GRAPH.items()
        for b in targets
        if layer(b) > layer(a)
    ]
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(sorted(upward))


def test_the_import_graph_has_no_circle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in GRAPH:
        if name not in index:
            visit(name)
    assert not circles, f"import circles: {circles}"


def _spellings(path: Path) -> list[str]:
    """String literals naming a registered backend (exactly, or quoted inside a longer string; docstrings
    aside), and imports of a backend's own module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    names = set(backend_names())
    quoted = re.compile("['\"`](" + "|".join(map(re.escape, names)) + ")['\"`]")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value.strip() in names or quoted.search(node.value):
                found.append(f"line {node.lineno}: {node.value[:40]!r}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            named = [parts[2]] if parts[:2] == ["dsa_lab", "kernels"] and len(parts) > 2 else []
            named += [a.name for a in node.names] if node.module == "dsa_lab.kernels" else []
            found += [f"line {node.lineno}: imports {n}" for n in named if n in BACKEND_MODULES]
    return found


def test_a_backend_is_named_by_its_own_module_only() -> None:
    """Outside kernels/ nothing spells a backend: every layer reads the descriptor, the model's fits too."""
    spelled = {
        str(path.relative_to(REPO)): hits
        for path in PACKAGE.rglob("*.py")
        if PACKAGE / "kernels" not in path.parents and (hits := _spellings(path))
    }
    assert not spelled, spelled


def test_no_package_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, long


def test_no_file_under_tests_is_over_500_lines() -> None:
    """Issue 30 item 7: a test file that grows is split by what it tests (its shared helpers in a conftest or a
    *_support module), as a package module is."""
    long = {
        str(path.relative_to(TESTS)): n
        for path in TESTS.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and (n := len(path.read_text(encoding="utf-8", errors="replace").splitlines())) > MAX_LINES
    }
    assert not long, long


def _held_modules() -> list[Path]:
    """The modules of `ROOMS_HELD`."""
    return [path for room in ROOMS_HELD for path in ((PACKAGE / room).rglob("*.py") if room else PACKAGE.glob("*.py"))]


def test_no_module_of_the_rooms_that_meet_it_is_over_450_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in _held_modules()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > ROOM_MAX_LINES
    }
    assert not long, long


def test_no_notebook_code_cell_is_over_12_lines_but_the_parameters() -> None:
    """A cell reads get -> draw -> note (issue 17); the parameters cell is papermill's list of knobs."""
    long = []
    for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        code = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
        for index, cell in enumerate(code):
            tags = cell.get("metadata", {}).get("tags", [])
            if "parameters" not in tags and (n := len("".join(cell["source"]).splitlines())) > MAX_CELL_LINES:
                long.append(f"{path.name} code cell {index}: {n} lines")
    assert not long, long


def test_data_holds_data_and_provenance_only() -> None:
    tracked = subprocess.run(["git", "ls-files", "data"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    code = [path for path in tracked if Path(path).suffix in CODE_SUFFIXES]
    assert not code, f"code under data/ (experiments/<name>/ holds it): {code[:5]}"


def test_no_run_id_is_pinned_in_the_package() -> None:
    run_id = re.compile(r"\b[a-z0-9]+(?:-[a-z0-9]+)*-20\d{6}(?:T\d{6}Z)?\b")
    pinned = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()[:80]}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if run_id.search(line)
    ]
    assert not pinned, "run ids belong to the notebooks' parameters and the tests:\n" + "\n".join(pinned)


def _package_names(path: Path) -> list[str]:
    """Every dsa_lab name a file reaches: a Python file's imports (module and names), a shell script's
    dotted `dsa_lab.x.y` (a `python -m` module, an import inside `python -c`)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".py":
        imported = re.findall(r"from (dsa_lab[\w.]*) import ([\w, ]+)", text)
        return re.findall(r"\bdsa_lab(?:\.\w+)+", text) + [
            f"{m}.{n.strip()}" for m, ns in imported for n in ns.split(",")
        ]
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "dsa_lab"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dsa_lab":
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def test_experiments_import_nothing_and_scripts_no_private_name() -> None:
    """experiments/ keeps data, provenance and diffs against a named commit: no Python file of it imports
    the package (its shell scripts name the commands they ran); nothing there or under scripts/ reaches a
    private name, which the package may change under it."""
    imports, private = [], []
    for folder in ("experiments", "scripts"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".py", ".sh") or not path.is_file():
                continue
            names = _package_names(path)
            where = str(path.relative_to(REPO))
            if folder == "experiments" and path.suffix == ".py" and names:
                imports.append(f"{where}: {names}")
            private += [f"{where}: {n}" for n in names if any(part.startswith("_") for part in n.split("."))]
    assert not imports, f"experiments/ imports the package (keep a diff against its commit instead): {imports}"
    assert not private, f"private names reached from experiments/ or scripts/: {private}"


def _axis_lists(path: Path) -> list[str]:
    """Tuple, list and set literals of `path` holding `AXIS_LIST_MIN` or more axis names as strings."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            spelled = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in AXIS_NAMES]
            if len(spelled) >= AXIS_LIST_MIN:
                found.append(f"line {node.lineno}: {spelled}")
    return found


def test_no_module_of_the_rooms_that_meet_it_spells_a_list_of_axis_names() -> None:
    """Group keys, column selections and CLI orders derive from `axes.AXES` (its roles, `POINT_KEYS`,
    `SERIES_KEYS`...), so an axis added later is in every one of them; a hand-written list would miss it."""
    paths = [path for path in _held_modules() if path != PACKAGE / "axes.py"]
    assert len(paths) > 40
    spelled = {str(path.relative_to(REPO)): hits for path in paths if (hits := _axis_lists(path))}
    assert not spelled, spelled
