"""Real ``lethe serve`` processes for the multi-shard tests, and the ``lethe`` CLI beside them.

Each has its own data directory and KEK (in its environment).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
LETHE = [sys.executable, "-m", "server.cli"]


@dataclass
class ShardProc:
    name: str
    data: Path
    kek: str
    port: int
    metrics_port: int = 0
    http_port: int = 0
    proc: subprocess.Popen[str] | None = None
    log: IO[str] | None = None
    kek_file: Path | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_address(self) -> str:
        """Its Connect listener (``--http-listen``; ``http_port`` 0: none)."""
        return f"127.0.0.1:{self.http_port}"

    def env(self) -> dict[str, str]:
        """The environment of its server and of ``lethe`` beside it.

        The KEK is in ``LETHE_KEK``, or in a KEK file (``LETHE_KEK_FILE``) when
        ``kek_file`` is set.
        """
        env = {k: v for k, v in os.environ.items() if k not in ("LETHE_KEK", "LETHE_KEK_FILE")}
        if self.kek_file is not None:
            return env | {"LETHE_KEK_FILE": str(self.kek_file)}
        return env | {"LETHE_KEK": self.kek}


def start_shard(shard: ShardProc, log: Path, *extra: str) -> None:
    env = shard.env()
    shard.log = log.open("w")
    shard.proc = subprocess.Popen(
        [
            *LETHE,
            "serve",
            "--data",
            str(shard.data),
            "--listen",
            shard.address,
            "--metrics-listen",
            f"127.0.0.1:{shard.metrics_port}" if shard.metrics_port else "off",
            "--embedder",
            "none",
            "--require-owner-header",
            *(["--http-listen", shard.http_address] if shard.http_port else []),
            *extra,
        ],
        env=env,
        cwd=ROOT,
        stdout=shard.log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(path: Path, text: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {path.read_text()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {text!r}: {path.read_text()}")


def lethe_cli(shard: ShardProc, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``lethe ARGS`` beside a running shard (its KEK, or KEK file, in the environment)."""
    return subprocess.run(
        [*LETHE, *args],
        env=shard.env(),
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


def shared_token(shards: list[ShardProc]) -> str:
    """An admin token made on the first shard and imported on the others, as an operator does it.

    With ``lethe token create``, then ``lethe shard token-import``.
    """
    made = lethe_cli(shards[0], "token", "create", "--data", str(shards[0].data), "--admin")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    for shard in shards[1:]:
        data = ["--data", str(shard.data)]
        done = lethe_cli(shard, "shard", "token-import", *data, "--admin", stdin=token + "\n")
        assert done.returncode == 0, done.stderr
        again = lethe_cli(shard, "shard", "token-import", *data, "--admin", stdin=token + "\n")
        assert again.returncode == 1, again.stderr  # stored once
        bad = lethe_cli(shard, "shard", "token-import", *data, "--admin", stdin="lethe_short\n")
        assert bad.returncode == 1
        assert "no lethe token" in bad.stderr
    return token


def stop_shard(shard: ShardProc) -> None:
    """SIGTERM the shard's server (SIGKILL after 15 s) and close its log."""
    if shard.proc is not None and shard.proc.poll() is None:
        shard.proc.terminate()
        try:
            shard.proc.wait(15)
        except subprocess.TimeoutExpired:
            shard.proc.kill()
            shard.proc.wait()
    if shard.log is not None:
        shard.log.close()


@contextlib.contextmanager
def running_shards(shards: Iterable[ShardProc], work: Path) -> Iterator[None]:
    """Start every shard's server, wait until each serves, stop them all on exit whatever happened.

    Each logs to ``work/NAME.log``.
    """
    started = list(shards)
    try:
        for shard in started:
            start_shard(shard, work / f"{shard.name}.log")
        for shard in started:
            assert shard.proc is not None
            wait_for(work / f"{shard.name}.log", "lethe serving", shard.proc)
        yield
    finally:
        for shard in started:
            stop_shard(shard)
