"""The package's shape (issue 36): no import circle among `bapsql` modules, no module over 400 lines, and
`bapsql.train`'s sub-packages import only the layers below them (`TRAIN_LAYERS`).

Every ``import`` counts, at module level or inside a function (a lazy import hides a circle from the interpreter,
not from a reader), except those under ``if TYPE_CHECKING:``. An import of a package counts as an import of its
``__init__``; ``from package import module`` as an import of that module.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
# Modules allowed past MAX_LINES, each with its ceiling and why. Data tables only; code is split instead.
LONG_MODULES: dict[str, tuple[int, str]] = {
    "bapsql/data/synth_domains.py": (440, "data tables: the synthetic domains' schemas and value pools"),
}


# bapsql/train/'s layers, lowest first: a module imports from its own layer and the ones before it, never a later
# one. ``config`` is the training config at the package's top (`TRAIN_CONFIG_MODULES`): it assembles sections that
# algo/ and learner/ define, and loop/ and above read it.
TRAIN_LAYERS = ("algo", "learner", "config", "loop", "recipe", "experiments")
TRAIN_CONFIG_MODULES = frozenset({"config", "extends", "pretrain_config"})


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``package`` (a folder holding ``__init__.py``)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module → the package's modules it imports (see the module docstring for what counts)."""
    files = module_files(package)
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = _type_checking_nodes(tree)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base_parts = name.split(".") if is_package else name.split(".")[:-1]
                    base_parts = base_parts[: len(base_parts) - node.level + 1]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; sorted by first name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    nodes = sorted(set(graph) | {m for targets in graph.values() for m in targets})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _path_through(graph: dict[str, set[str]], circle: list[str]) -> str:
    """One cycle inside a circle, as ``a -> b -> a``, for the failure message."""
    members = set(circle)
    start = circle[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        back = [m for m in nxt if m == start]
        if back and len(path) > 1:
            return " -> ".join(path + [start])
        fresh = [m for m in nxt if m not in seen]
        if not fresh:
            return " -> ".join(path + [nxt[0]])
        path.append(fresh[0])
        seen.add(fresh[0])


def test_no_import_circles_in_bapsql():
    graph = import_graph(ROOT / "bapsql")
    circles = import_circles(graph)
    assert not circles, "import circles in bapsql (move the shared piece into a lower module):\n" + "\n".join(
        _path_through(graph, c) for c in circles)


def train_layer(module: str, root: str = "bapsql.train") -> str | None:
    """The layer (`TRAIN_LAYERS`) of ``module`` under ``root``: its sub-package, ``config`` for the top-level config
    modules, ``"?"`` for any other top-level module (it must be placed); None for ``root`` itself and outside it."""
    if not module.startswith(root + "."):
        return None
    part = module[len(root) + 1:].split(".")[0]
    if part in TRAIN_LAYERS:
        return part
    return "config" if part in TRAIN_CONFIG_MODULES else "?"


def layer_violations(graph: dict[str, set[str]], root: str = "bapsql.train") -> list[str]:
    """Every import under ``root`` that reaches a later layer than its own, or involves a module in no layer."""
    rank = {layer: i for i, layer in enumerate(TRAIN_LAYERS)}
    out = []
    for module in sorted(graph):
        src = train_layer(module, root)
        for target in sorted(graph[module]):
            dst = train_layer(target, root)
            if src is None or dst is None:
                continue
            if "?" in (src, dst):
                out.append(f"{module} -> {target}: a module of {root} outside {TRAIN_LAYERS}")
            elif rank[dst] > rank[src]:
                out.append(f"{module} -> {target}: {src} may not import {dst}")
    return out


def test_train_sub_packages_import_only_the_layers_below_them():
    graph = import_graph(ROOT / "bapsql")
    assert {train_layer(m) for m in module_files(ROOT / "bapsql")} - {None} == set(TRAIN_LAYERS)
    violations = layer_violations(graph)
    assert not violations, "imports against bapsql/train's layers " + " < ".join(TRAIN_LAYERS) + ":\n" + "\n".join(
        violations)


def test_no_module_over_400_lines():
    too_long = []
    for path in sorted((ROOT / "bapsql").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        limit = LONG_MODULES.get(rel, (MAX_LINES, ""))[0]
        if lines > limit:
            too_long.append(f"{rel}: {lines} lines (limit {limit})")
    assert not too_long, "modules over their line limit (split by concept):\n" + "\n".join(too_long)


def test_the_allow_list_names_existing_files_only():
    missing = [rel for rel in LONG_MODULES if not (ROOT / rel).is_file()]
    assert not missing, f"LONG_MODULES names files that do not exist: {missing}"


def _package(tmp_path: Path, modules: dict[str, str]) -> Path:
    pkg = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **modules}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_a_planted_circle_is_found_even_through_a_lazy_import(tmp_path):
    pkg = _package(tmp_path, {
        "a.py": "from pkg.b import f\n",
        "b.py": "def f():\n    from pkg import c\n",
        "c.py": "from . import a\n",
        "d.py": "from pkg.a import x\n",
    })
    graph = import_graph(pkg)
    assert import_circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert _path_through(graph, ["pkg.a", "pkg.b", "pkg.c"]) == "pkg.a -> pkg.b -> pkg.c -> pkg.a"


def test_type_checking_imports_do_not_count(tmp_path):
    pkg = _package(tmp_path, {
        "a.py": "from pkg.b import f\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import g\n",
    })
    assert import_circles(import_graph(pkg)) == []


@pytest.mark.parametrize("where, source, expected", [
    ("x.py", "from .sub import m\n", {"pkg.sub.m"}),
    ("x.py", "from pkg import sub\n", {"pkg.sub"}),
    ("x.py", "import pkg.sub.m\n", {"pkg.sub.m"}),
    ("x.py", "from pkg.sub.m import y\n", {"pkg.sub.m"}),
    ("sub/__init__.py", "from .m import y\n", {"pkg.sub.m"}),  # relative to the package itself
    ("sub/m.py", "from .. import x\n", {"pkg.x"}),
])
def test_relative_and_package_imports_resolve(tmp_path, where, source, expected):
    modules = {"x.py": "", "sub/__init__.py": "", "sub/m.py": ""}
    pkg = _package(tmp_path, {**modules, where: source})
    name = "pkg." + where.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    assert import_graph(pkg)[name] == expected


def test_a_planted_upward_import_in_train_is_found(tmp_path):
    pkg = _package(tmp_path, {
        "train/__init__.py": "",
        "train/config.py": "from pkg.train.learner.core import x\n",
        "train/algo/__init__.py": "",
        "train/algo/grpo.py": "def f():\n    from pkg.train.loop import trainer\n",  # lazy, still counts
        "train/learner/__init__.py": "",
        "train/learner/core.py": "from pkg.train.algo.grpo import f\n",
        "train/loop/__init__.py": "",
        "train/loop/trainer.py": "from pkg.train.config import c\nfrom pkg.train import stray\n",
        "train/stray.py": "",
    })
    assert layer_violations(import_graph(pkg), root="pkg.train") == [
        "pkg.train.algo.grpo -> pkg.train.loop.trainer: algo may not import loop",
        "pkg.train.loop.trainer -> pkg.train.stray: a module of pkg.train outside " + str(TRAIN_LAYERS),
    ]
