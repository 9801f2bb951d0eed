"""The committed ``lethe.v1`` package must be exactly what ``scripts/gen_protos.py``
produces from ``proto/``: a stale generated file fails here. The rest of
``lethe/`` (the client modules) is written by hand and is not compared."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_code_is_current(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    generated = Path("lethe") / "v1"
    fresh = sorted(
        p.relative_to(tmp_path) for p in (tmp_path / generated).rglob("*") if p.is_file()
    )
    committed = sorted(
        p.relative_to(ROOT)
        for p in (ROOT / generated).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert not (tmp_path / "lethe" / "__init__.py").exists()  # hand-written, never generated
    assert fresh == committed, "generated file set differs; run scripts/gen_protos.py"
    stale = [str(p) for p in fresh if not filecmp.cmp(tmp_path / p, ROOT / p, shallow=False)]
    assert stale == [], f"stale generated files (run scripts/gen_protos.py): {stale}"


def test_every_proto_has_generated_modules() -> None:
    protos = {p.stem for p in (ROOT / "proto" / "lethe" / "v1").glob("*.proto")}
    modules = {p.name.removesuffix("_pb2.py") for p in (ROOT / "lethe" / "v1").glob("*_pb2.py")}
    assert protos == modules
