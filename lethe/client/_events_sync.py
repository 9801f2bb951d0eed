# Generated from lethe/client/_events_async.py by scripts/gen_sync_client.py: do not edit.
# Edit the source and run `.venv/bin/python scripts/gen_sync_client.py`.
"""The ``lethe.v1.Events`` method of the client, and the event stream that resumes it.

:meth:`EventsMethods.watch` returns an :class:`EventStream`, which
reopens ``Events.Watch`` after the last event it yielded whenever the stream
breaks (:data:`lethe.client._config.WATCH_RECONNECT_CODES`, with the backoff
of :func:`lethe.client._config.backoff`). A method group of
:class:`lethe.client.Client`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

import grpc

from lethe.client._base_sync import ClientBase
from lethe.client._build import build
from lethe.client._config import WATCH_RECONNECT_CODES, RetryPolicy, backoff
from lethe.client._errors import DeadlineExceeded, LetheError, Unavailable, error_from_rpc
from lethe.client._routing import routed
from lethe.client._transport_sync import CallLock, CloseFlag, next_event
from lethe.client._types import EnumOr
from lethe.v1 import events_pb2

__all__ = ["EventStream", "EventsMethods"]


class EventStream(Iterator[events_pb2.Event]):
    """The events of ``Events.Watch``, resumed with ``after`` on reconnect.

    Iterating yields :class:`lethe.v1.events_pb2.Event` messages in id order.
    When the stream breaks (``UNAVAILABLE``, ``RESOURCE_EXHAUSTED``, or the
    server ending it, as it does when it shuts down), the stream is opened
    again with ``after`` set to the last event id seen, after a jittered
    backoff; events are never repeated or skipped while the server keeps them
    (API.md: kept for a bounded window). :attr:`last_id` is the resume point.

    It ends (``StopIteration``) after :meth:`close`; with a ``timeout``, it
    raises :class:`lethe.client.DeadlineExceeded` once that many seconds have
    passed since it was opened.
    """

    def __init__(
        self,
        open_call: Callable[[str, float | None], Any],
        *,
        after: str,
        timeout: float | None,
        max_reconnects: int | None,
        policy: RetryPolicy,
    ) -> None:
        """Make the stream; the first call opens on the first iteration.

        Args:
            open_call: opens ``Watch`` after an event id, with a deadline in
                seconds (None: none), and returns the stream call.
            after: the event id to start after ("" from the oldest kept).
            timeout: seconds until the stream raises ``DeadlineExceeded``; None: never.
            max_reconnects: consecutive reconnects before giving up; None: never.
            policy: the backoffs between reconnects.
        """
        self._open = open_call
        self.last_id = after
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._max_reconnects = max_reconnects
        self._policy = policy
        self._failures = 0
        self._call: Any = None
        self._closed = CloseFlag()
        self._lock = CallLock()

    def _remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(self._deadline - time.monotonic(), 0.0)

    def _reconnect_or_raise(self, err: LetheError | None) -> None:
        """Back off before reopening, or raise when reconnecting is over."""
        self._call = None
        if self._max_reconnects is not None and self._failures >= self._max_reconnects:
            raise err or Unavailable("the event stream ended and reconnects are exhausted")
        delay = backoff(self._policy, self._failures)
        self._failures += 1
        remaining = self._remaining()
        if remaining is not None and remaining <= delay:
            delay = remaining
        if self._closed.wait(delay):
            raise StopIteration

    def __next__(self) -> events_pb2.Event:
        """The next event, reconnecting as often as the stream allows.

        Returns:
            The event after :attr:`last_id`.

        Raises:
            StopIteration: the stream was closed.
            DeadlineExceeded: the stream's ``timeout`` passed.
            Unavailable: reconnects are exhausted (or the error that ended the
                last attempt).
            LetheError: the call failed for a reason reconnecting cannot cure.
        """
        while True:
            if self._closed.is_set():
                raise StopIteration
            remaining = self._remaining()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded("the watch deadline passed")
            with self._lock:
                if self._call is None:
                    self._call = self._open(self.last_id, remaining)
                call = self._call
            try:
                event = next_event(call, self._closed)
            except grpc.RpcError as raw:
                err = error_from_rpc(raw)
                if self._closed.is_set():
                    raise StopIteration from None
                if err.code() in WATCH_RECONNECT_CODES:
                    self._reconnect_or_raise(err)
                    continue
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and self._deadline is None:
                    self._reconnect_or_raise(err)
                    continue
                raise err from None
            if event is None:
                self._reconnect_or_raise(None)
                continue
            self._failures = 0
            self.last_id = event.id
            return event

    def close(self) -> None:
        """Stop the stream: iteration ends, the call in flight is cancelled. Idempotent."""
        self._closed.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def __enter__(self) -> EventStream:
        """The stream itself; leaving the block closes it."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the stream."""
        self.close()


class EventsMethods(ClientBase):
    """The method of ``lethe.v1.Events``: :meth:`watch`."""

    def watch(
        self,
        parent: str,
        *,
        types: Iterable[EnumOr[events_pb2.EventType.ValueType]] = (),
        after: str = "",
        timeout: float | None = None,
        max_reconnects: int | None = None,
    ) -> EventStream:
        """``Events.Watch``: follow an owner's events, resuming after reconnects.

        Args:
            parent: ``owners/{owner}``.
            types: event types to receive (default all).
            after: start after this event id ("" from the oldest kept).
            timeout: seconds after which the stream raises
                :class:`~lethe.client.DeadlineExceeded`; None (default) follows forever.
            max_reconnects: consecutive reconnect attempts before the stream
                gives up with :class:`~lethe.client.Unavailable`; None: forever.

        Returns:
            An :class:`EventStream` (iterate it with ``for``; close
            it, or use ``with``).

        Raises:
            BadField: a malformed ``after`` (raised when iterating), as the
                other errors of the call.
        """
        types = list(types)

        def open_call(resume: str, remaining: float | None) -> Any:
            request = build(
                events_pb2.WatchRequest, {"parent": parent, "types": types, "after": resume}
            )
            return self.stubs.events.Watch(
                request, metadata=routed(self.metadata, request), timeout=remaining
            )

        return EventStream(
            open_call,
            after=after,
            timeout=timeout,
            max_reconnects=max_reconnects,
            policy=self._retry,
        )
