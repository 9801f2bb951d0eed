"""The rooms of the code and their doors (ARCHITECTURE.md, "Top-level layout";
STYLE.md, "Rooms, and models for them"), checked on the source itself:

- no import cycle among the project's modules;
- ``lethe`` never imports ``server``, ``shredder`` or ``index``; ``index`` and
  ``shredder`` never import ``server``;
- only ``server/store/`` touches LMDB, spells a database (``db["…"]``) or is
  imported as ``server.store._*`` (its white-box unit tests in
  ``tests/server/store/`` excepted);
- no module of ``server/`` is longer than 1,000 lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lethe", "server", "shredder", "index")
MAX_LINES = 1000


def _sources(*tops: str) -> Iterator[Path]:
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "v1" in path.relative_to(ROOT).parts[:3] or "__pycache__" in path.parts:
                continue
            yield path


def _files(top: str) -> list[Path]:
    """Every Python file under ``top``, not counting installed Node packages."""
    return [p for p in sorted((ROOT / top).rglob("*.py")) if "node_modules" not in p.parts]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, by absolute name. ``from a import b`` is
    ``a.b`` when that is a module of the project (``b`` is a submodule), else ``a``."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if _is_module(sub) else node.module)
    return out


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in _sources(*PACKAGES)}
    return {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def test_no_import_cycles_between_project_modules() -> None:
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []


def _offenders(tops: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _sources(*tops)
        for name in _imports(path)
        if name.split(".")[0] in forbidden or name in forbidden
    )


def test_the_client_package_knows_only_the_api() -> None:
    assert _offenders(("lethe",), ("server", "shredder", "index")) == []


def test_index_and_shredder_know_nothing_of_the_server() -> None:
    assert _offenders(("index", "shredder"), ("server",)) == []


def test_only_the_store_touches_lmdb() -> None:
    outside = [p for p in _sources("server") if not p.is_relative_to(ROOT / "server" / "store")]
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in outside
        for name in _imports(p)
        if name == "lmdb" or name.startswith("lmdb.")
    ]
    assert offenders == []


def test_no_database_is_spelled_outside_the_store() -> None:
    store = ROOT / "server" / "store"
    offenders = [
        str(p.relative_to(ROOT))
        for top in ("server", "lethe", "bench", "tests", "scripts")
        for p in _files(top)
        if not p.is_relative_to(store) and p != Path(__file__).resolve() and 'db["' in p.read_text()
    ]
    assert offenders == []


def test_the_store_is_reached_through_its_face_only() -> None:
    store = ROOT / "server" / "store"
    white_box = ROOT / "tests" / "server" / "store"
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for top in ("server", "lethe", "bench", "tests", "scripts")
        for p in _files(top)
        if not p.is_relative_to(store) and not p.is_relative_to(white_box)
        for name in _imports(p)
        if name.startswith("server.store._")
    ]
    assert offenders == []


def test_no_server_module_is_over_a_thousand_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources("server")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
