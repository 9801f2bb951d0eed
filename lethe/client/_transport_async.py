"""What the asyncio client cannot share with the blocking one: ``grpc.aio`` and the event loop.

Hand-written, as its blocking twin :mod:`lethe.client._transport_sync` is:
the two define the same names, and every other module of
:class:`lethe.client.AsyncClient` is written once and turned into the
blocking client by ``scripts/gen_sync_client.py``. Here live the channel
(:func:`open_stubs`, :func:`close_channel`, :func:`channel_ready`), the unary
call (:func:`unary`) and what an :class:`lethe.client.AsyncEventStream` waits
on and reads with (:class:`CloseFlag`, :class:`CallLock`, :func:`next_event`).

Thread rules: an :class:`~lethe.client.AsyncClient` belongs to the event loop
it was first used on (as its ``grpc.aio.Channel``); create one per loop. Its
event streams belong to that loop too.

Imports grpc, the standard library, :mod:`lethe._rpc` and the client's own
modules.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar, cast

import grpc
import grpc.aio

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
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # (absent from grpc-stubs)

CallLock = contextlib.nullcontext
"""Guards an event stream's call between iterating it and closing it: nothing
to guard on one event loop, where both run between two ``await``."""


def open_stubs(target: str, token: str, plan: ChannelPlan) -> Stubs:
    """Stubs on a new ``grpc.aio`` channel to ``target`` (it connects on the first call).

    Args:
        target: ``HOST:PORT`` of a serving ``lethe``.
        token: the bearer token, kept as :attr:`lethe._rpc.Stubs.token`.
        plan: credentials (None: plaintext), options and call metadata.

    Returns:
        The stubs on the channel.
    """
    channel = (
        grpc.aio.insecure_channel(target, plan.options)
        if plan.credentials is None
        else grpc.aio.secure_channel(target, plan.credentials, plan.options)
    )
    return Stubs(channel, token)  # type: ignore[arg-type]


async def unary(
    rpc: Callable[..., _R], request: Any, metadata: Metadata, timeout: float | None
) -> _R:
    """Send one unary call and wait for its response.

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
    # ``Stubs`` is typed with the blocking stubs; on a ``grpc.aio`` channel the
    # same attribute returns an awaitable call of the same response type.
    pending: Any = rpc(request, metadata=metadata, timeout=timeout)
    try:
        return cast(_R, await pending)
    except grpc.RpcError as err:
        raise error_from_rpc(err) from None


async def close_channel(stubs: Stubs) -> None:
    """Close the stubs' channel; calls and streams in flight are cancelled. Idempotent."""
    channel: Any = stubs.channel
    await channel.close()


async def channel_ready(stubs: Stubs, timeout: float) -> bool:
    """Wait until the stubs' channel is connected.

    Args:
        stubs: the stubs whose channel to wait for.
        timeout: seconds to wait.

    Returns:
        Whether it connected within ``timeout``.
    """
    channel: Any = stubs.channel
    try:
        await asyncio.wait_for(channel.channel_ready(), timeout)
    except TimeoutError:
        return False
    return True


class CloseFlag:
    """Set once an event stream is closed; its backoff waits on it."""

    def __init__(self) -> None:
        """Make the flag, not set."""
        self._event = asyncio.Event()

    def set(self) -> None:
        """Set the flag, waking every :meth:`wait`."""
        self._event.set()

    def is_set(self) -> bool:
        """Whether the flag is set."""
        return self._event.is_set()

    async def wait(self, seconds: float) -> bool:
        """Wait until the flag is set, for ``seconds`` at most.

        Args:
            seconds: how long to wait.

        Returns:
            Whether the flag is set.
        """
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
        except TimeoutError:
            return False
        return True


async def next_event(call: Any, closed: CloseFlag) -> events_pb2.Event | None:
    """The next event of a ``Watch`` call.

    Args:
        call: the ``grpc.aio`` stream call.
        closed: the stream's close flag: closing cancels the call, and asyncio
            delivers that as ``CancelledError``, which then ends the iteration.

    Returns:
        The event, or None when the server ended the stream.

    Raises:
        grpc.RpcError: the call failed.
        StopAsyncIteration: the call was cancelled by closing the stream.
        asyncio.CancelledError: the task reading the stream was cancelled.
    """
    try:
        event = await call.read()
    except asyncio.CancelledError:
        if closed.is_set():
            raise StopAsyncIteration from None
        raise
    if event is _EOF:
        return None
    return cast(events_pb2.Event, event)
