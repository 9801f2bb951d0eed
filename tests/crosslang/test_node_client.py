"""The Node.js client in ``tests/crosslang/node/`` (``npm test``) against the real server.

In plaintext with explicit metadata and over TLS with gRPC's call credentials.
``scripts/test.sh`` runs ``npm ci`` first; without Node or ``node_modules`` the
test is skipped, except under CI, where it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from _pki import make_pki
from conftest import Lethe

NODE_DIR = Path(__file__).resolve().parent / "node"


def _require_node() -> str:
    npm = shutil.which("npm")
    if npm is None or not (NODE_DIR / "node_modules").is_dir():
        reason = "npm, or node_modules (run `npm ci` in tests/crosslang/node), is missing"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the Node client")
        pytest.skip(reason)
    return npm


def _npm_test(npm: str, target: str, token: str, **extra: str) -> str:
    env = {**os.environ, "LETHE_TARGET": target, "LETHE_TOKEN": token, **extra}
    result = subprocess.run(
        [npm, "test"], cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result.stdout


@pytest.mark.parametrize("transport", ["plaintext", "tls"])
def test_node_client_against_the_real_server(
    lethe_at: Callable[..., Lethe], tmp_path: Path, transport: str
) -> None:
    npm = _require_node()
    extra: dict[str, str] = {}
    config: dict[str, Path] = {}
    if transport == "tls":
        pki = make_pki(tmp_path / "pki")
        config = {"tls_cert": pki.server_cert, "tls_key": pki.server_key}
        extra = {"LETHE_CA": str(pki.ca)}
    srv = lethe_at(tmp_path / "d", **config)
    out = _npm_test(npm, f"127.0.0.1:{srv.port}", srv.token("node-interop"), **extra)
    assert "# pass 1" in out
    assert "# fail 0" in out
