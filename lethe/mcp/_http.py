"""``lethe mcp --transport http``: MCP over streamable HTTP, one Lethe token per request.

Every HTTP request must carry ``Authorization: Bearer <Lethe token>``.
:class:`BearerGate`, an ASGI middleware in front of the SDK's streamable
HTTP app, answers before any MCP processing:

- ``401`` (``WWW-Authenticate: Bearer``) without a bearer token
  (``MISSING_TOKEN``), or with one the Lethe server refuses (``INVALID_TOKEN``);
- ``400`` when the request names no owner (neither an ``X-Lethe-Owner``
  header nor ``--owner``) or a malformed owner or thread (``BAD_FIELD``);
- ``403`` when the token may not act for that owner (``OWNER_NOT_ALLOWED``);
- ``503`` when the Lethe server cannot be reached (``UNAVAILABLE``).

The body is ``{"error": {"reason", "message"}}``. The check is a cheap
authenticated call made with the request's own token
(``ListThreads(owners/{owner}, page_size=1)``: the server authenticates the
token, then checks the owner); a success is remembered for
:data:`VERIFIED_TTL_SECONDS` per (token digest, owner), a refusal is not.
The gate only keeps strangers out of the MCP layer: every tool call is then
made with the request's own token, so the Lethe server decides every read
and write itself, as for any client, and a token revoked meanwhile is
refused there.

Who a call acts for (:class:`Principals`): the owner of ``X-Lethe-Owner``
(else ``--owner``), the default thread of ``X-Lethe-Thread`` (else
``--thread``), and a :class:`lethe.client.AsyncClient` for the request's
token (one channel per token, the :data:`MAX_CLIENTS` most recently used
kept open). One endpoint thus serves several principals, each with its own
token. The MCP transport runs stateless, answering JSON: no MCP session
outlives its request, so none can be reused under another token.

Imports ``mcp`` and what it brings (starlette, uvicorn), ``lethe.client``,
``lethe.names`` and this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import signal
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from mcp.server import Server, ServerRequestContext
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from lethe.client import (
    AsyncClient,
    LetheError,
    PermissionDenied,
    TLSConfig,
    Unauthenticated,
    Unavailable,
)
from lethe.mcp._tools import Refusal, Session
from lethe.names import ID_PATTERN, ID_RE

__all__ = [
    "MAX_CLIENTS",
    "OWNER_HEADER",
    "THREAD_HEADER",
    "VERIFIED_TTL_SECONDS",
    "BearerGate",
    "Principals",
    "serve_http",
]

OWNER_HEADER = "x-lethe-owner"
"""The HTTP header naming the owner a request acts for (else ``--owner``)."""
THREAD_HEADER = "x-lethe-thread"
"""The HTTP header naming the request's default thread, an id or a full name (else ``--thread``)."""
VERIFIED_TTL_SECONDS = 30.0
"""How long a token found good for an owner is let through without asking again (seconds)."""
MAX_CLIENTS = 64
"""Most per-token client channels kept open (least recently used closed first)."""
MCP_PATH = "/mcp"
"""Where the streamable HTTP endpoint is served."""

_THREAD_RE = re.compile(f"(?:owners/{ID_PATTERN}/threads/)?{ID_PATTERN}")
"""A thread id, or a full thread name."""


