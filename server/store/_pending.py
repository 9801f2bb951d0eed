"""The pending window: committing, extending, announcing and finding expiry.

See API.md, ``Lifecycle.Commit`` and ``ExtendPending``, and
``PENDING_EXPIRING``.

Pending records sit on the ``expiry`` queue keyed by their ``expire_time``;
expiry itself is decided on every read by :mod:`server.store._visibility`, and
the sweeper forgets what :meth:`PendingPart.expired` finds.

Thread rules: as every part of :class:`server.store.Store`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import lmdb

from lethe.names import owner_of
from server.errors import FailedPrecondition, Reason, RecordDeleted
from server.store import _schema as sk
from server.store._echoes import ECHO_FORGET, EchoPart, Shingler
from server.store._records import COMMITTED, PENDING, SEALED, MemMeta, RecordMeta, TurnMeta
from server.store._visibility import effective_state, source_alive
from server.store._writer import WriteOp


class PendingPart(EchoPart):
    """Pending-window operations of :class:`server.store.Store`."""

    def commit_records(
        self, names: Sequence[str], include_sources: bool, shingler: Shingler | None = None
    ) -> list[RecordMeta]:
        """Commit turns and memories in one transaction.

        A memory with a pending source fails with ``SOURCE_PENDING`` naming it,
        unless ``include_sources``, which commits those sources (transitively).

        ``shingler``: a text's word shingles, for the owner's echo guards
        (:mod:`server.store._echoes`): a pending record written before a forget
        that echoes its text enters general retrieval only through a commit,
        which the guard checks as it checks a write: a turn is committed
        tainted (``TAINT``), a memory (or any record, ``FORGET``) refuses the
        commit. None: no check.

        Raises:
            NotFound / RecordDeleted: a record never existed / is gone.
            FailedPrecondition: ``SOURCE_PENDING``, or a record is sealed;
                ``ECHOES_FORGOTTEN`` (naming the record).
        """

        def apply(txn: lmdb.Transaction) -> list[RecordMeta]:
            now = time.time()
            out: list[RecordMeta] = []
            changed: list[RecordMeta] = []
            done: set[str] = set()

            def commit_one(name: str, explicit: bool) -> RecordMeta:
                found = self.resolve(txn, name)
                if found is None:
                    self._raise_missing(txn, name)
                if self._lineage_gone(txn, found, now):
                    raise RecordDeleted(f"{name} was built on material that expired")
                meta = found
                state = effective_state(meta, now)
                if state is None or meta.tainted:
                    raise RecordDeleted(f"{name} was deleted")
                if state == SEALED:
                    raise FailedPrecondition(
                        f"{name} is sealed", reason=Reason.SEALED, subject=name
                    )
                if name in done or meta.state == COMMITTED:
                    return meta
                if isinstance(meta, MemMeta):
                    for src, _ in meta.sources:
                        src_meta = self.resolve(txn, src)
                        if src_meta is None or not source_alive(src_meta, now):
                            raise FailedPrecondition(
                                f"source {src} was deleted",
                                reason=Reason.SOURCE_DELETED,
                                subject=src,
                            )
                        if src_meta.state == PENDING:
                            if not include_sources:
                                raise FailedPrecondition(
                                    f"source {src} is pending; commit it first or set "
                                    "include_sources",
                                    reason=Reason.SOURCE_PENDING,
                                    subject=src,
                                )
                            commit_one(src, False)
                self._unqueue_expiry(txn, meta)
                meta.state = COMMITTED
                meta.expire_time = meta.retain_until  # its retention, if it has one
                self._queue_expiry(txn, meta)
                self._put_record(txn, meta)
                changed.append(meta)
                done.add(name)
                if not explicit:
                    out.append(meta)
                return meta

            explicit = [commit_one(name, True) for name in names]
            self._guard_commit(txn, changed, shingler, now)
            return explicit + out

        return self.writer.run(WriteOp(apply, owner=_owner_of(names), name="commit"))

    def _guard_commit(
        self,
        txn: lmdb.Transaction,
        changed: Sequence[RecordMeta],
        shingler: Shingler | None,
        now: float,
    ) -> None:
        """Check the records a commit makes general against the owner's echo guards."""
        if not changed or shingler is None:
            return
        owner = changed[0].owner
        keys = self._live_keys(txn, owner, now)
        if not keys:
            return
        texts = []
        for meta in changed:
            if isinstance(meta, MemMeta):
                view = self.memory_view(
                    meta, meta.version, self._memory_ct(txn, meta, meta.version)
                )
                content = view.content
                texts.append(content.text or " ".join(content.edge or ()))
            else:
                texts.append(
                    self.turn_view(meta, self._read_payloads(txn, meta.rid, False), False).text
                )
        verdicts = self._echo_check(txn, owner, texts, shingler, keys)
        for meta, verdict in zip(changed, verdicts, strict=True):
            if not verdict:
                continue
            if verdict == ECHO_FORGET or not isinstance(meta, TurnMeta):
                raise self._refuse_echo(meta.name)
            self._taint_echo(meta)
            self._put_turn(txn, meta)

    def extend_pending(self, names: Sequence[str], ttl: float) -> list[RecordMeta]:
        """Give pending records ``ttl`` seconds from now; committed ones are returned unchanged.

        Raises:
            NotFound / RecordDeleted: a record never existed / is gone or expired.
            FailedPrecondition: a record is sealed (``SEALED``).
        """

        def apply(txn: lmdb.Transaction) -> list[RecordMeta]:
            now = time.time()
            out: list[RecordMeta] = []
            for name in names:
                meta = self.resolve(txn, name)
                if meta is None:
                    self._raise_missing(txn, name)
                if self._lineage_gone(txn, meta, now):
                    raise RecordDeleted(f"{name} was built on material that expired")
                state = effective_state(meta, now)
                if state is None:
                    raise RecordDeleted(f"{name} was deleted")
                if state == SEALED:
                    raise FailedPrecondition(
                        f"{name} is sealed", reason=Reason.SEALED, subject=name
                    )
                if state == PENDING:
                    self._unqueue_expiry(txn, meta)
                    meta.expire_time = min(now + ttl, meta.retain_until or now + ttl)
                    meta.expiry_warned = False
                    self._queue_expiry(txn, meta)
                    self._put_record(txn, meta)
                out.append(meta)
            return out

        return self.writer.run(WriteOp(apply, owner=_owner_of(names), name="extend"))

    def _queued(
        self, txn: lmdb.Transaction, until: float, limit: int, queue: Any = None
    ) -> list[int]:
        """Record numbers on a queue with ``expire_time`` ≤ ``until``, soonest first.

        The queue is the pending-expiry one unless ``queue`` names another.
        """
        end = sk.expiry_bound(until)
        rids: list[int] = []
        for key in sk.scan_keys(txn, self.t.expiry if queue is None else queue, b""):
            if key[:8] > end or len(rids) >= limit:
                break
            rids.append(sk.rid_of(key[8:]))
        return rids

    def warn_expiring(self, now: float, window: float, limit: int = 1000) -> int:
        """Emit ``PENDING_EXPIRING`` once per pending record expiring within ``window`` seconds.

        Returns how many were announced.
        """

        def apply(txn: lmdb.Transaction) -> int:
            announced = 0
            for rid in self._queued(txn, now + window, limit):
                meta = self._record(txn, rid)
                if meta is None or meta.deleted or meta.expiry_warned or meta.state != PENDING:
                    continue
                meta.expiry_warned = True
                self._put_record(txn, meta)
                self._append_event(txn, meta.owner, "PENDING_EXPIRING", meta.name, now)
                announced += 1
            return announced

        return self.writer.run(WriteOp(apply, name="expiry.warn"))

    def expired(
        self, now: float, limit: int = 1000, *, retention: bool = False
    ) -> list[RecordMeta]:
        """Turns and memories whose ``expire_time`` ≤ ``now`` (seconds).

        Pending ones from the pending-expiry queue, or with ``retention``
        committed ones from the retention queue.
        """
        with self.env.begin() as txn:
            rids = self._queued(txn, now, limit, self.t.retention if retention else None)
            found: list[RecordMeta] = [m for m in self._turns(txn, rids) if not m.deleted]
            for rid in rids:
                mem = self._memory(txn, rid)
                if mem is not None and not mem.deleted:
                    found.append(mem)
            return found

    def pending_stats(self, now: float) -> tuple[int, float]:
        """(number of pending records, age in seconds of the oldest one), turns and memories alike.

        (0, 0.0) when nothing is pending.

        The oldest is the pending record stored longest ago (its ``create_time``),
        whatever its kind and whenever it expires. Record numbers are taken in
        creation order by the one writer, so it is the smallest rid on the expiry
        queue: one scan of the queue's keys (no row decoded but that one).
        """
        with self.env.begin() as txn:
            count = int(txn.stat(self.t.expiry)["entries"])
            oldest_rid = min(
                (sk.rid_of(key[8:]) for key in sk.scan_keys(txn, self.t.expiry, b"")),
                default=None,
            )
            meta = None if oldest_rid is None else self._record(txn, oldest_rid)
        if meta is None:
            return count, 0.0
        return count, max(0.0, now - meta.create_time)


def _owner_of(names: Sequence[str]) -> str:
    """The owner of a batch of record names (the servicer checked there is one)."""
    return (owner_of(names[0]) or "") if names else ""
