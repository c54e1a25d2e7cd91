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


# Inside minisgl_cli: the commands (app and its command modules) sit on top of the chat's tui/ and the server's
# server/, which never import a command or each other (a command module is where the two meet).
COMMANDS = ("__main__", "app", "bench_compare", "bench_offline", "bench_serve", "bench_trace", "cache", "chat", "serve")
FRONT_ENDS = ("tui", "server")


def _imported_modules(path: Path) -> set[str]:
    """Each import's module; `from package import name` adds `package.name` too where the package alone is not
    what it names (`from minisgl_cli import chat`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            if node.module in ("minisgl_cli", *(f"minisgl_cli.{f}" for f in FRONT_ENDS)):
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def front_end_imports(root: Path = ROOT) -> list[str]:
    """`file: imports <module>` for every import, in tui/ or server/, of a command module or of the other one."""
    bad = []
    for front in FRONT_ENDS:
        other = next(f for f in FRONT_ENDS if f != front)
        banned = {f"minisgl_cli.{c}" for c in COMMANDS}
        for path in sorted((root / "minisgl_cli" / front).rglob("*.py")):
            for mod in sorted(_imported_modules(path)):
                if mod in banned or mod == f"minisgl_cli.{other}" or mod.startswith(f"minisgl_cli.{other}."):
                    bad.append(f"{path.relative_to(root)}: imports {mod}")
    return bad


def test_the_chat_and_the_server_import_no_command_and_not_each_other():
    assert front_end_imports() == []


def test_a_front_end_importing_a_command_or_the_other_is_found(tmp_path):
    for front in FRONT_ENDS:
        (tmp_path / "minisgl_cli" / front).mkdir(parents=True)
    (tmp_path / "minisgl_cli" / "tui" / "app.py").write_text(
        "from minisgl_cli.tui import store\nfrom minisgl_cli import version\n"
        "def f():\n    from minisgl_cli import chat\n"
    )
    (tmp_path / "minisgl_cli" / "server" / "app.py").write_text(
        "import minisgl_cli.bench_serve\nfrom minisgl_cli.tui.store import Store\n"
        "from minisgl_cli import openai_client\n"
    )
    assert front_end_imports(tmp_path) == [
        "minisgl_cli/tui/app.py: imports minisgl_cli.chat",
        "minisgl_cli/server/app.py: imports minisgl_cli.bench_serve",
        "minisgl_cli/server/app.py: imports minisgl_cli.tui.store",
    ]
