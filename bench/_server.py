"""One ``lethe serve`` for a benchmark, with an admin token and a throwaway data directory.

The server runs in its own process: client and server must not share a GIL.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from shredder import KekRing


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(*serve_args: str) -> Iterator[tuple[int, str]]:
    """Start ``lethe serve`` on a free port and yield ``(port, admin token)``.

    Extra ``lethe serve`` flags come in ``serve_args``; the server is stopped on exit.

    Raises:
        RuntimeError: the server did not report that it is serving.
    """
    data = Path(tempfile.mkdtemp(prefix="lethe-bench-")) / "data"
    env = {**os.environ, "LETHE_KEK": KekRing.generate_env_value()}
    port = free_port()
    lethe = [sys.executable, "-m", "server.cli"]
    # Its log (stderr) to a file: log lines (faiss loading) come before the
    # ready line, which is the first line of stdout.
    log = data.parent / "serve.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [*lethe, "serve", "--data", str(data), "--listen", f"127.0.0.1:{port}", *serve_args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "serving" not in line:
            proc.kill()
            raise RuntimeError(f"lethe serve did not start: {line}{log.read_text()[-3000:]}")
        token = subprocess.run(
            [*lethe, "token", "create", "--data", str(data), "--admin"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        yield port, token
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
