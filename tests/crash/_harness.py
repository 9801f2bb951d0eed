"""Real ``lethe serve`` processes for crash tests, and the offline ``lethe audit``.

Each is started on a data directory with a chosen environment
(``LETHE_FAILPOINTS`` to arm a crash point), waited for, SIGTERMed or found
SIGKILLed.

Nothing here mocks anything: each server is a child process of the test
running the real CLI on a real data directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lethe._rpc import Stubs

OWNER = "alice"
LETHE = [sys.executable, "-m", "server.cli"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_token(data: Path, env: dict[str, str], *owners: str) -> str:
    """Create a store at ``data`` if needed and return a bearer token for ``owners``.

    The token is admin when ``owners`` is empty. Made in this process, as
    ``lethe token create`` would (the server is not running yet).
    """
    from server import Store, new_token, principal_record, token_digest

    saved = {k: os.environ.get(k) for k in ("LETHE_KEK",)}
    os.environ.update({k: env[k] for k in saved if k in env})
    try:
        kek = env.get("TEST_KEK_FILE")
        store = Store(data, kek_file=Path(kek) if kek else None, lock=False)
        try:
            token = new_token()
            store.put_token(token_digest(token), principal_record(list(owners), not owners))
        finally:
            store.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return token


def _kek_args(env: dict[str, str]) -> list[str]:
    kek = env.get("TEST_KEK_FILE")
    return ["--kek-file", kek] if kek else []


class Server:
    """One ``lethe serve`` child process (see :func:`serving`)."""

    def __init__(self, data: Path, env: dict[str, str], *extra: str) -> None:
        self.port = free_port()
        self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115 -- closed by stop()
        self._logged = ""
        self.proc = subprocess.Popen(
            [
                *LETHE,
                "serve",
                "--data",
                str(data),
                "--listen",
                f"127.0.0.1:{self.port}",
                "--metrics-listen",
                "off",
                "--embedder",
                "none",
                "--sweep-interval",
                "1h",
                *_kek_args(env),
                *extra,
            ],
            env=env,
            stdout=subprocess.PIPE,
            # A file, not a pipe: a pipe nobody reads fills up and blocks the
            # server's logging; the log is there to read whenever a check fails.
            stderr=self._log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        # --processes N: "... (N processes: PID, PID)"; one process: its own pid
        listed = line.partition("processes: ")[2].rstrip().rstrip(")")
        self.pids = [int(p) for p in listed.split(", ")] if listed else [self.proc.pid]
        if "serving" not in line:
            self.proc.wait(timeout=30)
            err = self.stderr()
            self.stop()
            raise RuntimeError(
                f"lethe serve did not start (exit {self.proc.returncode}): {line}{err}"
            )

    def stubs(self, token: str) -> Stubs:
        return Stubs.insecure(f"127.0.0.1:{self.port}", token)

    def crash(self) -> None:
        """SIGKILL every serving process (the members first, then the supervisor)."""
        for pid in [p for p in self.pids if p != self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(timeout=30)

    def killed(self, timeout: float = 30.0) -> bool:
        """Whether the process died of SIGKILL (a failpoint) within ``timeout`` s."""
        try:
            return self.proc.wait(timeout=timeout) == -9
        except subprocess.TimeoutExpired:
            return False

    def stderr(self) -> str:
        """What the server has logged so far (all of it, once stopped)."""
        if self._log.closed:
            return self._logged
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if not self._log.closed:
            self._logged = self.stderr()
            self._log.close()


@contextlib.contextmanager
def serving(data: Path, env: dict[str, str], *extra: str) -> Iterator[Server]:
    """A server for the block; stopped (SIGTERM) or reaped afterwards."""
    server = Server(data, env, *extra)
    try:
        yield server
    finally:
        server.stop()


def audit(data: Path, env: dict[str, str]) -> tuple[int, str]:
    """``lethe audit --data DATA``: (exit status, output)."""
    done = subprocess.run(
        [*LETHE, "audit", "--data", str(data), *_kek_args(env)],
        env=env,
        capture_output=True,
        text=True,
    )
    return done.returncode, done.stdout + done.stderr


def armed(env: dict[str, str], point: str, action: str = "kill") -> dict[str, str]:
    """``env`` with one failpoint armed."""
    return {**env, "LETHE_FAILPOINTS": f"{point}={action}"}


def base_env(kek: str) -> dict[str, str]:
    """The environment of a test server: ``LETHE_KEK`` set, no failpoint armed."""
    env = {k: v for k, v in os.environ.items() if k != "LETHE_FAILPOINTS"}
    env["LETHE_KEK"] = kek
    return env
