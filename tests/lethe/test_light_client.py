"""The light client distribution end to end, in a fresh venv at its lowest versions.

Build the ``lethe-store-client`` wheel, install it into a fresh venv at the
lowest versions it claims (grpcio, grpcio-status, protobuf floors from
``clients/python/pyproject.toml``), check that venv holds only those and
nothing of the server, and run the portable client tests (``test_client.py``,
``test_client_async.py``) there against a real server on loopback.

``LETHE_LIGHT_DEPS=latest`` installs the newest allowed versions instead.
One venv per run: the build and the install take about 30 s here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from conftest import Lethe

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ALLOWED = {"lethe-store-client", "grpcio", "grpcio-status", "protobuf", "googleapis-common-protos"}
# grpcio >= 1.63 also brings typing-extensions.
MAYBE = {"typing-extensions"}
MAX_INSTALLED_BYTES = 40_000_000


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "light_client", ROOT / "scripts" / "light_client.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_wheel_installs_alone_and_its_client_passes_against_a_real_server(
    lethe: Lethe, tmp_path: Path
) -> None:
    tool = _script()
    use_floors = os.environ.get("LETHE_LIGHT_DEPS", "floors") != "latest"
    wheel = tool.build_wheel(tmp_path)
    python = tool.install(wheel, tmp_path / "venv", use_floors=use_floors)
    report = tool.measure(python)
    names = set(report["distributions"])
    assert ALLOWED <= names <= ALLOWED | MAYBE, report["distributions"]
    assert report["dependencies"] == len(names) - 1
    assert report["installed_bytes"] < MAX_INSTALLED_BYTES, report["by_distribution"]
    if use_floors:
        for name, version in tool.floors().items():
            assert report["distributions"][name] == version, (name, report["distributions"])
    probe = subprocess.run(
        [
            str(python),
            "-I",
            "-c",
            "import importlib.util as u, json, lethe.client, lethe.v1.threads_pb2\n"
            "print(json.dumps([m for m in ('server', 'shredder', 'index', 'faiss', 'lmdb',"
            " 'nacl', 'numpy') if u.find_spec(m)]))",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert json.loads(probe.stdout) == []

    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "pytest>=8",
         "pytest-timeout"],
        check=True,
        timeout=600,
    )  # fmt: skip
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("test_client.py", "test_client_async.py"):
        shutil.copy(HERE / name, tests / name)
    shutil.copy(HERE / "light_conftest.py", tests / "conftest.py")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LETHE_"))},
        "LETHE_TEST_TARGET": f"127.0.0.1:{lethe.port}",
        "LETHE_TEST_ADMIN": lethe.token(admin=True),
        "LETHE_TEST_LIMITED": lethe.token("limited-owner"),
    }
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
         "--timeout", "120", "--rootdir", str(tests), str(tests)],
        cwd=tests,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
    assert "failed" not in done.stdout
