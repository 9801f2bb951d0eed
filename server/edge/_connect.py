"""The ``lethe.v1`` methods over the Connect protocol: an ASGI application.

Connect (https://connectrpc.com/docs/protocol) carries the same RPCs as gRPC
over plain HTTP/1.1 or HTTP/2, so that ``curl``, a browser's ``fetch`` and an
edge runtime can call them; ``lethe serve --http-listen`` serves this
application beside the gRPC listener (:mod:`server._app`). What it speaks:

- **unary**: ``POST /lethe.v1.Threads/AppendTurns`` with ``Content-Type:
  application/json`` (proto3 JSON) or ``application/proto`` (binary); the
  response is the message in the same encoding, HTTP 200;
- **server streaming** (``Events.Watch``): ``Content-Type:
  application/connect+json`` or ``application/connect+proto``; the request
  and every response are enveloped (1 flags byte, a 4-byte big-endian length,
  the message) and the stream ends with an end-of-stream envelope (flags
  ``0x02``) holding ``{}`` or ``{"error": …}``;
- **errors**: ``{"code": "resource_exhausted", "message": …, "details":
  [{"type": "google.rpc.ErrorInfo", "value": base64, "debug": {…}}]}`` — the
  same ``google.rpc.Status`` a gRPC client gets, with its ``ErrorInfo``
  reason, ``RetryInfo``, ``BadRequest`` and ``PreconditionFailure``; a unary
  error has the HTTP status of its code (the protocol's table), a stream's
  error rides in its end-of-stream envelope after HTTP 200;
- ``Connect-Timeout-Ms`` (the call's deadline: ``deadline_exceeded``, and
  work not yet started is skipped), ``Content-Encoding`` /
  ``Connect-Content-Encoding`` ``identity`` or ``gzip`` on requests
  (responses are never compressed), ``Connect-Protocol-Version: 1``;
- **CORS** for the origins allowed (``--http-allow-origin``; none by
  default): a browser's preflight (``OPTIONS``) is answered, and every
  response to an allowed origin names it, so a web application on another
  origin can call the API (with its bearer token: never cookies).

Every call goes through the same stages as a gRPC call
(:mod:`server.edge._edge`): :meth:`Edge.identify` (drain, token, route) runs on
the headers **before the body is read**, then the body is read up to the
receive limit, then :meth:`Edge.unary` or :meth:`Edge.stream` (bounds,
decode on a worker, the servicer, encode), and every error goes through
:meth:`Edge.status`. The servicers are the very objects the gRPC server
registers. JSON requests are parsed strictly: an unknown field is
``MALFORMED_REQUEST``, not silently dropped (the binary encoding keeps unknown
fields, so newer clients stay compatible with it).

Why not connect-python's own ASGI application (``connectrpc``, 0.9): it
decodes the request on the event loop before any hook of ours runs, so it
would parse unauthenticated bodies, block the loop on large JSON, and answer
undecodable bytes ``unknown`` with the parser's text instead of
``INVALID_ARGUMENT`` / ``MALFORMED_REQUEST``; its interceptors run after
decoding. The protocol's server side is small (above), so it is served here
on the edge's own stages; connect-python's and connect-es' clients talk to it
(``tests/server/test_connect.py``, ``clients/typescript``).

Thread rules: the application runs on the server's event loop (one task per
request, as ASGI servers run them); the blocking work runs on the worker pool.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import orjson
from google.protobuf import descriptor_pool, json_format, message, message_factory
from google.rpc import code_pb2, status_pb2

from server._metrics import CallMeter
from server.edge._edge import PROTO, Codec, Edge, Method
from server.errors import MalformedRequest

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

ENVELOPE = struct.Struct(">BI")
"""An envelope's prefix: 1 flags byte, the message's length in 4 bytes, big-endian."""
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
GZIP_SLACK = 64 * 1024
"""Bytes a gzip body may exceed the receive limit by (gzip's headers and stored blocks)."""
MAX_ERROR_TEXT = 200
CORS_HEADERS = (
    "authorization, content-type, content-encoding, connect-protocol-version, "
    "connect-timeout-ms, connect-content-encoding, connect-accept-encoding, x-lethe-owner, "
    "x-user-agent"
)
"""Request headers a browser may send cross-origin: the protocol's and Lethe's."""
CORS_MAX_AGE = 7200
"""Seconds a browser may cache a preflight's answer."""
"""Characters of a JSON parser's complaint kept in a ``MALFORMED_REQUEST`` message."""

# https://connectrpc.com/docs/protocol#error-codes: the code names and their HTTP statuses.
_CONNECT_CODES: dict[int, tuple[str, int]] = {
    code_pb2.CANCELLED: ("canceled", 499),
    code_pb2.UNKNOWN: ("unknown", 500),
    code_pb2.INVALID_ARGUMENT: ("invalid_argument", 400),
    code_pb2.DEADLINE_EXCEEDED: ("deadline_exceeded", 504),
    code_pb2.NOT_FOUND: ("not_found", 404),
    code_pb2.ALREADY_EXISTS: ("already_exists", 409),
    code_pb2.PERMISSION_DENIED: ("permission_denied", 403),
    code_pb2.RESOURCE_EXHAUSTED: ("resource_exhausted", 429),
    code_pb2.FAILED_PRECONDITION: ("failed_precondition", 400),
    code_pb2.ABORTED: ("aborted", 409),
    code_pb2.OUT_OF_RANGE: ("out_of_range", 400),
    code_pb2.UNIMPLEMENTED: ("unimplemented", 501),
    code_pb2.INTERNAL: ("internal", 500),
    code_pb2.UNAVAILABLE: ("unavailable", 503),
    code_pb2.DATA_LOSS: ("data_loss", 500),
    code_pb2.UNAUTHENTICATED: ("unauthenticated", 401),
}
_GRPC_NAMES = {member.value[0]: member.name for member in grpc.StatusCode}


def _json_decode(request_type: type[message.Message], raw: bytes) -> message.Message:
    """Parse proto3 JSON strictly (unknown fields refused).

    Raises:
        MalformedRequest: not UTF-8 JSON of a ``request_type`` message; the
            message quotes the parser (the caller's own request), shortened.
    """
    request = request_type()
    try:
        json_format.Parse(raw, request)
    except Exception as exc:  # ParseError, UnicodeDecodeError, RecursionError
        why = str(exc)[:MAX_ERROR_TEXT]
        raise MalformedRequest(
            f"the request is not a valid {request_type.DESCRIPTOR.full_name} message "
            f"in proto3 JSON: {why}"
        ) from None
    return request


def _json_encode(response: message.Message) -> bytes:
    """Proto3 JSON: lowerCamelCase names, fields at their default left out."""
    return orjson.dumps(json_format.MessageToDict(response))


JSON = Codec("json", _json_decode, _json_encode)
"""proto3 JSON, Connect's ``application/json``."""


class _Refused(Exception):
    """A call refused by the protocol itself, before or beside the edge's stages.

    Args:
        code: a ``google.rpc.Code``.
        message: what the client is told.
        http_status: the status of a refusal that is not an RPC error (415,
            405), answered without a body; 0 for an RPC error.
        headers: extra response headers of such a refusal.
    """

    def __init__(
        self,
        code: int,
        message: str,
        *,
        http_status: int = 0,
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status_pb2.Status(code=code, message=message)
        self.http_status = http_status
        self.headers = list(headers)


@dataclass(frozen=True, slots=True)
class _Request:
    """What the headers of a call say."""

    method: Method
    codec: Codec
    metadata: tuple[tuple[str, str], ...]
    gzip: bool
    timeout: float | None
    content_length: int | None


def error_json(status: status_pb2.Status) -> dict[str, Any]:
    """A ``google.rpc.Status`` as Connect's error object.

    ``{"code", "message", "details": [{"type", "value", "debug"}]}``: the
    value is the detail's bytes in unpadded base64, ``debug`` the detail as
    JSON (for people reading it; clients decode ``value``).
    """
    name = _CONNECT_CODES.get(status.code, ("unknown", 500))[0]
    out: dict[str, Any] = {"code": name, "message": status.message}
    details = []
    for detail in status.details:
        type_name = detail.type_url.rpartition("/")[2]
        entry: dict[str, Any] = {
            "type": type_name,
            "value": base64.b64encode(detail.value).decode().rstrip("="),
        }
        with contextlib.suppress(KeyError):  # a type this process does not know
            found = descriptor_pool.Default().FindMessageTypeByName(type_name)
            debug = message_factory.GetMessageClass(found)()
            if detail.Unpack(debug):
                entry["debug"] = json_format.MessageToDict(debug)
        details.append(entry)
    if details:
        out["details"] = details
    return out


class ConnectApp:
    """The ASGI application serving ``methods`` over Connect through ``edge``.

    Args:
        edge: the call pipeline the gRPC server uses too.
        methods: every method served (:meth:`Edge.methods` of each servicer).
        meter: counts and times every call in the RPC metrics; None: not counted.
        max_receive_bytes: largest request message accepted (after
            decompression); a larger one is ``RESOURCE_EXHAUSTED``, unread.
        max_send_bytes: largest response message sent; a larger one is
            ``RESOURCE_EXHAUSTED``.
        allow_origins: the origins (``https://app.example``) whose browsers may
            call cross-origin; ``*`` for any; none by default.
    """

    def __init__(
        self,
        edge: Edge,
        methods: Iterable[Method],
        *,
        meter: CallMeter | None = None,
        max_receive_bytes: int = 16 << 20,
        max_send_bytes: int = 16 << 20,
        allow_origins: Iterable[str] = (),
    ) -> None:
        self._edge = edge
        self._methods = {m.path: m for m in methods}
        self._meter = meter
        self._max_receive = max_receive_bytes
        self._max_send = max_send_bytes
        self._origins = frozenset(allow_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope (``lifespan`` or ``http``)."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1003})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = self._methods.get(scope["path"])
        origin = self._allowed_origin(scope)
        if origin is not None:
            if scope["method"] == "OPTIONS" and method is not None:
                await _preflight(send, origin)
                return
            send = _with_cors(send, origin)
        try:
            request = self._headers(scope, method)
        except _Refused as refused:
            await _refuse(send, refused, streaming=bool(method and method.streaming))
            return
        call = (
            self._meter.start(request.method.path, request.method.streaming)
            if self._meter
            else None
        )
        code = "CANCELLED"
        try:
            if request.method.streaming:
                code = await self._stream(scope, receive, send, request)
            else:
                code = await self._unary(scope, receive, send, request)
        finally:
            if call is not None:
                call.received()
                call.done(code)

    def _allowed_origin(self, scope: Scope) -> bytes | None:
        """The request's ``Origin`` when CORS allows it, else None."""
        if not self._origins:
            return None
        origin = next((v for k, v in scope["headers"] if k.lower() == b"origin"), None)
        if origin is None:
            return None
        if "*" in self._origins or origin.decode("latin-1") in self._origins:
            return bytes(origin)
        return None

    def _headers(self, scope: Scope, method: Method | None) -> _Request:
        """Check what the request line and headers say, before anything else.

        Raises:
            _Refused: an unknown method (``unimplemented``, HTTP 404), another
                HTTP method than POST (405), a content type or compression not
                served (415, ``unimplemented``), or a bad protocol header.
        """
        if method is None:
            raise _Refused(
                code_pb2.UNIMPLEMENTED, f"no method {scope['path']} is served here", http_status=404
            )
        if scope["method"] != "POST":
            raise _Refused(
                code_pb2.UNIMPLEMENTED,
                "Connect calls are POSTed",
                http_status=405,
                headers=[(b"allow", b"POST")],
            )
        metadata = tuple(
            (k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]
        )
        headers = dict(metadata)
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        prefix = "application/connect+" if method.streaming else "application/"
        codec = {f"{prefix}json": JSON, f"{prefix}proto": PROTO}.get(content_type)
        if codec is None:
            accepted = f"{prefix}json, {prefix}proto"
            raise _Refused(
                code_pb2.UNIMPLEMENTED,
                f"{method.path} takes {accepted}",
                http_status=415,
                headers=[(b"accept-post", accepted.encode())],
            )
        version = headers.get("connect-protocol-version", "1")
        if version != "1":
            raise _Refused(code_pb2.INVALID_ARGUMENT, "connect-protocol-version must be 1")
        encoding_header = "connect-content-encoding" if method.streaming else "content-encoding"
        encoding = headers.get(encoding_header, "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise _Refused(
                code_pb2.UNIMPLEMENTED,
                f"{encoding_header} {encoding!r} is not served (identity, gzip)",
            )
        timeout = None
        if "connect-timeout-ms" in headers:
            value = headers["connect-timeout-ms"].strip()
            if not value.isdigit() or len(value) > 10:
                raise _Refused(
                    code_pb2.INVALID_ARGUMENT, "connect-timeout-ms must be 1 to 10 digits"
                )
            timeout = int(value) / 1000.0
        length = headers.get("content-length", "").strip()
        return _Request(
            method,
            codec,
            metadata,
            encoding == "gzip",
            timeout,
            int(length) if length.isdigit() else None,
        )

    async def _body(self, receive: Receive, request: _Request) -> bytes:
        """The request body, read only after the caller is identified, within the receive limit.

        The body may exceed the message limit by the envelope's prefix (a
        stream's request) and, gzipped, by :data:`GZIP_SLACK`; the message
        itself is checked once inflated (:meth:`_message`).

        Raises:
            _Refused: ``resource_exhausted`` past the limit (a declared length
                past it is refused before a byte is read); ``canceled`` when
                the client went away.
        """
        limit = self._max_receive + (ENVELOPE.size if request.method.streaming else 0)
        limit += GZIP_SLACK if request.gzip else 0
        if request.content_length is not None and request.content_length > limit:
            raise _too_large("request", request.content_length, self._max_receive)
        chunks = []
        size = 0
        while True:
            event = await receive()
            if event["type"] == "http.disconnect":
                raise _Refused(code_pb2.CANCELLED, "the client went away")
            chunk = event.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large("request", size, self._max_receive)
            chunks.append(chunk)
            if not event.get("more_body", False):
                return b"".join(chunks)

    def _message(self, data: bytes, compressed: bool) -> bytes:
        """A request message, gunzipped when ``compressed``, within the receive limit.

        Raises:
            MalformedRequest: not gzip data.
            _Refused: ``resource_exhausted`` past the limit.
        """
        if not compressed:
            if len(data) > self._max_receive:
                raise _too_large("request", len(data), self._max_receive)
            return data
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflate.decompress(data, self._max_receive + 1)
        except zlib.error:
            raise MalformedRequest("the request body is not gzip data") from None
        if len(out) > self._max_receive or inflate.unconsumed_tail:
            raise _too_large("request", len(out), self._max_receive)
        return out

    async def _unary(self, scope: Scope, receive: Receive, send: Send, request: _Request) -> str:
        """Serve a unary call; returns its status code's name."""
        edge, method = self._edge, request.method
        try:
            caller = edge.identify(method.path, request.metadata, _peer(scope))
            body = await self._body(receive, request)
            raw = self._message(body, request.gzip)
            work = edge.unary(method, caller, request.codec, raw)
            try:
                data = await asyncio.wait_for(work, request.timeout)
            except TimeoutError:
                raise _Refused(code_pb2.DEADLINE_EXCEEDED, "the deadline passed") from None
            if len(data) > self._max_send:
                raise _too_large("response", len(data), self._max_send)
        except Exception as exc:
            status = exc.status if isinstance(exc, _Refused) else edge.status(method.path, exc)
            await _unary_error(send, status)
            return _GRPC_NAMES.get(status.code, "UNKNOWN")
        content_type = f"application/{request.codec.name}".encode()
        await _respond(send, 200, content_type, data)
        return "OK"

    async def _stream(self, scope: Scope, receive: Receive, send: Send, request: _Request) -> str:
        """Serve a server-streaming call; returns its status code's name."""
        edge, method = self._edge, request.method
        content_type = f"application/connect+{request.codec.name}".encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", content_type)],
            }
        )
        status: status_pb2.Status | None = None
        try:
            caller = edge.identify(method.path, request.metadata, _peer(scope))
            body = await self._body(receive, request)
            raw = self._envelope(body, request.gzip)

            async def forward() -> None:
                async with contextlib.aclosing(
                    edge.stream(method, caller, request.codec, raw)
                ) as items:
                    async for item in items:
                        if len(item) > self._max_send:
                            raise _too_large("response", len(item), self._max_send)
                        await send(
                            {
                                "type": "http.response.body",
                                "body": ENVELOPE.pack(0, len(item)) + item,
                                "more_body": True,
                            }
                        )

            pump = asyncio.ensure_future(forward())
            gone = asyncio.ensure_future(_disconnected(receive))
            try:
                done, _ = await asyncio.wait(
                    {pump, gone}, timeout=request.timeout, return_when=asyncio.FIRST_COMPLETED
                )
            except asyncio.CancelledError:  # the ASGI server gave up on the call
                pump.cancel()
                raise
            finally:
                gone.cancel()
            if pump not in done:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
                if not done:
                    raise _Refused(code_pb2.DEADLINE_EXCEEDED, "the deadline passed")
                return "CANCELLED"  # the client went away: nothing more to send
            pump.result()
        except Exception as exc:
            status = exc.status if isinstance(exc, _Refused) else edge.status(method.path, exc)
        end: dict[str, Any] = {} if status is None else {"error": error_json(status)}
        payload = orjson.dumps(end)
        await send(
            {
                "type": "http.response.body",
                "body": ENVELOPE.pack(FLAG_END_STREAM, len(payload)) + payload,
                "more_body": False,
            }
        )
        return "OK" if status is None else _GRPC_NAMES.get(status.code, "UNKNOWN")

    def _envelope(self, body: bytes, gzip: bool) -> bytes:
        """The one enveloped message of a streaming call's request body.

        Raises:
            MalformedRequest: not exactly one envelope, or a compressed one
                without ``connect-content-encoding: gzip``.
            _Refused: ``resource_exhausted`` past the receive limit.
        """
        if len(body) < ENVELOPE.size:
            raise MalformedRequest("the request is not one enveloped message")
        flags, length = ENVELOPE.unpack_from(body)
        if len(body) != ENVELOPE.size + length or flags & ~FLAG_COMPRESSED:
            raise MalformedRequest("the request is not one enveloped message")
        if flags & FLAG_COMPRESSED and not gzip:
            raise MalformedRequest("a compressed message without connect-content-encoding")
        return self._message(body[ENVELOPE.size :], bool(flags & FLAG_COMPRESSED))


def _too_large(what: str, size: int, limit: int) -> _Refused:
    flag = "receive" if what == "request" else "send"
    return _Refused(
        code_pb2.RESOURCE_EXHAUSTED,
        f"the {what} message is {size} bytes, more than this server's {limit} "
        f"(--max-{flag}-message-size)",
    )


def _peer(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "unknown"


async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone away (its body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _respond(send: Send, status: int, content_type: bytes, body: bytes) -> None:
    """A whole response: ``status``, its type and length, ``body``."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _unary_error(send: Send, status: status_pb2.Status) -> None:
    http_status = _CONNECT_CODES.get(status.code, ("unknown", 500))[1]
    await _respond(send, http_status, b"application/json", orjson.dumps(error_json(status)))


async def _refuse(send: Send, refused: _Refused, *, streaming: bool) -> None:
    """Answer a refusal found in the request line or headers."""
    if refused.http_status:
        await send(
            {
                "type": "http.response.start",
                "status": refused.http_status,
                "headers": refused.headers,
            }
        )
        await send({"type": "http.response.body", "body": b""})
    elif streaming:
        payload = orjson.dumps({"error": error_json(refused.status)})
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/connect+json")],
            }
        )
        await send(
            {
                "type": "http.response.body",
                "body": ENVELOPE.pack(FLAG_END_STREAM, len(payload)) + payload,
            }
        )
    else:
        await _unary_error(send, refused.status)


async def _preflight(send: Send, origin: bytes) -> None:
    """Answer a browser's CORS preflight for an allowed ``origin``."""
    headers = [
        (b"access-control-allow-origin", origin),
        (b"access-control-allow-methods", b"POST"),
        (b"access-control-allow-headers", CORS_HEADERS.encode()),
        (b"access-control-max-age", str(CORS_MAX_AGE).encode()),
        (b"vary", b"origin"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def _with_cors(send: Send, origin: bytes) -> Send:
    """``send``, adding CORS's response headers for ``origin`` to the response's start."""

    async def cors(event: dict[str, Any]) -> None:
        if event["type"] == "http.response.start":
            extra = [(b"access-control-allow-origin", origin), (b"vary", b"origin")]
            event = {**event, "headers": [*event.get("headers", []), *extra]}
        await send(event)

    return cors


async def _lifespan(receive: Receive, send: Send) -> None:
    """Answer the ASGI server's start and stop: nothing to set up or tear down."""
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
