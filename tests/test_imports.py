"""No import cycle inside labkit, and ``import labkit`` loads nothing but the package itself.

The graph is built statically: every module under labkit/ is parsed with :mod:`ast` and every
``import labkit.x``, ``from labkit.x import y``, ``from labkit import x`` and relative import in it
counts, at module level and inside functions alike (a lazy import inside a function only hides a
cycle until that function runs). Imports under ``if TYPE_CHECKING:`` never run and are skipped, and so
is ``importlib.import_module(...)``, which the exercise registry uses to load its modules on demand.
"""

from __future__ import annotations

import ast
import graphlib
import itertools
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import labkit

Graph = dict[str, set[str]]


def package_modules(name: str, path: Path) -> dict[str, tuple[Path, bool]]:
    """Every module of package ``name`` (folder ``path``), subpackages too: {module: (file, is package)}.

    Walks the folders with :func:`pkgutil.iter_modules` (as :func:`pkgutil.walk_packages` does) but imports
    nothing: walk_packages imports every subpackage to find its children, which would run the code under test.
    """
    out = {name: (path / "__init__.py", True)}
    for info in pkgutil.iter_modules([str(path)]):
        full = f"{name}.{info.name}"
        if info.ispkg:
            out.update(package_modules(full, path / info.name))
        else:
            out[full] = (path / f"{info.name}.py", False)
    return out


def _type_checking_imports(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = getattr(test, "id", None) or getattr(test, "attr", "")  # X or typing.X
            if name == "TYPE_CHECKING":
                skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports_of(module: str, file: Path, is_pkg: bool, known: set[str], root: str) -> set[str]:
    """The modules of ``known`` (inside package ``root``) that ``module`` imports, anywhere in its code."""
    tree = ast.parse(file.read_text(), filename=str(file))
    skip = _type_checking_imports(tree)
    found: set[str] = set()

    def add(target: str) -> None:
        # the deepest known module that the dotted name names (labkit.x.y where y is a function -> labkit.x)
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target:
            found.add(target)

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == root or alias.name.startswith(root + "."):
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_pkg else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            if not (source == root or source.startswith(root + ".")):
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                add(sub if sub in known else source)  # `from labkit import x` imports the module labkit.x
    found.discard(module)
    return found


def import_graph(name: str, path: Path) -> Graph:
    """{module: the modules of the same package it imports} for package ``name`` in folder ``path``."""
    mods = package_modules(name, path)
    return {m: imports_of(m, f, is_pkg, set(mods), name) for m, (f, is_pkg) in mods.items()}


def find_cycle(graph: Graph) -> list[str] | None:
    """One import cycle of ``graph`` as [a, b, ..., a], or None when there is none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        cycle = list(exc.args[1])
        return cycle[::-1]  # graphlib lists it against the edges; a imports b imports ... imports a
    return None


LABKIT = Path(labkit.__file__).resolve().parent
GRAPH = import_graph("labkit", LABKIT)


def test_the_walk_sees_every_module():
    files = {p for p in LABKIT.rglob("*.py")}
    assert {f for f, _ in package_modules("labkit", LABKIT).values()} == files
    assert {"labkit.check", "labkit.exercises", "labkit.exercises.nb12", "labkit.recipes.ddp"} <= set(GRAPH)
    # function-level imports count: check.evaluate's registry lookup is one
    assert "labkit.exercises" in GRAPH["labkit.check"]


def test_no_import_cycle_in_labkit():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_exercises_never_import_check():
    offenders = sorted(m for m, deps in GRAPH.items()
                       if m.startswith("labkit.exercises") and "labkit.check" in deps)
    assert not offenders, f"{offenders} import labkit.check; use Exercise and graders from labkit.exercises"


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_graph_builder_finds_cycles(tmp_path: Path):
    """A synthetic package: every import form resolves, and both a direct and a lazy cycle are caught."""
    pkg = tmp_path / "fake"
    _write(pkg, {
        "__init__.py": "import importlib\nVERSION = 1\n",
        "a.py": "def f():\n    from fake.sub import b\n    return b\n",
        "sub/__init__.py": "from .b import g\n",
        "sub/b.py": ("from typing import TYPE_CHECKING\nfrom .. import c\n"
                     "if TYPE_CHECKING:\n    import fake.a\n"),
        "c.py": "import fake.sub.b as bb\nfrom fake import VERSION\nimport os\n",
        "d.py": "from . import a\nfrom fake.c import x\n",
    })
    graph = import_graph("fake", pkg)
    assert graph == {"fake": set(), "fake.a": {"fake.sub.b"}, "fake.sub": {"fake.sub.b"},
                     "fake.sub.b": {"fake.c"}, "fake.c": {"fake.sub.b", "fake"},
                     "fake.d": {"fake.a", "fake.c"}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"fake.sub.b", "fake.c"}
    for a, b in itertools.pairwise(cycle):
        assert b in graph[a], (a, b)

    # break it: the TYPE_CHECKING import is the only way back to fake.a, so no cycle remains
    (pkg / "c.py").write_text("from fake import VERSION\n")
    assert find_cycle(import_graph("fake", pkg)) is None

    # a cycle through a function-level import is still a cycle
    (pkg / "c.py").write_text("def h():\n    from fake import d\n")
    (pkg / "sub" / "b.py").write_text("from .. import c\n")
    (pkg / "a.py").write_text("def f():\n    from fake.sub import b\n")
    (pkg / "d.py").write_text("from . import a\n")
    cycle = find_cycle(import_graph("fake", pkg))
    assert cycle is not None and {"fake.a", "fake.sub.b", "fake.c", "fake.d"} == set(cycle)


def test_import_labkit_has_no_side_effects():
    code = ("import sys; import labkit; "
            "print(sorted(m for m in sys.modules if m == 'labkit' or m.startswith('labkit.'))); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["['labkit']", "False"], out.stdout


@pytest.mark.parametrize("name", ["labkit.exercises", "labkit.slurm"])
def test_light_modules_do_not_load_check(name):
    """The exercise registry and the Slurm parsers load without labkit.check, the parsers without torch."""
    code = f"import sys, {name}; print('labkit.check' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    check_loaded, torch_loaded = out.stdout.split()
    assert check_loaded == "False"
    if name == "labkit.slurm":
        assert torch_loaded == "False"
