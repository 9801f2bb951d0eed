"""Regenerate the Python packages `lethe.v1` and `lethe.errors.v1` from `proto/`.

Usage: ``python scripts/gen_protos.py [--out DIR]`` (default: the repository
root, which writes ``lethe/v1/`` and ``lethe/errors/v1/``: ``*_pb2.py``,
``*_pb2.pyi``, ``*_pb2_grpc.py`` / ``.pyi``, a copy of each ``.proto`` beside
its modules (so that an installed wheel is an include root for ``protoc``:
``-I site-packages`` resolves ``lethe/v1/threads.proto``) and the packages'
``__init__.py``; the rest of ``lethe/`` is hand-written and never touched).
Uses the ``protoc`` bundled with ``grpcio-tools`` and the ``mypy-protobuf``
plugins, so the output depends only on those pinned versions.
``tests/test_generated_code.py`` regenerates into a temporary directory and
fails on any difference.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_PACKAGES = ("lethe/v1", "lethe/errors/v1")
"""Folders of ``proto/`` whose files are generated, each into the same folder under ``--out``."""
GENERATED_DIRS = ("lethe/v1", "lethe/errors")
"""Folders under ``--out`` that hold nothing but generated files."""
INITS = {
    "lethe/v1": "Generated gRPC code for lethe.v1",
    "lethe/errors": "Generated code of the lethe.errors proto packages",
    "lethe/errors/v1": "Generated protobuf code of proto package lethe.errors.v1 (ErrorReason)",
}


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed next to this interpreter."""
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit(f"{name} not found beside {sys.executable}; install the dev extras")
    return found


def generate(out: Path) -> list[Path]:
    """Generate every package of :data:`PROTO_PACKAGES` under ``out`` and return
    the files written.

    Raises:
        SystemExit: protoc or a plugin failed.
    """
    protos = sorted(
        str(p.relative_to(PROTO_ROOT))
        for folder in PROTO_PACKAGES
        for p in (PROTO_ROOT / folder).glob("*.proto")
    )
    for folder in GENERATED_DIRS:
        pkg = out / folder
        if pkg.exists():
            for old in pkg.rglob("*"):
                if old.is_file() and (old.name.endswith((".proto", ".pyi")) or "_pb2" in old.name):
                    old.unlink()
    for folder in INITS:
        (out / folder).mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for proto in protos:
        shutil.copyfile(PROTO_ROOT / proto, out / proto)
    for folder, doc in INITS.items():
        (out / folder / "__init__.py").write_text(
            f'"""{doc}; regenerate with scripts/gen_protos.py."""\n'
        )
    return sorted(p for folder in GENERATED_DIRS for p in (out / folder).rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT)
    written = generate(parser.parse_args().out)
    print(f"wrote {len(written)} files under {parser.parse_args().out / 'lethe'}")


if __name__ == "__main__":
    main()
