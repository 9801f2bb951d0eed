"""What the blocking client cannot share with the asyncio one: the blocking channel and threads.

Hand-written, as its asyncio twin :mod:`lethe.client._transport_async` is:
the two define the same names, and every other module of
:class:`lethe.client.Client` is generated from the asyncio client by
``scripts/gen_sync_client.py``. Here live the channel (:func:`open_stubs`,
:func:`close_channel`, :func:`channel_ready`), the unary call (:func:`unary`)
and what an :class:`lethe.client.EventStream` waits on and reads with
(:class:`CloseFlag`, :class:`CallLock`, :func:`next_event`).

Thread rules: a :class:`~lethe.client.Client` may be used from any number of
threads at once (as its ``grpc.Channel``); an
:class:`~lethe.client.EventStream` belongs to the thread that iterates it,
though any thread may close it.

Imports grpc, the standard library, :mod:`lethe._rpc` and the client's own
modules.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from lethe._rpc import Stubs
from lethe.client._config import ChannelPlan
from lethe.client._errors import error_from_rpc
from lethe.client._types import Metadata
from lethe.v1 import events_pb2

__all__ = [
    "CallLock",
    "CloseFlag",
    "channel_ready",
    "close_channel",
    "next_event",
    "open_stubs",
    "unary",
]

_R = TypeVar("_R")

CallLock = threading.Lock
"""Guards an event stream's call between the thread iterating it and the one closing it."""

CloseFlag = threading.Event
"""Set once an event stream is closed; its backoff waits on it (``wait(seconds)``
returns whether it is set)."""


def open_stubs(target: str, token: str, plan: ChannelPlan) -> Stubs:
    """Stubs on a new channel to ``target`` (it connects on the first call).

    Args:
        target: ``HOST:PORT`` of a serving ``lethe``.
        token: the bearer token, kept as :attr:`lethe._rpc.Stubs.token`.
        plan: credentials (None: plaintext), options and call metadata.

    Returns:
        The stubs on the channel.
    """
    channel = (
        grpc.insecure_channel(target, plan.options)
        if plan.credentials is None
        else grpc.secure_channel(target, plan.credentials, plan.options)
    )
    return Stubs(channel, token)


def unary(rpc: Callable[..., _R], request: Any, metadata: Metadata, timeout: float | None) -> _R:
    """Send one unary call and block until its response.

    Args:
        rpc: a method of the stubs (``stubs.threads.GetThread``).
        request: its request message.
        metadata: the call's metadata.
        timeout: the call's deadline in seconds, or None for none.

    Returns:
        The response message.

    Raises:
        LetheError: the call failed (the subclass for its code and reason).
    """
    try:
        return rpc(request, metadata=metadata, timeout=timeout)
    except grpc.RpcError as err:
        raise error_from_rpc(err) from None


def close_channel(stubs: Stubs) -> None:
    """Close the stubs' channel; calls and streams in flight are cancelled. Idempotent."""
    stubs.close()


def channel_ready(stubs: Stubs, timeout: float) -> bool:
    """Block until the stubs' channel is connected.

    Args:
        stubs: the stubs whose channel to wait for.
        timeout: seconds to wait.

    Returns:
        Whether it connected within ``timeout``.
    """
    try:
        grpc.channel_ready_future(stubs.channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        return False
    return True


def next_event(call: Any, closed: CloseFlag) -> events_pb2.Event | None:
    """The next event of a ``Watch`` call.

    Args:
        call: the blocking stream call (an iterator of events).
        closed: the stream's close flag (unused here: closing cancels the
            call, which then fails with ``CANCELLED``, as any other failure).

    Returns:
        The event, or None when the server ended the stream.

    Raises:
        grpc.RpcError: the call failed, or was cancelled.
    """
    event: events_pb2.Event | None = next(call, None)
    return event
