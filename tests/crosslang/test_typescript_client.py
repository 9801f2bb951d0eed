"""The TypeScript client (``clients/typescript``, ``npm test``) against the real server.

Its tests run with node's test runner, once per transport: gRPC, Connect in
JSON over HTTP/1.1 and in binary over HTTP/2 (Node's transports), Connect
over ``fetch`` as a browser or an edge runtime calls it (connect-web), and
gRPC and Connect over TLS. Each creates, appends, commits, searches and
forgets, sees the deletion on a ``Watch``, reads a refusal's reason and
retry delay, and is refused another owner's data — against a server that
requires the owner header, so every call shows the client sends it. Its unit
tests (an in-memory transport) run once.

``scripts/test.sh`` runs ``npm ci`` in ``clients/typescript``; without npm or
``node_modules`` the tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from _pki import Pki, make_pki
from conftest import Lethe

TS_DIR = Path(__file__).resolve().parents[2] / "clients" / "typescript"
OWNER = "ts-client"


def _require_npm() -> str:
    npm = shutil.which("npm")
    if npm is None or not (TS_DIR / "node_modules").is_dir():
        reason = "npm, or node_modules (run `npm ci` in clients/typescript), is missing"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the TypeScript client")
        pytest.skip(reason)
    return npm


@pytest.fixture(scope="module")
def built() -> str:
    """``npm run build`` (tsc) once; returns the node executable."""
    npm = _require_npm()
    done = subprocess.run(
        [npm, "run", "build"], cwd=TS_DIR, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    node = shutil.which("node")
    assert node is not None
    return node


def _node_test(node: str, test: str, **env: str) -> str:
    result = subprocess.run(
        [node, "--test", f"dist/test/{test}"],
        cwd=TS_DIR,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "# fail 0" in result.stdout
    return result.stdout


def test_typescript_unit_tests(built: str) -> None:
    out = _node_test(built, "unit.test.js")
    assert "# pass 5" in out


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize(
    ("transport", "tls"),
    [
        ("grpc", False),
        ("connect-json", False),
        ("connect-binary", False),
        ("fetch-json", False),
        ("fetch-binary", False),
        ("grpc", True),
        ("connect-binary", True),
        ("connect-json", True),
    ],
)
def test_typescript_client_against_the_real_server(
    built: str,
    lethe_at: Callable[..., Lethe],
    tmp_path: Path,
    pki: Pki,
    transport: str,
    tls: bool,
) -> None:
    config: dict[str, object] = {"require_owner_header": True, "max_streams_per_principal": 1}
    extra: dict[str, str] = {}
    if tls:
        config |= {"tls_cert": pki.server_cert, "tls_key": pki.server_key}
        extra = {"LETHE_CA": str(pki.ca)}
    srv = lethe_at(tmp_path / "d", **config)
    port = srv.port if transport == "grpc" else srv.http_port
    out = _node_test(
        built,
        "lethe.test.js",
        LETHE_TRANSPORT=transport,
        LETHE_URL=f"{'https' if tls else 'http'}://localhost:{port}",
        LETHE_TOKEN=srv.token(OWNER),
        LETHE_OWNER=OWNER,
        LETHE_STRANGER="someone-else",
        **extra,
    )
    assert "# pass 5" in out
