"""The rooms of the code and their doors, checked on the source itself.

ARCHITECTURE.md, "Top-level layout"; STYLE.md, "Rooms, and models for them";
each room's ``__init__`` docstring states its may-import line:

- no import cycle among the project's modules;
- ``lethe`` never imports ``server``, ``shredder`` or ``index``; ``index`` and
  ``shredder`` never import ``server``;
- every room of ``server`` imports only what its may-import line allows
  (:data:`ROOMS`), and reaches another room through its face only;
- only ``server/store/`` touches LMDB, spells a database (``db["…"]``) or is
  imported as ``server.store._*`` (its white-box unit tests in
  ``tests/server/store/`` excepted);
- no module of ``server/``, ``lethe/``, ``index/`` or ``shredder/`` is longer
  than 1,000 lines (generated code excepted);
- importing ``server`` or ``server.store``, and running ``lethe token list``,
  load neither the app nor FAISS (nor the MCP SDK, which ``lethe mcp`` alone
  loads).
"""

from __future__ import annotations

import ast
import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    """Every module ``path`` imports, by absolute name.

    ``from a import b`` is ``a.b`` when that is a module of the project (``b``
    is a submodule), else ``a``.
    """
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


GENERATED_HEADER = "# Generated from "
"""The first line of a module a script generates from a hand-written source (the blocking
client, ``scripts/gen_sync_client.py``): the bound applies to its source."""


def test_no_module_is_over_a_thousand_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources(*PACKAGES)
        if not p.read_text().startswith(GENERATED_HEADER)
        and (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


FLOOR = (
    "server.errors",
    "server._names",
    "server._logs",
    "server._metrics",
    "server._tagger",
    "server._tracing",
    "server._steps",
)
"""The floor of ``server``: modules every room may import."""
ROOMS: dict[str, tuple[str, ...]] = {
    "server.errors": ("lethe",),
    "server._names": ("lethe", "server.errors"),
    "server._logs": (),
    "server._metrics": (),
    "server._tagger": (),
    "server._tracing": ("lethe", "server._metrics"),
    "server._steps": (),
    "server.store": ("lethe", "server.errors", "shredder"),
    "server.retrieval": ("lethe", *FLOOR, "server.store", "index", "shredder"),
    "server.lifecycle": ("lethe", *FLOOR, "server.store", "server.retrieval", "shredder"),
    "server.edge": ("lethe", *FLOOR, "server.store"),
    "server.services": (
        "lethe",
        *FLOOR,
        "server.store",
        "server.retrieval",
        "server.lifecycle",
        "server.edge",
    ),
    "server._app": (
        "lethe",
        *FLOOR,
        "server.store",
        "server.retrieval",
        "server.lifecycle",
        "server.edge",
        "server.services",
        "server._thread_names",
        "index",
        "shredder",
    ),
    "server.cli": ("lethe", "server", "index", "shredder"),
    "server._thread_names": (),
}
"""Each room of ``server`` and what it may import of the project (besides itself):
the may-import line of its ``__init__`` docstring."""
FACES = ("server.store", "server.retrieval", "server.lifecycle", "server.edge", "server.services")
"""Rooms reached from outside through their ``__init__`` only."""


def _room(module: str) -> str | None:
    for room in sorted(ROOMS, key=len, reverse=True):
        if module == room or module.startswith(room + "."):
            return room
    return None


def _allowed(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


def test_every_room_imports_only_what_its_rule_allows() -> None:
    offenders = []
    for path in _sources("server"):
        module = _module(path)
        room = _room(module)
        if module == "server":  # the lazy face: checked by the import-time test below
            continue
        assert room is not None, f"{module} belongs to no room of ROOMS"
        for name in _imports(path):
            top = name.split(".")[0]
            if top not in PACKAGES or _room(name) == room:
                continue
            if not _allowed(name, ROOMS[room]):
                offenders.append(f"{module} imports {name}")
    assert offenders == []


def test_rooms_are_reached_through_their_faces() -> None:
    offenders = [
        f"{_module(path)} imports {name}"
        for top in ("server", "lethe", "bench", "scripts")
        for path in _files(top)
        for name in _imports(path)
        for face in FACES
        if name.startswith(face + "._")
        and not _module(path).startswith(face + ".")
        and _module(path) != face
    ]
    assert offenders == []


def _loaded_after(code: str, cwd: Path) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(out.stdout.split())


@pytest.mark.parametrize("code", ["import server", "import server.store", "import server.cli"])
def test_importing_the_faces_loads_neither_the_app_nor_faiss(code: str) -> None:
    loaded = _loaded_after(code, ROOT)
    assert "faiss" not in loaded
    assert "mcp" not in loaded  # the MCP SDK: only when `lethe mcp` runs
    assert "server._app" not in loaded
    assert "server.retrieval" not in loaded


def test_lethe_token_list_does_not_import_faiss(tmp_path: Path) -> None:
    """``lethe token list`` on a real store, its imports traced by ``-X importtime``."""
    env = {**os.environ, "LETHE_KEK": base64.b64encode(b"k" * 32).decode()}
    data = tmp_path / "data"
    setup = (
        "import sys, pathlib\nfrom server.store import Store\n"
        "Store(pathlib.Path(sys.argv[1])).close()"
    )
    subprocess.run([sys.executable, "-c", setup, str(data)], env=env, check=True, timeout=120)
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "server.cli", "token", "list", "--data", data],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "server.cli._token" in imported  # the trace works
    assert not {m for m in imported if m.split(".")[0] in ("faiss", "mcp")}
    assert "server._app" not in imported
