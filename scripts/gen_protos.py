"""Regenerate the `lethe.v1` Python package from `proto/lethe/v1/*.proto`.

Usage: ``python scripts/gen_protos.py [--out DIR]`` (default: the repository
root, which writes ``lethe/v1/*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py``
/ ``.pyi`` and ``lethe/v1/__init__.py``). Only ``lethe/v1/`` is generated: the
rest of ``lethe/`` (its ``__init__.py``, ``py.typed``, the client modules) is
written by hand and never touched here. Uses the ``protoc`` bundled with ``grpcio-tools`` and the
``mypy-protobuf`` plugins, so the output depends only on those pinned
versions. ``tests/test_generated_code.py`` regenerates into a temporary
directory and fails on any difference.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_INIT = '"""Generated gRPC code for lethe.v1; regenerate with scripts/gen_protos.py."""\n'


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed next to this interpreter."""
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit(f"{name} not found beside {sys.executable}; install the dev extras")
    return found


def generate(out: Path) -> list[Path]:
    """Generate the package ``out/lethe/v1`` and return its files.

    Raises:
        SystemExit: protoc or a plugin failed.
    """
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("lethe/v1/*.proto"))
    pkg = out / "lethe" / "v1"
    if pkg.exists():
        for old in pkg.glob("*_pb2*"):
            old.unlink()
    pkg.mkdir(parents=True, exist_ok=True)
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
    (pkg / "__init__.py").write_text(PACKAGE_INIT)
    return sorted(p for p in pkg.iterdir() if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT)
    written = generate(parser.parse_args().out)
    print(f"wrote {len(written)} files under {parser.parse_args().out / 'lethe' / 'v1'}")


if __name__ == "__main__":
    main()
