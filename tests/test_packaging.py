"""The distributions carry what a user of the API needs.

The wheel holds every module of the four packages (the package list once left
out ``server.store`` and ``server.services``), the ``.proto`` files beside the
generated code (an installed Lethe is an include root for ``protoc``) and the
LICENSE; the sdist holds ``proto/`` and the LICENSE too.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lethe", "server", "shredder", "index")


def _build(kind: str, out: Path) -> Path:
    code = f"from setuptools import build_meta as b; print(b.build_{kind}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out / done.stdout.strip().splitlines()[-1]


def _sources() -> set[str]:
    return {
        str(p.relative_to(ROOT))
        for top in PACKAGES
        for p in (ROOT / top).rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and p.suffix in {".py", ".pyi", ".proto", ".typed"}
    }


def test_the_wheel_holds_every_module_the_protos_and_the_license(tmp_path: Path) -> None:
    wheel = _build("wheel", tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert _sources() - names == set()
    protos = {str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto")}
    assert protos <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_sdist_holds_the_proto_tree_and_the_license(tmp_path: Path) -> None:
    sdist = _build("sdist", tmp_path)
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    protos = {str(p.relative_to(ROOT)) for p in (ROOT / "proto").rglob("*.proto")}
    assert protos <= names
    assert {"LICENSE", "buf.yaml", "pyproject.toml"} <= names
    # the documents the README links to
    assert {"THREAT_MODEL.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/README.md"} <= names
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
