"""Every third-party package the library imports is declared in pyproject.toml; those the core imports without an
extra (jinja2: chat templates render every prompt) are core dependencies."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE_IMPORTS = ("jinja2", "tokenizers", "apsw", "sqlglot", "yaml", "pyarrow", "numpy")  # used by env / agent / logs


def _imports() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "bapsql").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "bapsql"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_every_imported_package_is_declared_and_jinja2_is_core():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = _names(project["dependencies"])
    declared = core | _names([r for extra in project["optional-dependencies"].values() for r in extra])
    dists = packages_distributions()
    imported = _imports()
    assert "jinja2" in imported
    missing = sorted(m for m in imported
                     if not any(d.lower().replace("_", "-") in declared for d in dists.get(m, [m])))
    assert missing == [], f"imported but not declared in pyproject.toml: {missing}"
    not_core = sorted(m for m in CORE_IMPORTS if not any(d.lower().replace("_", "-") in core
                                                          for d in dists.get(m, [m])))
    assert not_core == [], f"imported by the core but not a core dependency: {not_core}"
