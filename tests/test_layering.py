"""Imports point only downward: minisgl_cli -> engine -> kernels -> kvcache (the project's design rule). Read from
the sources, so an upward import anywhere (a function body's included) fails here before it tangles the layers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("minisgl_cli", "engine", "kernels", "kvcache")  # top to bottom


def _imported_packages(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(LAYERS)


def upward_imports(root: Path = ROOT) -> list[str]:
    """`file: imports <package>` for every import of a layer above the file's own."""
    bad = []
    for rank, layer in enumerate(LAYERS):
        above = set(LAYERS[:rank])
        for path in sorted((root / layer).rglob("*.py")):
            for pkg in sorted(_imported_packages(path) & above):
                bad.append(f"{path.relative_to(root)}: imports {pkg}")
    return bad


def test_imports_point_only_downward():
    assert upward_imports() == []


def test_an_upward_import_is_found(tmp_path):
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    (tmp_path / "kvcache" / "pool.py").write_text("def f():\n    from engine.request import Req\n")
    (tmp_path / "kernels" / "ops.py").write_text("import kvcache.pool\nimport minisgl_cli.app as app\n")
    (tmp_path / "engine" / "runner.py").write_text("from kernels import ops\nfrom . import sibling\n")
    assert upward_imports(tmp_path) == [
        "kernels/ops.py: imports minisgl_cli",
        "kvcache/pool.py: imports engine",
    ]
