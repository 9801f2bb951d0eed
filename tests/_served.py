"""One real ``lethe serve`` process, with the surface of ``conftest.Lethe`` the TLS tests use.

An in-process server's shutdown (grpc aio ``Server.stop``) can hang with the
interpreter lock held once TLS connections were refused mid-handshake; in a
process of its own, a hang costs a SIGKILL instead of the test run. Tokens are
made with ``lethe token create`` beside it, as an operator makes them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import grpc
from _connect import ConnectChannel, ConnectStubs
from conftest import Client

ROOT = Path(__file__).resolve().parents[1]
LETHE = [sys.executable, "-m", "server.cli"]
FLAGS = {
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
    "client_ca": "--client-ca",
    "metrics_listen": "--metrics-listen",
}
"""``conftest.Lethe`` settings and the ``lethe serve`` flags that set them (a
``metrics_listen`` replaces the default ``off``)."""


class Served:
    """``lethe serve --json`` on ``data_dir`` (loopback, port 0, Connect on, no embedder).

    ``processes`` is ``--processes`` (``pids``: the serving processes, the
    supervisor's members when more than one). ``settings`` are paths keyed as
    in :data:`FLAGS`. The KEK is the caller's
    ``LETHE_KEK`` (the ``kek_env`` fixture). ``stop`` sends SIGTERM and, after
    ``grace`` seconds, SIGKILL.

    Raises:
        AssertionError: it exited, or printed no JSON document within 60 s.
    """

    def __init__(self, data_dir: Path, **settings: Any) -> None:
        processes = int(settings.pop("processes", 1))
        self.data_dir = data_dir
        self.clients: list[Client] = []
        self.channels: list[grpc.Channel] = []
        flags = [arg for key, path in settings.items() for arg in (FLAGS[key], str(path))]
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[str] = (data_dir.parent / f"{data_dir.name}.log").open("w")
        self.proc = subprocess.Popen(
            [
                *LETHE,
                "serve",
                "--json",
                "--data",
                str(data_dir),
                "--listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "off",
                "--embedder",
                "none",
                "--processes",
                str(processes),
                *flags,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        ready = self.ready = self._ready()
        self.port = int(ready["port"])
        self.http_port = int(str(ready["http_listen"]).rpartition(":")[2])
        self.pids: list[int] = [int(p) for p in ready.get("pids", [self.proc.pid])]

    def _ready(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        text, deadline = "", time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            text += line
            if line.rstrip() == "}":
                return dict(json.loads(text))
        self.stop()
        log = (self.data_dir.parent / f"{self.data_dir.name}.log").read_text()
        raise AssertionError(f"lethe serve gave no JSON document: {text!r}\n{log}")

    def token(self, *owners: str) -> str:
        """A new bearer token for ``owners``, from ``lethe token create``."""
        made = subprocess.run(
            [*LETHE, "token", "create", "--data", str(self.data_dir)]
            + [arg for owner in owners for arg in ("--owner", owner)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        return made.stdout.strip()

    def client(self, *, token: str, **kwargs: Any) -> Client:
        """``conftest.Client`` on a new channel with ``token``; closed at stop."""
        client = Client(f"127.0.0.1:{self.port}", token, **kwargs)
        self.clients.append(client)
        return client

    def connect(self, codec: str = "proto", **kwargs: Any) -> ConnectStubs:
        """Stubs over its Connect listener, as ``conftest.Lethe.connect``."""
        return ConnectStubs(ConnectChannel(f"127.0.0.1:{self.http_port}", codec=codec, **kwargs))

    def stop(self, grace: float = 10.0) -> None:
        """Close what the test opened, SIGTERM the server, SIGKILL it after ``grace`` seconds."""
        for client in self.clients:
            client.close()
        for channel in self.channels:
            channel.close()
        self.clients.clear()
        self.channels.clear()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
