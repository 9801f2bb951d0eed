"""Retention: how long committed records, threads and an owner's new records may live.

A record's retention (``retain_until``) is the latest it may live once committed;
reads stop seeing it then, exactly as a pending record past its window
(:mod:`server.store._visibility`: ``expire_time``), and the sweeper forgets it
through the normal deletion path (``lifecycle``'s ``Deletions.sweep``), with a
receipt. Three ways to give one:

- on turns and memories by name (:meth:`RetentionPart.set_retention`): a
  committed record expires then; a pending one's window only gets shorter;
- on a thread: the thread and every turn of it, those appended later included
  (a thread's retention replaces its turns' own);
- per owner (:meth:`RetentionPart.set_owner_retention`): a default, in seconds,
  that every turn and memory created from then on carries from its creation.

What was derived from a record with a retention rechecks its lineage from then
on (``lineage_expiry``), so a summary of an expired turn is gone for readers at
the same instant as the turn. Sealed records never expire: a repair's
conclusion decides them.

Queues: committed records wait on ``retention`` (by ``expire_time``, as pending
ones on ``expiry``), threads on ``thread_expiry`` (layouts in
:mod:`server.store._schema`).

Thread rules: as every part of :class:`server.store.Store`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import lmdb

from server.errors import FailedPrecondition, Reason, RecordDeleted
from server.store import _schema as sk
from server.store._base import StoreBase, thread_name
from server.store._records import REPAIR, SEALED, RecordMeta, ThreadMeta
from server.store._visibility import effective_state
from server.store._writer import WriteOp


def _sealed(name: str) -> FailedPrecondition:
    return FailedPrecondition(f"{name} is sealed", reason=Reason.SEALED, subject=name)


class RetentionPart(StoreBase):
    """Retention of :class:`server.store.Store` (see the module docstring)."""

    def set_retention(
        self,
        owner: str,
        *,
        turns: Sequence[tuple[str, int]] = (),
        memories: Sequence[str] = (),
        threads: Sequence[str] = (),
        until: float,
    ) -> list[RecordMeta]:
        """Give turns, memories and threads of ``owner`` a retention, in one transaction.

        Args:
            owner: whose records.
            turns: ``(thread, seq)`` of each turn.
            memories: memory ids.
            threads: thread ids: the thread and every turn of it.
            until: seconds since the epoch; 0 removes the retention.

        Returns:
            Every turn and memory changed (a thread's turns included), in order.

        Raises:
            NotFound / RecordDeleted: a named record never existed, or is gone
                or expired (nothing is changed).
            FailedPrecondition: a named record or thread is sealed (``SEALED``).
        """

        def apply(txn: lmdb.Transaction) -> list[RecordMeta]:
            now = time.time()
            out: list[RecordMeta] = []
            names = [f"{thread_name(owner, t)}/turns/{seq}" for t, seq in turns]
            names += [f"owners/{owner}/memories/{m}" for m in memories]
            for name in names:
                meta = self.resolve(txn, name)
                if meta is None:
                    self._raise_missing(txn, name)
                state = effective_state(meta, now)
                if state is None or self._lineage_gone(txn, meta, now):
                    raise RecordDeleted(f"{name} was deleted")
                if state == SEALED:
                    raise _sealed(name)
                self._retain(txn, meta, until)
                out.append(meta)
            for thread in threads:
                tmeta = self._live_thread(txn, owner, thread)
                if tmeta.kind == REPAIR:
                    raise _sealed(thread_name(owner, thread))
                self._queue_thread(txn, tmeta, until)
                for meta in self._thread_metas(txn, owner, thread):
                    if effective_state(meta, now) not in (None, SEALED):
                        self._retain(txn, meta, until)
                        out.append(meta)
            return out

        return self.writer.run(WriteOp(apply, owner=owner, name="retention.set"))

    def _queue_thread(self, txn: lmdb.Transaction, meta: ThreadMeta, until: float) -> None:
        """Move a thread to ``until`` on the threads' retention queue (0: off it)."""
        self._unqueue_thread(txn, meta)
        meta.expire_time = until
        if until:
            key = sk.thread_expiry_key(until, meta.owner, meta.thread)
            txn.put(key, b"", db=self.t.thread_expiry)
        self._put_thread(txn, meta)

    def set_owner_retention(self, owner: str, seconds: float) -> float:
        """Set the owner's default retention (seconds; 0: none).

        Every turn and memory created from now on expires that long after its
        creation; records already stored keep theirs.

        Returns:
            The previous default, seconds (0: none).
        """

        def apply(txn: lmdb.Transaction) -> float:
            row = self._ensure_owner(txn, owner, time.time())
            before, row.retention = row.retention, seconds
            self._put_owner(txn, owner, row)
            return before

        return self.writer.run(WriteOp(apply, owner=owner, name="retention.owner"))

    def owner_retention(self, owner: str) -> float:
        """The owner's default retention, seconds (0: none)."""
        with self.env.begin() as txn:
            row = self._owner_row(txn, owner)
        return row.retention if row is not None else 0.0

    def expired_threads(self, now: float, limit: int = 1000) -> list[tuple[str, str]]:
        """``(owner, thread)`` of every thread whose retention ended by ``now`` (seconds)."""
        end = sk.expiry_bound(now)
        out: list[tuple[str, str]] = []
        with self.env.begin() as txn:
            for key in sk.scan_keys(txn, self.t.thread_expiry, b""):
                if key[:8] > end or len(out) >= limit:
                    break
                owner, _, thread = key[8:].decode().partition("\x00")
                out.append((owner, thread))
        return out
