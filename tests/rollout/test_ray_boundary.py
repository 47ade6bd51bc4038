"""Only the Ray shell (the package bapsql.rollout.ray_shell) imports ray; everything else is testable without it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bapsql"
SHELL = PACKAGE / "rollout" / "ray_shell"


def _imports_ray(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        if any(n == "ray" or n.startswith("ray.") for n in names):
            lines.append(node.lineno)
    return lines


def test_no_module_outside_the_ray_shell_imports_ray():
    offenders = {str(p.relative_to(PACKAGE)): lines for p in PACKAGE.rglob("*.py")
                 if SHELL not in p.parents and (lines := _imports_ray(p))}
    assert offenders == {}


def test_the_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import ray.train\n    from ray import exceptions\n    from .ray import x\n")
    assert _imports_ray(f) == [2, 3]
