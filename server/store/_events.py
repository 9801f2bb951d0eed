"""Events (API.md, ``Events.Watch``): reading, appending, pruning, and telling listeners.

Reading an owner's events after an id, appending one outside any other write,
pruning the retention window, and telling listeners which owners got events
once they are committed. Every event is written by
:meth:`~server.store._base.StoreBase._append_event`, which notes its owner;
after each data commit the writer calls :meth:`EventsPart._announce_events`,
which hands the noted owners to every listener (:meth:`EventsPart.on_events`).
An owner noted by a write that was rolled back is announced with the next
commit: a listener may be woken for nothing, never left asleep after a commit.

Thread rules: as every part of :class:`server.store.Store`; listeners run on
the writer thread and must only hand the owners on (never block, never raise).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import lmdb

from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._records import EventRow
from server.store._writer import WriteOp

EVENT_RETENTION = 7 * 24 * 3600.0
"""Seconds events are kept for ``Watch(after=...)``."""

_log = logging.getLogger(__name__)


class EventsPart(StoreBase):
    """Event operations of :class:`server.store.Store`."""

    _event_listeners: list[Callable[[frozenset[str]], None]]

    def on_events(self, listener: Callable[[frozenset[str]], None]) -> None:
        """Call ``listener(owners)`` on the writer thread after each data commit that adds events.

        ``owners`` are the owners the events belong to (see the module
        docstring). Register before serving; listeners are never removed.
        """
        self._event_listeners.append(listener)

    def _announce_events(self) -> None:
        """The writer's after-commit hook: hand the noted owners to the listeners."""
        if not self._event_owners:
            return
        owners = frozenset(self._event_owners)
        self._event_owners.clear()
        for listener in self._event_listeners:
            try:
                listener(owners)
            except Exception as exc:  # a listener must never fail the writer
                _log.error("event listener failed: %s", type(exc).__name__)

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
