"""A small Connect protocol client for the tests, on the standard library (HTTP/1.1).

It speaks what :mod:`server.edge._connect` serves — unary calls in JSON or
binary, server streams enveloped, the error JSON — and shows a failed call
as a :class:`grpc.RpcError` whose ``code()``, ``details()`` and
``trailing_metadata()`` (a ``grpc-status-details-bin`` built from the error's
details) read as a gRPC error's do: so the helpers of the gRPC tests
(``error_reason``, ``bad_fields``, ``_rpc.retry_delay``) and the tests
themselves run unchanged over either transport. :class:`ConnectStubs` has
the shape of :class:`lethe._rpc.Stubs` (``.threads.GetThread(request,
metadata=…)``).
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
from google.protobuf import any_pb2, json_format, message
from google.rpc import status_pb2

from lethe.v1 import (
    events_pb2,
    lifecycle_pb2,
    memories_pb2,
    repairs_pb2,
    retrieval_pb2,
    threads_pb2,
)

ENVELOPE = struct.Struct(">BI")
CODES = {member.name.lower(): member for member in grpc.StatusCode}
CODES["canceled"] = grpc.StatusCode.CANCELLED
Metadata = Sequence[tuple[str, str]]


class ConnectRpcError(grpc.RpcError):
    """A Connect error JSON, read as a gRPC error.

    Attributes:
        http_status: the HTTP status of the response (200 for a stream's error).
        body: the error object as sent.
    """

    def __init__(self, http_status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", ""))
        self.http_status = http_status
        self.body = body
        self._code = CODES.get(str(body.get("code", "")), grpc.StatusCode.UNKNOWN)
        details = [
            any_pb2.Any(
                type_url=f"type.googleapis.com/{d['type']}",
                value=base64.b64decode(d["value"] + "=" * (-len(d["value"]) % 4)),
            )
            for d in body.get("details", [])
        ]
        self.status = status_pb2.Status(
            code=self._code.value[0], message=str(body.get("message", "")), details=details
        )

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return str(self.status.message)

    def trailing_metadata(self) -> Any:
        if not self.status.details:
            return ()
        return (("grpc-status-details-bin", self.status.SerializeToString()),)

    def __repr__(self) -> str:
        return f"ConnectRpcError({self.http_status}, {self.body!r})"


class ConnectChannel:
    """Calls to one Connect listener, a new HTTP/1.1 connection each.

    Args:
        target: ``HOST:PORT`` of the listener.
        codec: ``proto`` (binary) or ``json``.
        ssl_context: TLS to the listener; None for plaintext.
    """

    def __init__(
        self, target: str, *, codec: str = "proto", ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.host, _, port = target.rpartition(":")
        self.port = int(port)
        self.codec = codec
        self.ssl_context = ssl_context

    def connection(self, timeout: float = 30.0) -> http.client.HTTPConnection:
        if self.ssl_context is not None:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self.ssl_context
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def post(
        self, path: str, body: bytes, content_type: str, metadata: Metadata = ()
    ) -> tuple[int, dict[str, str], bytes]:
        """One POST; returns the status, the headers (lower-case names) and the body.

        Metadata names may repeat: each is sent as a header line of its own.
        """
        conn = self.connection()
        try:
            _send(conn, path, body, [("content-type", content_type), *metadata])
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def encode(self, request: message.Message) -> bytes:
        if self.codec == "json":
            return json_format.MessageToJson(request).encode()
        return request.SerializeToString()

    def decode(self, data: bytes, response_type: type[message.Message]) -> message.Message:
        if self.codec == "json":
            return json_format.Parse(data, response_type())
        return response_type.FromString(data)

    def unary(
        self,
        path: str,
        request: message.Message,
        response_type: type[message.Message],
        metadata: Metadata = (),
        timeout: float | None = None,
    ) -> message.Message:
        """A unary call.

        Raises:
            ConnectRpcError: the call failed.
        """
        headers = [*metadata]
        if timeout is not None:
            headers.append(("connect-timeout-ms", str(int(timeout * 1000))))
        status, resp_headers, body = self.post(
            path, self.encode(request), f"application/{self.codec}", headers
        )
        if status != 200:
            assert resp_headers.get("content-type") == "application/json", (status, body)
            raise ConnectRpcError(status, json.loads(body))
        assert resp_headers["content-type"] == f"application/{self.codec}"
        return self.decode(body, response_type)

    def stream(
        self,
        path: str,
        request: message.Message,
        response_type: type[message.Message],
        metadata: Metadata = (),
        timeout: float | None = None,
    ) -> ConnectStream:
        """A server stream: iterate it; it raises its error at the end."""
        payload = self.encode(request)
        headers = [("content-type", f"application/connect+{self.codec}"), *metadata]
        if timeout is not None:
            headers.append(("connect-timeout-ms", str(int(timeout * 1000))))
        conn = self.connection(timeout=timeout or 60.0)
        _send(conn, path, ENVELOPE.pack(0, len(payload)) + payload, headers)
        return ConnectStream(self, conn, response_type)


def _send(conn: http.client.HTTPConnection, path: str, body: bytes, headers: Metadata) -> None:
    """POST ``body`` with ``headers`` in order, repeated names included."""
    conn.putrequest("POST", path, skip_accept_encoding=True)
    for name, value in headers:
        conn.putheader(name, value)
    conn.putheader("content-length", str(len(body)))
    conn.endheaders(body)


class ConnectStream:
    """The messages of a server stream, then its end (an error raised, or none)."""

    def __init__(
        self,
        channel: ConnectChannel,
        conn: http.client.HTTPConnection,
        response_type: type[message.Message],
    ) -> None:
        self._channel = channel
        self._conn = conn
        self._type = response_type
        self._resp: http.client.HTTPResponse | None = None

    def __iter__(self) -> Iterator[message.Message]:
        return self

    def __next__(self) -> message.Message:
        if self._resp is None:
            self._resp = self._conn.getresponse()
            if self._resp.status != 200:
                body = self._resp.read()
                self.cancel()
                raise ConnectRpcError(self._resp.status, json.loads(body or b"{}"))
        prefix = self._resp.read(ENVELOPE.size)
        if len(prefix) < ENVELOPE.size:
            self.cancel()
            raise ConnectRpcError(200, {"code": "internal", "message": "no end of stream"})
        flags, length = ENVELOPE.unpack(prefix)
        data = self._resp.read(length)
        if flags & 0x02:
            self.cancel()
            end = json.loads(data)
            if "error" in end:
                raise ConnectRpcError(200, end["error"])
            raise StopIteration
        return self._channel.decode(data, self._type)

    def cancel(self) -> None:
        """Close the connection (the server sees the client go)."""
        self._conn.close()


class _Service:
    def __init__(self, channel: ConnectChannel, module: Any, name: str) -> None:
        self._channel = channel
        self._desc = module.DESCRIPTOR.services_by_name[name]
        self._module = module

    def __getattr__(self, name: str) -> Any:
        method = self._desc.methods_by_name[name]
        path = f"/{self._desc.full_name}/{name}"
        from google.protobuf import message_factory

        response_type = message_factory.GetMessageClass(method.output_type)
        channel = self._channel

        def call(
            request: message.Message, metadata: Metadata | None = None, timeout: float | None = None
        ) -> Any:
            if method.server_streaming:
                return channel.stream(path, request, response_type, metadata or (), timeout)
            return channel.unary(path, request, response_type, metadata or (), timeout)

        return call


class ConnectStubs:
    """The ``lethe.v1`` services over Connect, shaped like :class:`lethe._rpc.Stubs`."""

    def __init__(self, channel: ConnectChannel) -> None:
        self.channel = channel
        self.threads = _Service(channel, threads_pb2, "Threads")
        self.memories = _Service(channel, memories_pb2, "Memories")
        self.retrieval = _Service(channel, retrieval_pb2, "Retrieval")
        self.lifecycle = _Service(channel, lifecycle_pb2, "Lifecycle")
        self.repairs = _Service(channel, repairs_pb2, "Repairs")
        self.events = _Service(channel, events_pb2, "Events")
