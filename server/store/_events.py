"""Events (API.md, ``Events.Watch``): reading an owner's events after an id,
appending one outside any other write, and pruning the retention window.
Every event is written by :meth:`~server.store._base.StoreBase._append_event`.

Thread rules: as every part of :class:`server.store.Store`.
"""

from __future__ import annotations

import time

import lmdb

from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._records import EventRow
from server.store._writer import WriteOp

EVENT_RETENTION = 7 * 24 * 3600.0
"""Seconds events are kept for ``Watch(after=...)``."""


class EventsPart(StoreBase):
    """Event operations of :class:`server.store.Store`."""

    def emit_event(self, owner: str, event_type: str, subject: str) -> None:
        """Append one event outside any other write (e.g. ``SLOT_CONFLICT``)."""

        def apply(txn: lmdb.Transaction) -> None:
            self._append_event(txn, owner, event_type, subject, time.time())

        self.writer.run(WriteOp(apply, name="event"))

    def events(self, owner: str, after: int, types: set[str], limit: int = 1000) -> list[EventRow]:
        """Events of ``owner`` with a number above ``after``, oldest first (at most ``limit``)."""
        out: list[EventRow] = []
        with self.env.begin() as txn:
            start = sk.event_key(owner, after + 1)
            for _, raw in sk.scan(txn, self.t.events, sk.owner_prefix(owner), start=start):
                if len(out) >= limit:
                    break
                event = EventRow.decode(raw)
                if not types or event.type in types:
                    out.append(event)
        return out

    def prune_events(self, before: float) -> int:
        """Drop events older than ``before`` (seconds since the epoch); returns how many."""

        def apply(txn: lmdb.Transaction) -> int:
            dropped = 0
            cur = txn.cursor(db=self.t.events)
            if not cur.first():
                return 0
            while True:
                if EventRow.decode(bytes(cur.value())).time < before:
                    if not cur.delete():
                        break
                    dropped += 1
                    continue
                if not cur.next():
                    break
            return dropped

        return self.writer.run(WriteOp(apply, name="events.prune"))
