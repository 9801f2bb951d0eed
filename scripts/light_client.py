"""Build the light client wheel, install it into a fresh venv, and report what that installed.

The wheel is built from ``clients/python/``.

Usage::

    python scripts/light_client.py --venv DIR [--floors] [--json]

``--floors`` installs the lowest versions ``clients/python/pyproject.toml``
claims (``grpcio``, ``grpcio-status``, ``protobuf`` at their ``>=`` bounds)
instead of the newest ones. Prints the installed distributions, their count
besides ``lethe-store-client``, and their installed size (the files each
distribution's ``RECORD`` lists; pip itself excluded). ``tests/lethe/
test_light_client.py`` uses the same functions and then runs the portable
client tests in that venv against a real server.

Needs the package index (or pip's cache) for the dependencies and for
setuptools (the build backend, in pip's isolated build environment).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "clients" / "python"
NOT_COUNTED = {"pip", "setuptools", "wheel"}
"""Distributions every venv has: not dependencies of the client."""

_MEASURE = """
import importlib.metadata as md, json, os
out = {}
for dist in md.distributions():
    name = dist.metadata["Name"].lower().replace("_", "-")
    size = 0
    for f in dist.files or ():
        p = dist.locate_file(f)
        if os.path.isfile(p):
            size += os.path.getsize(p)
    out[name] = {"version": dist.version, "bytes": size}
print(json.dumps(out))
"""


def floors() -> dict[str, str]:
    """``{distribution: lowest version}`` from ``clients/python/pyproject.toml``'s dependencies.

    Raises:
        ValueError: a dependency without a ``>=`` bound.
    """
    deps = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][^,]*)(,.*)?", dep)
        if found is None:
            raise ValueError(f"no >= floor in {dep!r}")
        out[found.group(1)] = found.group(2).strip()
    return out


def _pip(python: Path, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args],
        check=True,
        timeout=900,
    )


def build_wheel(out: Path) -> Path:
    """Build the ``lethe-store-client`` wheel into ``out`` from a copy of ``clients/python/``.

    The copy (links followed, caches left out) keeps the build's ``build/``
    and ``*.egg-info`` out of the work tree.

    Returns:
        The wheel's path.

    Raises:
        subprocess.CalledProcessError: the build failed.
    """
    src = out / "src"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(
        PROJECT,
        src,
        symlinks=False,
        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"),
    )
    dist = out / "dist"
    _pip(Path(sys.executable), "wheel", "--no-deps", "-w", str(dist), str(src))
    (wheel,) = sorted(dist.glob("lethe_store_client-*.whl"))
    return wheel


def install(wheel: Path, target: Path, *, use_floors: bool) -> Path:
    """A fresh venv at ``target`` with ``wheel`` (and its floors, with ``use_floors``).

    Returns:
        The venv's python.
    """
    if target.exists():
        shutil.rmtree(target)
    venv.create(target, with_pip=True)
    python = target / "bin" / "python"
    pins = [f"{name}=={version}" for name, version in floors().items()] if use_floors else []
    _pip(python, "install", "--only-binary=:all:", str(wheel), *pins)
    return python


def measure(python: Path) -> dict[str, Any]:
    """What the venv of ``python`` holds besides pip.

    Returns:
        ``{"distributions": {name: version}, "dependencies": count besides
        lethe-store-client, "installed_bytes": total, "by_distribution": {name: bytes}}``.
    """
    done = subprocess.run(
        [str(python), "-I", "-c", _MEASURE], check=True, capture_output=True, text=True
    )
    found: dict[str, dict[str, Any]] = json.loads(done.stdout)
    kept = {n: d for n, d in sorted(found.items()) if n not in NOT_COUNTED}
    return {
        "distributions": {n: d["version"] for n, d in kept.items()},
        "dependencies": len([n for n in kept if n != "lethe-store-client"]),
        "installed_bytes": sum(d["bytes"] for d in kept.values()),
        "by_distribution": {n: d["bytes"] for n, d in kept.items()},
    }


def main() -> None:
    """Build the wheel into ``--venv``, install it into ``--venv``/venv, print the report.

    ``--floors`` installs the lowest claimed versions; ``--json`` prints the report as
    JSON, else as text (the wheel's size, each distribution's version and size, totals).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, required=True, help="where to build and install")
    parser.add_argument("--floors", action="store_true", help="install the lowest claimed versions")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    args.venv.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(args.venv)
    report = measure(install(wheel, args.venv / "venv", use_floors=args.floors))
    report["wheel_bytes"] = wheel.stat().st_size
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"wheel {wheel.name}: {report['wheel_bytes'] / 1e3:.0f} kB")
    for name, version in report["distributions"].items():
        print(f"  {name} {version}: {report['by_distribution'][name] / 1e6:.1f} MB")
    print(
        f"{report['dependencies']} dependencies, "
        f"{report['installed_bytes'] / 1e6:.1f} MB installed (lethe-store-client included)"
    )


if __name__ == "__main__":
    main()
