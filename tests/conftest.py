"""Shared fixtures: a real Lethe server on loopback with a real channel.

``lethe`` starts the real server (LMDB, keystore, FAISS, WordLlama) on port 0
in a temporary data directory, with the KEK held in the ``LETHE_KEK``
environment variable so nothing is written to the user's config directory;
its Connect listener (HTTP) is on too, on another free port
(``Lethe.connect`` calls it).
``Lethe.client`` returns the typed client (:class:`lethe.client.Client`);
``api`` is what the portable client tests need (a target and tokens; see
``tests/lethe/light_conftest.py`` for its twin in the light client's venv).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from _connect import ConnectChannel, ConnectStubs

from lethe.client import Client as TypedClient
from lethe.locomo import find_locomo
from server import LetheServer, ServerConfig, new_token, principal_record, token_digest
from shredder import KekRing

WATCHDOG_SECONDS = 420
"""A test still running after this long is a process stuck with the interpreter lock
held, where pytest-timeout's 180 s cannot fire (its alarm handler needs the lock).
pytest's ``faulthandler_timeout`` (300 s, ``pyproject.toml``) prints every thread's
stack first; then a watchdog *process*, which needs no lock of ours, kills the run,
so CI fails in minutes with the stacks instead of hanging until its own limit."""
_WATCHDOG = """
import os, signal, sys, time
parent, beat, limit = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
while True:
    time.sleep(5)
    try:
        os.kill(parent, 0)
        age = time.time() - os.stat(beat).st_mtime
    except OSError:
        sys.exit(0)
    if age > limit:
        print(f"test watchdog: no test ended for {age:.0f} s; killing pytest", file=sys.stderr)
        os.kill(parent, signal.SIGKILL)
        sys.exit(1)
"""


@pytest.fixture(scope="session", autouse=True)
def _watchdog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The watchdog process of :data:`WATCHDOG_SECONDS`; yields its heartbeat file."""
    beat = tmp_path_factory.mktemp("watchdog") / "heartbeat"
    beat.touch()
    proc = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(beat), str(WATCHDOG_SECONDS)]
    )
    try:
        yield beat
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(autouse=True)
def _heartbeat(_watchdog: Path) -> Iterator[None]:
    """Each test's setup and teardown tell the watchdog the run is alive."""
    _watchdog.touch()
    yield
    _watchdog.touch()


class Client(TypedClient):
    """The typed client, plus shorthands for the raw stubs on its channel.

    The wire-level tests call the stubs directly
    (``c.threads.CreateThread(req, metadata=c.md)``): ``.channel``, ``.token``,
    ``.md`` and ``.threads``, ``.memories``, ``.retrieval``, ``.lifecycle``,
    ``.repairs``, ``.events``, ``.health``.
    """

    def __init__(self, target: str, token: str, **kwargs: Any) -> None:
        super().__init__(target, token, **kwargs)
        s = self.stubs
        # Over TLS the channel's call credentials carry the token: md is empty.
        self.channel, self.token, self.md = s.channel, token, self.metadata
        self.threads, self.memories, self.retrieval = s.threads, s.memories, s.retrieval
        self.lifecycle, self.repairs, self.events, self.health = (
            s.lifecycle,
            s.repairs,
            s.events,
            s.health,
        )


class Lethe:
    """A running server plus helpers; ``restart`` reopens the same data directory."""

    def __init__(self, data_dir: Path, **config: Any) -> None:
        self.data_dir = data_dir
        self.config = config
        self.server: LetheServer | None = None
        self.clients: list[TypedClient] = []
        self.channels: list[grpc.Channel] = []  # raw channels a test opened itself
        self.port = 0
        self.http_port = 0
        self.start()

    def start(self, *, same_port: bool = False) -> None:
        http = f"127.0.0.1:{self.http_port if same_port else 0}"
        cfg = ServerConfig(
            data_dir=self.data_dir,
            listen=f"127.0.0.1:{self.port if same_port else 0}",
            metrics_listen=None,
            **{"sweep_interval": 0.0, "http_listen": http, **self.config},
        )
        self.server = LetheServer(cfg)
        self.port = self.server.start()
        self.http_port = self.server.http_port

    def stop(self, *, keep_clients: bool = False) -> None:
        if not keep_clients:
            for client in self.clients:
                client.close()
            self.clients.clear()
        for ch in self.channels:
            ch.close()
        self.channels.clear()
        if self.server is not None:
            self.server.stop(grace=1.0)
            self.server = None

    def restart(self, *, same_port: bool = False) -> None:
        """Stop and start again on the same data directory.

        With ``same_port`` on the same port, and clients made before stay open
        (they reconnect).
        """
        self.stop(keep_clients=same_port)
        self.start(same_port=same_port)

    def connect(self, codec: str = "proto", **kwargs: Any) -> ConnectStubs:
        """Stubs over the Connect listener (``codec`` ``proto`` or ``json``); see ``_connect``."""
        return ConnectStubs(ConnectChannel(f"127.0.0.1:{self.http_port}", codec=codec, **kwargs))

    def stubs(self, transport: str, client: TypedClient) -> Any:
        """``client``'s own stubs over gRPC, or stubs over Connect (see :func:`transport`).

        Either way ``.threads.GetThread(request, metadata=…)``; over Connect
        the caller passes the token as metadata (``client.md``).
        """
        if transport == "grpc":
            return client
        return self.connect(transport.removeprefix("connect-"))

    def token(self, *owners: str, admin: bool = False) -> str:
        assert self.server is not None
        token = new_token()
        self.server.store.put_token(token_digest(token), principal_record(owners, admin))
        return token

    def client(
        self, *owners: str, admin: bool = False, token: str | None = None, **kwargs: Any
    ) -> Client:
        """A typed client on a new channel, with a new token for ``owners`` (or ``token``).

        ``kwargs`` go to :class:`lethe.client.Client`. Closed at stop.
        """
        client = Client(
            f"127.0.0.1:{self.port}", token or self.token(*owners, admin=admin), **kwargs
        )
        self.clients.append(client)
        return client


TRANSPORTS = ("grpc", "connect-proto")
"""The transports an edge test runs over: gRPC, and Connect over HTTP (binary)."""


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Each transport in turn (:data:`TRANSPORTS`); ``Lethe.stubs`` calls over it."""
    return str(request.param)


@pytest.fixture
def locomo_path() -> Path:
    """``../shared/data/locomo/locomo10.json``, the LoCoMo data set.

    A test that needs it skips on a developer machine without it and fails
    under ``CI`` (which has it beside the clone).
    """
    path = find_locomo()
    if path is None:
        why = "../shared/data/locomo/locomo10.json is not beside this checkout"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI has ../shared beside the clone")
        pytest.skip(why)
    return path


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


@dataclass(frozen=True)
class Api:
    """Where the portable client tests call (``tests/lethe/test_client*.py``).

    Attributes:
        target: ``HOST:PORT`` of the running server.
        admin: an admin token.
        limited: a token allowed to act for ``limited_owner`` only.
        limited_owner: the owner id ``limited`` may act for.
        owner: a fresh owner id for this test.
    """

    target: str
    admin: str
    limited: str
    limited_owner: str
    owner: str

    @property
    def parent(self) -> str:
        return f"owners/{self.owner}"


@pytest.fixture
def api(lethe: Lethe) -> Api:
    return Api(
        target=f"127.0.0.1:{lethe.port}",
        admin=lethe.token(admin=True),
        limited=lethe.token("limited-owner"),
        limited_owner="limited-owner",
        owner=f"o{secrets.token_hex(6)}",
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for subprocess servers)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