def _bearer(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class Principals:
    """The callers of one HTTP endpoint: a client per token, and which tokens passed the gate.

    Args:
        target: ``HOST:PORT`` of the Lethe server.
        tls: as :class:`lethe.client.AsyncClient`'s ``tls``.
        owner: the owner of requests without ``X-Lethe-Owner`` ("" for none).
        thread: the default thread of requests without ``X-Lethe-Thread``.
        ttl: :data:`VERIFIED_TTL_SECONDS`.
        max_clients: :data:`MAX_CLIENTS`.
    """

    def __init__(
        self,
        target: str,
        *,
        tls: TLSConfig | bool | None,
        owner: str = "",
        thread: str = "",
        ttl: float = VERIFIED_TTL_SECONDS,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.target = target
        self.tls = tls
        self.owner = owner
        self.thread = thread
        self.ttl = ttl
        self.max_clients = max_clients
        self._clients: OrderedDict[str, AsyncClient] = OrderedDict()
        self._verified: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()

    def client_for(self, token: str) -> AsyncClient:
        """The client bound to ``token`` (made on first use; the oldest beyond the bound closed)."""
        key = hashlib.sha256(token.encode()).hexdigest()
        client = self._clients.get(key)
        if client is not None:
            self._clients.move_to_end(key)
            return client
        client = AsyncClient(self.target, token, tls=self.tls)
        self._clients[key] = client
        while len(self._clients) > self.max_clients:
            _, old = self._clients.popitem(last=False)
            task = asyncio.get_running_loop().create_task(old.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return client

    def owner_of(self, headers: Headers) -> str:
        """The owner a request acts for: ``X-Lethe-Owner``, else the default ("" for none)."""
        return headers.get(OWNER_HEADER, "").strip() or self.owner

    def thread_of(self, headers: Headers) -> str:
        """The request's default thread: ``X-Lethe-Thread``, else the default ("" for none)."""
        return headers.get(THREAD_HEADER, "").strip() or self.thread

    async def verify(self, token: str, owner: str) -> None:
        """Check with the Lethe server that ``token`` may act for ``owner`` (cached on success).

        Raises:
            Unauthenticated: the token is unknown, expired or revoked.
            PermissionDenied: it may not act for ``owner``.
            LetheError: any other refusal (``UNAVAILABLE`` when unreachable).
        """
        key = (hashlib.sha256(token.encode()).hexdigest(), owner)
        now = time.monotonic()
        until = self._verified.get(key)
        if until is not None and until > now:
            return
        await self.client_for(token).list_threads(f"owners/{owner}", page_size=1)
        self._verified[key] = now + self.ttl
        self._verified.move_to_end(key)
        while len(self._verified) > 16 * self.max_clients:
            self._verified.popitem(last=False)

    async def session_for(self, ctx: ServerRequestContext[Any, Any]) -> Session:
        """The session of one tool call: the request's token, owner and thread.

        Raises:
            Refusal: ``MISSING_TOKEN`` when the call came without an HTTP
                request or token (the gate lets none through).
        """
        request = ctx.request
        headers: Headers | None = getattr(request, "headers", None)
        token = _bearer(headers.get("authorization")) if headers is not None else None
        if headers is None or token is None:
            raise Refusal("MISSING_TOKEN", "this call carried no bearer token")
        return Session(self.client_for(token), self.owner_of(headers), self.thread_of(headers))

    async def close(self) -> None:
        """Close every client channel."""
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            await client.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _refusal(status: int, reason: str, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="lethe"'} if status == 401 else None
    if status == 401 and reason == "INVALID_TOKEN":
        headers = {"WWW-Authenticate": 'Bearer realm="lethe", error="invalid_token"'}
    return JSONResponse(
        {"error": {"reason": reason, "message": message}}, status_code=status, headers=headers
    )


class BearerGate:
    """ASGI middleware: no request reaches MCP without a Lethe token good for its owner.

    Args:
        app: the SDK's streamable HTTP app.
        principals: the endpoint's :class:`Principals`.
    """

    def __init__(self, app: ASGIApp, principals: Principals) -> None:
        self.app = app
        self.principals = principals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a refusal, or pass the request on to MCP (lifespan events pass through)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = await self._check(Headers(scope=scope))
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _check(self, headers: Headers) -> JSONResponse | None:
        token = _bearer(headers.get("authorization"))
        if token is None:
            return _refusal(
                401,
                "MISSING_TOKEN",
                "send Authorization: Bearer <a Lethe token> with every request",
            )
        owner = self.principals.owner_of(headers)
        if not owner:
            return _refusal(
                400, "BAD_FIELD", "no owner: send X-Lethe-Owner, or start lethe mcp with --owner"
            )
        if not ID_RE.fullmatch(owner):
            return _refusal(
                400, "BAD_FIELD", "X-Lethe-Owner: owner ids match [a-z0-9][a-z0-9-]{0,62}"
            )
        thread = self.principals.thread_of(headers)
        if thread and not _THREAD_RE.fullmatch(thread):
            return _refusal(
                400, "BAD_FIELD", "X-Lethe-Thread: a thread id or owners/{o}/threads/{t}"
            )
        try:
            await self.principals.verify(token, owner)
        except Unauthenticated as err:
            return _refusal(401, err.reason_name or "INVALID_TOKEN", "Lethe refused this token")
        except PermissionDenied as err:
            return _refusal(
                403, err.reason_name or "OWNER_NOT_ALLOWED", f"this token may not act for {owner}"
            )
        except Unavailable as err:
            return _refusal(
                503, err.reason_name or "UNAVAILABLE", "the Lethe server is unreachable"
            )
        except LetheError as err:
            return _refusal(502, err.reason_name or err.code().name, "the Lethe server refused")
        return None


class _Web(uvicorn.Server):
    """uvicorn's server, stopping gracefully on SIGINT or SIGTERM and then returning.

    uvicorn raises the caught signal again once it has shut down (so the
    process dies of it); ``lethe mcp`` returns instead and exits 0, as
    ``lethe serve`` does.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Stop on SIGINT and SIGTERM while serving; restore the handlers after."""
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``[::1]`` for IPv6).

    Raises:
        OSError: the address cannot be bound (taken, not local, …).
    """
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


async def serve_http(
    server: Server[Any],
    principals: Principals,
    *,
    host: str,
    port: int,
    certfile: str | None = None,
    keyfile: str | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``server`` over streamable HTTP at ``/mcp`` behind :class:`BearerGate`, until stopped.

    Stops gracefully on SIGINT or SIGTERM and returns, having closed every client channel.

    Args:
        server: from :func:`lethe.mcp._server.build_server` with
            ``principals.session_for``.
        principals: who the requests act for.
        host: the address to listen on (``127.0.0.1``, ``0.0.0.0``, ``[::1]``).
        port: the TCP port; 0 picks a free one.
        certfile: PEM certificate chain to serve HTTPS with (with ``keyfile``).
        keyfile: its PEM private key.
        ready: called with the endpoint's URL once it listens.

    Raises:
        OSError: the address cannot be bound.
    """
    sock = _bind(host, port)
    app = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        json_response=True,
        host=host.strip("[]"),
    )
    config = uvicorn.Config(
        BearerGate(app, principals),
        loop="asyncio",
        lifespan="on",
        log_level="warning",
        access_log=False,
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
    )
    web = _Web(config)
    task = asyncio.get_running_loop().create_task(web.serve(sockets=[sock]))
    try:
        while not web.started and not task.done():
            await asyncio.sleep(0.02)
        if web.started and ready is not None:
            bound = sock.getsockname()
            shown = f"[{bound[0]}]" if sock.family == socket.AF_INET6 else bound[0]
            scheme = "https" if certfile else "http"
            ready(f"{scheme}://{shown}:{bound[1]}{MCP_PATH}")
        await task
    finally:
        sock.close()
        await principals.close()
