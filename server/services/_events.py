"""The ``lethe.v1.Events`` servicer: a server stream of the owner's events,
resumable with ``after`` (an event id).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import grpc

from lethe.v1 import common_pb2, events_pb2, events_pb2_grpc
from server._auth import authorize
from server._convert import event_proto, receipt_proto
from server._names import parse_owner
from server.errors import InvalidArgument
from server.services._common import abort, enum_name
from server.store import Store

WATCH_POLL_SECONDS = 0.2


class EventsService(events_pb2_grpc.EventsServicer):
    """``lethe.v1.Events``: a server stream of the owner's events, resumable
    with ``after`` (an event id). Events are kept for 7 days."""

    def __init__(self, store: Store, stopping: threading.Event) -> None:
        self.store = store
        self.stopping = stopping

    def Watch(  # noqa: N802
        self, request: events_pb2.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[events_pb2.Event]:
        try:
            owner = parse_owner(request.parent, "parent")
            authorize(owner)
            if request.after and not re.fullmatch(r"[0-9]{1,18}", request.after):
                raise InvalidArgument("after", "must be an event id")
            after = int(request.after) if request.after else 0
            types = set()
            for i, value in enumerate(request.types):
                name = enum_name(events_pb2.EventType, value, f"types[{i}]")
                if name:
                    types.add(name)
        except Exception as exc:
            abort(context, exc)
            return
        receipts: dict[str, common_pb2.DeletionReceipt | None] = {}
        while context.is_active() and not self.stopping.is_set():
            batch = self.store.events(owner, after, types)
            for event in batch:
                if event.receipt not in receipts:
                    entry = self.store.deletion(owner, event.receipt.rsplit("/", 1)[-1])
                    receipts[event.receipt] = receipt_proto(entry) if entry else None
                yield event_proto(event, receipts[event.receipt])
                after = int(event.id)
            if not batch:
                self.stopping.wait(WATCH_POLL_SECONDS)
