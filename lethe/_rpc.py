"""The wire of a Lethe client: one channel, its bearer metadata, the stubs, the error details.

The error details are those the server attaches (API.md, "Errors").

:class:`Stubs` holds a ``grpc.Channel``, the ``authorization: Bearer <token>``
metadata every authenticated call carries, and one stub per service of
``lethe.v1`` (Threads, Memories, Retrieval, Lifecycle, Repairs, Events) plus
``grpc.health.v1.Health`` (made on first use: it needs ``grpcio-health-checking``,
which the server has and the light client distribution does not). It makes
no call itself: callers pass ``metadata=stubs.md`` (Health needs none). The
typed client ``lethe.client`` is built on it (``Client.stubs``).

:meth:`Stubs.insecure` makes a plaintext channel (the token goes as explicit
metadata in ``md``); over TLS the typed client (``lethe.client.Client`` with
``tls=``) makes the channel and gRPC attaches the token as call credentials,
so its stubs are built with ``token=""`` and ``md`` is empty.

:func:`reason_of`, :func:`error_info` and :func:`bad_fields` read the
``google.rpc.Status`` that a failed call carries in its trailing metadata
(``grpc-status-details-bin``), decoded by :func:`lethe._status.status_details`
(the decoder :func:`lethe.client.error_from_rpc` uses too): the
``google.rpc.ErrorInfo`` reason of domain ``lethe`` (:data:`DOMAIN`; a value
name of ``lethe.errors.v1.ErrorReason``, e.g. ``RECORD_DELETED``; the enum is
``lethe.errors.v1.errors_pb2.ErrorReason``) and the fields of a
``google.rpc.BadRequest``. Clients compare those constants, never message text.

Imports only grpc, protobuf, googleapis-common-protos, :mod:`lethe._status`
and ``lethe.v1``; the grpc.health.v1 stubs when ``health`` is first used. A
:class:`Stubs` may be used from any number of threads at once, as a
``grpc.Channel`` may.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2

from lethe._status import DOMAIN, status_details
from lethe.v1 import (
    events_pb2_grpc,
    lifecycle_pb2_grpc,
    memories_pb2_grpc,
    repairs_pb2_grpc,
    retrieval_pb2_grpc,
    threads_pb2_grpc,
)

__all__ = ["DOMAIN", "Metadata", "Stubs", "bad_fields", "error_info", "reason_of"]

Metadata = tuple[tuple[str, str], ...]
"""Call metadata as gRPC takes it: ``(key, value)`` pairs."""


class Stubs:
    """A channel, the bearer metadata for one token, and a stub per service.

    Build it with :meth:`insecure` (a new plaintext channel to ``HOST:PORT``)
    or from an existing channel. :meth:`close` closes the channel; a ``Stubs`` is
    also a context manager that closes it on exit.

    Attributes:
        channel: the channel every stub sends on.
        token: the bearer token (``lethe_…``), as given.
        md: ``(("authorization", "Bearer <token>"),)``, for ``metadata=``;
            empty when the channel's call credentials carry the token.
        threads: ``lethe.v1.Threads``.
        memories: ``lethe.v1.Memories``.
        retrieval: ``lethe.v1.Retrieval``.
        lifecycle: ``lethe.v1.Lifecycle``.
        repairs: ``lethe.v1.Repairs``.
        events: ``lethe.v1.Events``.
        health: ``grpc.health.v1.Health`` (unauthenticated: call it without
            ``md``); needs ``grpcio-health-checking``.
    """

    def __init__(self, channel: grpc.Channel, token: str) -> None:
        """Bind stubs on ``channel`` to ``token``.

        Args:
            channel: an open channel to a serving ``lethe``; :meth:`close`
                closes it.
            token: bearer token sent as ``authorization: Bearer <token>``
                in ``md``; "" when the channel's call credentials carry it.
        """
        self.channel = channel
        self.token = token
        self.md: Metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.threads = threads_pb2_grpc.ThreadsStub(channel)
        self.memories = memories_pb2_grpc.MemoriesStub(channel)
        self.retrieval = retrieval_pb2_grpc.RetrievalStub(channel)
        self.lifecycle = lifecycle_pb2_grpc.LifecycleStub(channel)
        self.repairs = repairs_pb2_grpc.RepairsStub(channel)
        self.events = events_pb2_grpc.EventsStub(channel)
        self._health: Any = None

    @property
    def health(self) -> Any:
        """The ``grpc.health.v1.Health`` stub on the channel (made on first use).

        Raises:
            ModuleNotFoundError: ``grpcio-health-checking`` is not installed.
        """
        if self._health is None:
            from grpc_health.v1 import health_pb2_grpc

            self._health = health_pb2_grpc.HealthStub(self.channel)
        return self._health

    @classmethod
    def insecure(cls, target: str, token: str) -> Stubs:
        """Stubs on a new insecure (plaintext) channel to ``target``.

        The channel connects lazily, on the first call.

        Args:
            target: ``HOST:PORT`` of a serving ``lethe``.
            token: bearer token sent as ``authorization: Bearer <token>``.

        Returns:
            The stubs; :meth:`close` closes the channel.
        """
        return cls(grpc.insecure_channel(target), token)

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled. Idempotent."""
        self.channel.close()

    def __enter__(self) -> Stubs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _details(err: grpc.RpcError) -> list[Message]:
    """The unpacked ``google.rpc.Status`` details of a failed call, or []."""
    call: Any = err
    return status_details(call.trailing_metadata())


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The first ``google.rpc.ErrorInfo`` detail of a failed call, of any domain.

    Args:
        err: a failed call (the ``grpc.RpcError`` a stub raised).

    Returns:
        The decoded ``ErrorInfo``, or None when the error carries no
        ``google.rpc.Status`` (or a malformed one) or no ``ErrorInfo`` in it.
    """
    for detail in _details(err):
        if isinstance(detail, error_details_pb2.ErrorInfo):
            return detail
    return None


def reason_of(err: grpc.RpcError) -> str:
    """The ``google.rpc.ErrorInfo`` reason the Lethe server attached, or "" if none.

    Args:
        err: a failed call.

    Returns:
        The reason string (an ``ErrorReason`` value name such as
        ``RECORD_DELETED``), or "" when the error carries no ``ErrorInfo`` or
        its domain is not :data:`DOMAIN` (``lethe``).
    """
    info = error_info(err)
    if info is None or info.domain != DOMAIN:
        return ""
    return str(info.reason)


def bad_fields(err: grpc.RpcError) -> list[str]:
    """Every ``google.rpc.BadRequest.field_violations[].field`` of a failed call.

    Args:
        err: a failed call (``INVALID_ARGUMENT`` / ``BAD_FIELD`` names its fields).

    Returns:
        The field paths in the order the server listed them (e.g.
        ``["turns[0].text"]``); [] when the error carries no ``BadRequest``.
    """
    return [
        str(v.field)
        for detail in _details(err)
        if isinstance(detail, error_details_pb2.BadRequest)
        for v in detail.field_violations
    ]
