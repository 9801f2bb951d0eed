"""Shared fixtures: a real Lethe server on loopback with a real channel.

``lethe`` starts the real server (LMDB, keystore, FAISS, WordLlama) on port 0
in a temporary data directory, with the KEK held in the ``LETHE_KEK``
environment variable so nothing is written to the user's config directory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lethe._rpc import Stubs
from server import LetheServer, ServerConfig, new_token, principal_record, token_digest
from shredder import KekRing

Client = Stubs
"""Stubs bound to one token: ``.channel``, ``.token``, ``.md`` and a stub per
service (``.threads``, ``.memories``, ``.retrieval``, ``.lifecycle``,
``.repairs``, ``.events``, ``.health``); the clients' own holder."""


class Lethe:
    """A running server plus helpers; ``restart`` reopens the same data directory."""

    def __init__(self, data_dir: Path, **config: Any) -> None:
        self.data_dir = data_dir
        self.config = config
        self.server: LetheServer | None = None
        self.channels: list[grpc.Channel] = []
        self.start()

    def start(self) -> None:
        cfg = ServerConfig(
            data_dir=self.data_dir,
            listen="127.0.0.1:0",
            metrics_listen=None,
            **{"sweep_interval": 0.0, **self.config},
        )
        self.server = LetheServer(cfg)
        self.port = self.server.start()

    def stop(self) -> None:
        for ch in self.channels:
            ch.close()
        self.channels.clear()
        if self.server is not None:
            self.server.stop(grace=1.0)
            self.server = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def token(self, *owners: str, admin: bool = False) -> str:
        assert self.server is not None
        token = new_token()
        self.server.store.put_token(token_digest(token), principal_record(owners, admin))
        return token

    def client(self, *owners: str, admin: bool = False, token: str | None = None) -> Client:
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.channels.append(channel)
        return Client(channel, token or self.token(*owners, admin=admin))


@pytest.fixture
def kek_env(monkeypatch: pytest.MonkeyPatch) -> str:
    value = KekRing.generate_env_value()
    monkeypatch.setenv("LETHE_KEK", value)
    return value


@pytest.fixture
def lethe(tmp_path: Path, kek_env: str) -> Iterator[Lethe]:
    server = Lethe(tmp_path / "data")
    yield server
    server.stop()


@pytest.fixture
def lethe_at(kek_env: str) -> Iterator[Callable[..., Lethe]]:
    """Start servers on chosen data directories with chosen settings; all stop at teardown."""
    started: list[Lethe] = []

    def start(data_dir: Path, **config: Any) -> Lethe:
        server = Lethe(data_dir, **config)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for subprocess servers)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
