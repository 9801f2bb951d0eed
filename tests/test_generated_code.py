"""The committed generated code is exactly what its generators produce.

``lethe/v1`` and ``lethe/errors`` must be exactly what ``scripts/gen_protos.py``
produces from ``proto/``: a stale generated file (or a stale copy of a
``.proto`` beside them) fails here. The blocking client (``lethe/client/_sync.py``,
``_base_sync.py``, ``_threads_sync.py`` …) comes from the asyncio one by
``scripts/gen_sync_client.py``: a stale module fails here too. So must
``clients/typescript/src/gen``, what ``npm run generate`` (protoc-gen-es,
through buf) produces; it needs ``npm ci`` in ``clients/typescript`` (skipped
without it, except under CI).
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATED_DIRS = ("lethe/v1", "lethe/errors")
PROTO_PACKAGES = ("lethe/v1", "lethe/errors/v1")
GEN_SYNC_CLIENT = ROOT / "scripts" / "gen_sync_client.py"
CLIENT = Path("lethe") / "client"
SYNC_HEADER = "# Generated from lethe/client/"


def _files(root: Path) -> list[Path]:
    return sorted(
        p.relative_to(root)
        for folder in GENERATED_DIRS
        for p in (root / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


def test_generated_code_is_current(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = _files(tmp_path)
    assert fresh == _files(ROOT), "generated file set differs; run scripts/gen_protos.py"
    stale = [str(p) for p in fresh if not filecmp.cmp(tmp_path / p, ROOT / p, shallow=False)]
    assert stale == [], f"stale generated files (run scripts/gen_protos.py): {stale}"


def test_typescript_code_is_current(tmp_path: Path) -> None:
    client = ROOT / "clients" / "typescript"
    node = shutil.which("node")
    if node is None or not (client / "node_modules").is_dir():
        why = "node, or node_modules (run `npm ci` in clients/typescript), is missing"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must check the TypeScript client's generated code")
        pytest.skip(why)
    done = subprocess.run(
        [node, str(client / "scripts" / "generate.mjs"), str(tmp_path)],
        cwd=client,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    fresh, committed = tmp_path / "src" / "gen", client / "src" / "gen"

    def files(root: Path) -> list[Path]:
        return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())

    assert files(fresh) == files(committed), "generated file set differs; run npm run generate"
    stale = [
        str(p) for p in files(fresh) if not filecmp.cmp(fresh / p, committed / p, shallow=False)
    ]
    assert stale == [], f"stale generated files (npm run generate in clients/typescript): {stale}"


def test_every_proto_has_generated_modules_and_a_copy() -> None:
    for folder in PROTO_PACKAGES:
        protos = {p.stem for p in (ROOT / "proto" / folder).glob("*.proto")}
        assert protos, folder
        modules = {p.name.removesuffix("_pb2.py") for p in (ROOT / folder).glob("*_pb2.py")}
        copies = {p.stem for p in (ROOT / folder).glob("*.proto")}
        assert protos == modules == copies, folder


def test_error_reason_lives_in_a_versioned_package() -> None:
    from lethe.errors.v1 import errors_pb2

    descriptor = errors_pb2.DESCRIPTOR
    assert descriptor.package == "lethe.errors.v1"
    assert descriptor.name == "lethe/errors/v1/errors.proto"
    assert errors_pb2.ErrorReason.DESCRIPTOR.full_name == "lethe.errors.v1.ErrorReason"


def _generated_client_modules(root: Path) -> list[str]:
    """Names of the modules under ``root/lethe/client`` that carry the generated header."""
    return sorted(
        p.name for p in (root / CLIENT).glob("*.py") if p.read_text().startswith(SYNC_HEADER)
    )


def test_sync_client_is_current(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(GEN_SYNC_CLIENT), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = _generated_client_modules(tmp_path)
    assert "_sync.py" in fresh
    assert fresh == _generated_client_modules(ROOT), (
        "generated client module set differs; run scripts/gen_sync_client.py"
    )
    stale = [
        name
        for name in fresh
        if (tmp_path / CLIENT / name).read_bytes() != (ROOT / CLIENT / name).read_bytes()
    ]
    assert stale == [], f"stale generated client modules (run scripts/gen_sync_client.py): {stale}"


def test_sync_client_check_fails_on_a_hand_edit(tmp_path: Path) -> None:
    """``--check`` compares without writing; an edited generated module fails it."""
    (tmp_path / CLIENT).mkdir(parents=True)
    for name in _generated_client_modules(ROOT):
        shutil.copyfile(ROOT / CLIENT / name, tmp_path / CLIENT / name)
    check = [sys.executable, str(GEN_SYNC_CLIENT), "--check", "--out", str(tmp_path)]
    assert subprocess.run(check, capture_output=True, check=False).returncode == 0
    edited = tmp_path / CLIENT / "_sync.py"
    edited.write_text(edited.read_text() + "# a hand edit\n")
    done = subprocess.run(check, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert f"{edited} (committed)" in done.stdout
    assert "\n-# a hand edit\n" in done.stdout  # the diff shows the hand edit
