"""The ``lethe.v1.Events`` servicer: a server stream of the owner's events.

The stream is resumable with ``after`` (an event id).

``Watch`` is an async generator on the event loop (:mod:`server.edge._edge`): it
holds no worker thread while it waits. It subscribes to the owner's events on
the one notifier (:class:`server.edge._notifier.EventHub`), reads what was
committed after ``after`` on a worker, sends it, and sleeps until the
notifier says the owner has news — or until the stream must end (the server
drains, the token is revoked), which it reports with that error.
"""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator

from lethe.v1 import common_pb2, events_pb2, events_pb2_grpc
from server._names import parse_owner
from server.edge import EventHub, StreamContext, authorize
from server.errors import InvalidArgument
from server.services._common import enum_name
from server.services._convert import event_proto, receipt_proto
from server.store import Store

BATCH = 1000
"""Events read per store read; a full batch is followed by another at once."""


class EventsService(events_pb2_grpc.EventsServicer):
    """``lethe.v1.Events``: a server stream of the owner's events, resumable with ``after``.

    ``after`` is an event id. Events are kept for 7 days.
    """

    def __init__(self, store: Store, hub: EventHub) -> None:
        self.store = store
        self.hub = hub

    async def Watch(  # type: ignore[override]  # noqa: N802
        self, request: events_pb2.WatchRequest, context: StreamContext
    ) -> AsyncIterator[events_pb2.Event]:
        """``Events.Watch``: stream the owner's events after ``after``, then new ones."""
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
        receipts: dict[str, common_pb2.DeletionReceipt | None] = {}
        subscription = self.hub.subscribe(owner, context.wake)
        try:
            while True:
                context.check()
                context.wake.clear()
                batch = await context.run(
                    functools.partial(self._read, owner, after, types, receipts)
                )
                for event in batch:
                    yield event
                    after = int(event.id)
                if len(batch) < BATCH:
                    await context.wake.wait()
        finally:
            subscription.close()

    def _read(
        self,
        owner: str,
        after: int,
        types: set[str],
        receipts: dict[str, common_pb2.DeletionReceipt | None],
    ) -> list[events_pb2.Event]:
        """Events after ``after`` as protos, with their receipts (a worker's job)."""
        out = []
        for event in self.store.events(owner, after, types, limit=BATCH):
            if event.receipt not in receipts:
                entry = self.store.deletion(owner, event.receipt.rsplit("/", 1)[-1])
                receipts[event.receipt] = (
                    receipt_proto(entry, self.store.sign_receipt) if entry else None
                )
            out.append(event_proto(event, receipts[event.receipt]))
        return out
