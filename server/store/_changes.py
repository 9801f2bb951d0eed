"""The change log: which rows of an owner changed, for processes that share a data directory.

``lethe serve --processes N`` runs several processes over one data directory;
each keeps its own in-memory indexes of the owners it serves
(:mod:`server.retrieval`). A write made through one process must reach the
others' indexes before they answer a search of that owner, and a forgotten
record must leave their memory. The change log says what to bring in line:

- Every data transaction that puts or deletes a turn or memory row of an
  owner (or tombstones a thread or the owner, or moves the owner) appends one
  entry for that owner, in the same transaction: ``changes[owner 0x00 seq]``,
  ``seq`` counting from 1 per owner, holding the record numbers (rids) whose
  row changed, or ``*`` when the owner's indexes must be loaded again (a whole
  thread or the owner forgotten, the owner imported or released); an entry
  naming no row says the owner got events (``Watch`` streams of the other
  processes are woken by it: :meth:`ChangesPart.owners_changed_since`). So an entry
  commits exactly when its rows do, and LMDB's one write transaction at a time
  across processes orders the entries.
- The meta counter :data:`~server.store._schema.CHANGES` counts entries over
  every owner, and each entry is also listed under ``0x00 count`` (8 bytes BE;
  no owner id is empty, so no owner's prefix starts with 0x00) with its owner
  as value: a process that polls reads which owners changed since it last
  looked (:meth:`ChangesPart.owners_changed_since`).
- Each owner keeps its last :data:`KEEP` entries, the feed its last
  :data:`FEED_KEEP`; a reader that fell further
  behind is told to load the owner again (:meth:`ChangesPart.changes_since`
  returns None), as for ``*``.

Rows are noted on the writer thread while a group's ops run
(:meth:`ChangesPart._note_change`) and written just before the group's data
transaction commits (:meth:`ChangesPart._write_changes`, the writer's
``before_commit``). An op whose nested transaction was rolled back may still
leave its rids in the entry: replaying a row that did not change changes
nothing, so an entry may name too many rows, never too few.

The log is kept only by a store opened for several processes
(``Store(shared=True)``); a store of one process has nothing to tell.

Thread rules: as every part of :class:`server.store.Store`; ``_note_*`` and
``_write_changes`` only on the writer thread.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence

import lmdb

from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._records import MemMeta, TurnMeta

RESET = b"*"
"""An entry that says: load the owner's indexes again."""
KEEP = 1024
"""Entries kept per owner; a reader further behind loads the owner again."""
FEED_KEEP = 16384
"""Entries of the feed over every owner kept; a poller further behind treats every
owner as changed."""
_FEED = b"\x00"


class ChangesPart(StoreBase):
    """Writing and reading the change log (module docstring)."""

    change_log: bool
    """Whether this store keeps the change log (opened for several processes)."""
    _pending_changes: dict[str, set[int] | None]
    """owner -> rids noted in the data transaction under way (None: a reset)."""

    def _note_change(self, owner: str, rid: int) -> None:
        """Note that the row of ``rid`` (a turn or memory of ``owner``) changed."""
        if not self.change_log:
            return
        rids = self._pending_changes.setdefault(owner, set())
        if rids is not None:
            rids.add(rid)

    def _note_reset(self, owner: str) -> None:
        """Note that the owner's indexes must be loaded again (a thread or the owner went)."""
        if self.change_log:
            self._pending_changes[owner] = None

    def _note_event(self, owner: str) -> None:
        """Note that the owner got events (an entry, if nothing else, naming no row)."""
        if self.change_log:
            self._pending_changes.setdefault(owner, set())

    def _begin_changes(self) -> None:
        """The writer's hook before a data transaction: nothing noted yet."""
        self._pending_changes = {}

    def _write_changes(self, txn: lmdb.Transaction) -> None:
        """The writer's hook just before a data transaction commits: one entry per owner noted."""
        pending, self._pending_changes = self._pending_changes, {}
        if not pending:
            return
        number = sk.take_numbers(txn, self.t.meta, sk.CHANGES, len(pending))
        for owner, rids in sorted(pending.items()):
            seq = self._change_seq(txn, owner) + 1
            value = RESET if rids is None else b"".join(sk.rid_key(r) for r in sorted(rids))
            txn.put(sk.change_key(owner, seq), value, db=self.t.changes)
            if seq > KEEP:
                txn.delete(sk.change_key(owner, seq - KEEP), db=self.t.changes)
            txn.put(_FEED + sk.rid_key(number), owner.encode(), db=self.t.changes)
            if number > FEED_KEEP:
                txn.delete(_FEED + sk.rid_key(number - FEED_KEEP), db=self.t.changes)
            number += 1

    def _change_seq(self, txn: lmdb.Transaction, owner: str) -> int:
        """The owner's last change-log entry number (0 before any)."""
        prefix = sk.owner_prefix(owner)
        cur = txn.cursor(db=self.t.changes)
        if not cur.set_range(prefix + b"\xff" * 8):
            if not cur.last():
                return 0
        elif not cur.prev():
            return 0
        key = bytes(cur.key())
        if not key.startswith(prefix) or len(key) != len(prefix) + 8:
            return 0
        return int(struct.unpack(">Q", key[len(prefix) :])[0])

    def change_seq(self, owner: str) -> int:
        """The owner's last change-log entry number (0 before any); one read transaction."""
        with self.env.begin() as txn:
            return self._change_seq(txn, owner)

    def owners_changed_since(self, count: int) -> tuple[int, set[str] | None]:
        """Owners with a change-log entry after the first ``count`` of the feed.

        Returns:
            ``(entries written so far, owners)``; owners is None when entries
            after ``count`` are no longer kept (every owner may have changed).
        """
        with self.env.begin() as txn:
            last = int(sk.get(txn, self.t.meta, sk.CHANGES) or b"1") - 1
            if last <= count:
                return last, set()
            if last - count > FEED_KEEP:
                return last, None
            start = _FEED + sk.rid_key(count + 1)
            return last, {v.decode() for _, v in sk.scan(txn, self.t.changes, _FEED, start=start)}

    def changed_records(self, rids: Sequence[int]) -> tuple[list[TurnMeta], list[MemMeta]]:
        """The turns and memories among ``rids`` as reads see them now (one read transaction).

        Rows no longer stored (purged) are in neither list.
        """
        now = time.time()
        with self.env.begin() as txn:
            turns = self._turns_read(txn, self._turns(txn, rids), now)
            mems = [m for m in (self._memory(txn, r) for r in rids) if m is not None]
            return turns, self._memories_read(txn, mems, now)

    def changes_since(self, owner: str, seq: int) -> tuple[int, set[int] | None]:
        """What changed of ``owner`` after its entry ``seq``, from one read transaction.

        Returns:
            ``(last entry number, rids whose row changed since)``; the rids are
            None when the owner must be loaded again (an entry ``*`` since, or
            entries after ``seq`` no longer kept).
        """
        with self.env.begin() as txn:
            last = self._change_seq(txn, owner)
            if last <= seq:
                return last, set()
            if last - seq > KEEP:
                return last, None
            rids: set[int] = set()
            start = sk.change_key(owner, seq + 1)
            for _, value in sk.scan(txn, self.t.changes, sk.owner_prefix(owner), start=start):
                if value == RESET:
                    return last, None
                rids.update(sk.rid_of(value[i : i + 8]) for i in range(0, len(value), 8))
            return last, rids
