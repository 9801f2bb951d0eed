"""TLS and mutual TLS with certificates made at test time.

The token is still required over TLS; gRPC's own call credentials carry it; a
plaintext client, a client without a certificate (mTLS) or with one from
another CA cannot connect; bad TLS flags are refused before anything is served.
Each server is a real ``lethe serve`` process (see ``_served``).
The Connect listener serves TLS from the same files, with ALPN (``h2``,
``http/1.1``) and the same client-certificate rule.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from _connect import ConnectStubs
from _helpers import append, create_thread, error_reason, get_turn
from _pki import Pki, make_pki
from _served import Served
from conftest import Client

from lethe._rpc import Stubs
from lethe.client import TLSConfig
from lethe.v1 import threads_pb2
from server import LetheServer, ServerConfig


@pytest.fixture
def served(kek_env: str) -> Iterator[Callable[..., Served]]:
    """Start ``lethe serve`` processes with chosen TLS files; all stop at teardown."""
    started: list[Served] = []

    def start(data_dir: Path, **settings: Path) -> Served:
        started.append(Served(data_dir, **settings))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _secure(srv: Served, pki: Pki, token: str, *, client: str | None = None) -> Client:
    key = pki.read(f"{client}_key") if client else None
    cert = pki.read(f"{client}_cert") if client else None
    tls = TLSConfig(root_certificates=pki.read("ca"), private_key=key, certificate_chain=cert)
    return srv.client(token=token, tls=tls, retry=None)


def _list_threads(
    c: Stubs | Client | ConnectStubs, md: tuple[tuple[str, str], ...] = ()
) -> list[str]:
    resp = c.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent="owners/alice"),
        metadata=md or getattr(c, "md", ()),
        timeout=10,
    )
    return [t.name for t in resp.threads]


def _refusal(fn: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return error_reason(info.value)


def test_tls_serves_with_the_token_as_call_credentials(
    served: Callable[..., Served], tmp_path: Path, pki: Pki
) -> None:
    srv = served(tmp_path / "d", tls_cert=pki.server_cert, tls_key=pki.server_key)
    c = _secure(srv, pki, srv.token("alice"))
    assert c.md == ()  # gRPC attaches the token itself over TLS
    thread = create_thread(c, "alice")
    (turn,) = append(c, thread, ["said over TLS"], commit=True)
    assert get_turn(c, turn.name).text == "said over TLS"
    assert _list_threads(c) == [thread]


def test_tls_still_requires_the_token(
    served: Callable[..., Served], tmp_path: Path, pki: Pki
) -> None:
    srv = served(tmp_path / "d", tls_cert=pki.server_cert, tls_key=pki.server_key)
    creds = grpc.ssl_channel_credentials(pki.read("ca"))
    channel = grpc.secure_channel(f"127.0.0.1:{srv.port}", creds)
    srv.channels.append(channel)
    bare = Stubs(channel, "")
    code, reason = _refusal(lambda: _list_threads(bare, md=(("x-other", "1"),)))
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN")
    bob = _secure(srv, pki, srv.token("bob"))
    assert _refusal(lambda: _list_threads(bob)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "OWNER_NOT_ALLOWED",
    )


def test_plaintext_client_cannot_talk_to_a_tls_server(
    served: Callable[..., Served], tmp_path: Path, pki: Pki
) -> None:
    srv = served(tmp_path / "d", tls_cert=pki.server_cert, tls_key=pki.server_key)
    plain = Stubs.insecure(f"127.0.0.1:{srv.port}", srv.token("alice"))
    srv.channels.append(plain.channel)
    code, _ = _refusal(lambda: _list_threads(plain))
    assert code == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate_from_the_ca(
    served: Callable[..., Served], tmp_path: Path, pki: Pki
) -> None:
    srv = served(tmp_path / "d", tls_cert=pki.server_cert, tls_key=pki.server_key, client_ca=pki.ca)
    token = srv.token("alice")
    good = _secure(srv, pki, token, client="client")
    thread = create_thread(good, "alice")
    assert _list_threads(good) == [thread]
    for who in (None, "stranger"):
        refused = _secure(srv, pki, token, client=who)
        code, _ = _refusal(lambda c=refused: _list_threads(c))  # type: ignore[misc]
        assert code == grpc.StatusCode.UNAVAILABLE, who
    # A certificate is not a token: with the certificate and no token, refused.
    creds = grpc.ssl_channel_credentials(
        pki.read("ca"), pki.read("client_key"), pki.read("client_cert")
    )
    channel = grpc.secure_channel(f"127.0.0.1:{srv.port}", creds)
    srv.channels.append(channel)
    code, reason = _refusal(lambda: _list_threads(Stubs(channel, ""), md=(("x-other", "1"),)))
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tls_cert": "server_cert"}, "go together"),
        ({"tls_key": "server_key"}, "go together"),
        ({"client_ca": "ca"}, "needs --tls-cert"),
        ({"tls_cert": "server_key", "tls_key": "server_key", "client_ca": "none"}, "PEM"),
    ],
)
def test_bad_tls_settings_are_refused_before_serving(
    tmp_path: Path, pki: Pki, kek_env: str, kwargs: dict[str, str], message: str
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    paths: dict[str, Any] = {k: junk if v == "none" else getattr(pki, v) for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=message):
        LetheServer(ServerConfig(data_dir=tmp_path / "d", metrics_listen=None, **paths))
    assert not (tmp_path / "d").exists()  # refused before the store was opened


def _https(srv: Served, pki: Pki, *, client: str | None = None) -> ConnectStubs:
    context = ssl.create_default_context(cafile=pki.ca)
    if client is not None:
        context.load_cert_chain(getattr(pki, f"{client}_cert"), getattr(pki, f"{client}_key"))
    return srv.connect(ssl_context=context)


def _alpn(port: int, pki: Pki, offered: list[str]) -> str | None:
    context = ssl.create_default_context(cafile=pki.ca)
    context.set_alpn_protocols(offered)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        return tls.selected_alpn_protocol()


def test_connect_over_tls_serves_http2_and_http1_and_still_requires_the_token(
    served: Callable[..., Served], tmp_path: Path, pki: Pki
) -> None:
    srv = served(tmp_path / "d", tls_cert=pki.server_cert, tls_key=pki.server_key)
    token = srv.token("alice")
    md = (("authorization", f"Bearer {token}"),)
    https = _https(srv, pki)
    thread = https.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent="owners/alice"), metadata=md
    ).name
    assert _list_threads(https, md=md) == [thread]
    assert _refusal(lambda: _list_threads(https, md=(("x-other", "1"),))) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "MISSING_TOKEN",
    )
    assert _alpn(srv.http_port, pki, ["h2", "http/1.1"]) == "h2"
    assert _alpn(srv.http_port, pki, ["http/1.1"]) == "http/1.1"
    plain = srv.connect()  # plaintext HTTP to the TLS listener
    with pytest.raises((OSError, http.client.HTTPException)):
        _list_threads(plain, md=md)


def test_connect_over_mutual_tls_needs_a_client_certificate_from_the_ca(
    served: Callable[..., Served], tmp_path: Path, pki: Pki
) -> None:
    srv = served(tmp_path / "d", tls_cert=pki.server_cert, tls_key=pki.server_key, client_ca=pki.ca)
    md = (("authorization", f"Bearer {srv.token('alice')}"),)
    good = _https(srv, pki, client="client")
    assert _list_threads(good, md=md) == []
    for who in (None, "stranger"):
        refused = _https(srv, pki, client=who)
        with pytest.raises((OSError, http.client.HTTPException)):
            _list_threads(refused, md=md)
    # A certificate is not a token.
    assert _refusal(lambda: _list_threads(good, md=(("x-other", "1"),))) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "MISSING_TOKEN",
    )
