"""The declared base of every part of the record store.

:class:`StoreBase` names what every part may use — the data environment, its
:class:`~server.store._schema.Tables`, the keystore, the KEK ring and the one
writer — and holds the helpers the parts share: record lookups, the one event
writer, tombstones, the pending-expiry queue, and decrypting rows into views.
The parts (:mod:`._threads`, :mod:`._memories`, :mod:`._repairs`,
:mod:`._forget`, :mod:`._audit`) inherit it and :class:`~server.store.Store`
composes them (chroma's ``chromadb/db/base.py``: mixins over a declared base,
never over stubs).

Thread rules: every ``txn`` argument is a transaction the caller owns; write
helpers run only inside a :class:`~server.store._writer.WriteOp` on the writer
thread. Read helpers are safe from any thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NoReturn, TypeVar, cast

import lmdb
import numpy as np

from lethe.names import InvalidName, MemoryName, parse_record
from server.errors import DataLoss, NotFound, RecordDeleted
from server.store import _schema as sk
from server.store._lineage import ancestors_of, children_of
from server.store._records import (
    COMMITTED,
    PAYLOAD_CONTENT,
    PAYLOAD_EMBEDDING,
    PAYLOAD_MEMORY,
    PAYLOAD_TITLE,
    PENDING,
    EventRow,
    MemMeta,
    OwnerRow,
    RecordMeta,
    ThreadMeta,
    Tombstone,
    TurnMeta,
    unpack_content,
)
from server.store._reserve import DiskReserve
from server.store._schema import Tables
from server.store._views import MemoryContent, MemoryView, ThreadView, TurnView
from server.store._visibility import effective_state, thread_gone
from server.store._writer import Writer
from shredder import (
    AssociatedData,
    IntegrityError,
    KekRing,
    KeyNotFoundError,
    KeyReader,
    Keystore,
    RingRef,
)

_log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=TurnMeta | MemMeta)
_C = TypeVar("_C")
_V = TypeVar("_V")


def no_pace() -> None:
    """The ``pace`` of work that need not yield (every call but the periodic audit's)."""


def memory_ring(meta: MemMeta) -> RingRef:
    """The ring holding a memory's record keys (its thread's, or the owner's)."""
    return RingRef(meta.owner, meta.ring_thread or None)


def record_ring(meta: RecordMeta) -> RingRef:
    """The ring holding a record's current key."""
    if isinstance(meta, MemMeta):
        return memory_ring(meta)
    return RingRef(meta.owner, meta.ring_thread)


def thread_name(owner: str, thread: str) -> str:
    return f"owners/{owner}/threads/{thread}"


class StoreBase:
    """Declared state and shared helpers of the record store (see the module docstring)."""

    env: lmdb.Environment
    t: Tables
    keystore: Keystore
    kek: KekRing
    writer: Writer
    disk_reserve: DiskReserve
    """The ballast a deletion may free on a full filesystem (:mod:`server.store._reserve`)."""
    _event_owners: set[str]
    """Owners of events appended since the last commit (writer thread only)."""
    # name -> owner of every record whose ciphertext failed to open since start.
    unreadable: dict[str, str]
    _unreadable_guard: threading.Lock
    # The KeyReader of this thread's open key_batch (``reader``), if any.
    _key_batch: threading.local

    # ------------------------------------------------------------------ key batches

    @contextlib.contextmanager
    def key_batch(self) -> Iterator[None]:
        """In the block, this thread's payloads share a keystore snapshot and unwrap each key once.

        For bulk reads — a search's hits, an index build, a listing — every
        payload this thread opens shares one keystore snapshot and each record
        key is unwrapped once (``shredder.KeyReader``). Nested blocks share the
        outer one. Visibility is decided by the caller's data read as always; a
        key destroyed after the block began may still open a ciphertext the
        caller already fetched, as one ``open`` begun earlier would.
        """
        if getattr(self._key_batch, "reader", None) is not None:
            yield
            return
        reader = self.keystore.reader()
        self._key_batch.reader = reader
        try:
            yield
        finally:
            self._key_batch.reader = None
            reader.close()

    # ------------------------------------------------------------------ bad rows

    def note_unreadable(self, meta: RecordMeta) -> None:
        """Count a record whose ciphertext failed to open (``DataLoss``) once, and log it by id.

        Never its content. Bulk reads skip such a record; it stays
        ``DATA_LOSS`` by name until an operator forgets or restores it.
        """
        with self._unreadable_guard:
            if meta.name in self.unreadable:
                return
            self.unreadable[meta.name] = meta.owner
        _log.error("record %s (rid %d) is unreadable: skipped by bulk reads", meta.name, meta.rid)

    def unreadable_count(self, owner: str | None = None) -> int:
        """Records found unreadable since start (of ``owner``, or of every owner)."""
        with self._unreadable_guard:
            return sum(1 for o in self.unreadable.values() if owner is None or o == owner)

    def open_each(
        self, rows: Iterable[tuple[_M, _C]], open_one: Callable[[_M, _C], _V]
    ) -> list[_V]:
        """``open_one(meta, ciphertexts)`` for each fetched row, in order, skipping bad ones.

        All under one :meth:`key_batch`. A row whose key was destroyed since it
        was read (``RecordDeleted``) is gone and skipped; one whose ciphertext
        fails to open (``DataLoss``) is counted by :meth:`note_unreadable` and
        skipped, so one bad record never fails a bulk read.
        """
        out: list[_V] = []
        with self.key_batch():
            for meta, cts in rows:
                try:
                    out.append(open_one(meta, cts))
                except RecordDeleted:
                    continue
                except DataLoss:
                    self.note_unreadable(meta)
        return out

    # ------------------------------------------------------------------ crypto

    def _seal(self, ring: RingRef, key_id: str, ad: AssociatedData, plaintext: bytes) -> bytes:
        """Seal a payload under a record key.

        On the writer thread, a key the running group just created is used as
        created, not unwrapped again.
        """
        fresh = self.writer.fresh
        if fresh is not None:
            sealed = fresh.seal(ring, key_id, ad, plaintext)
            if sealed is not None:
                return sealed
        return self.keystore.seal(ring, key_id, ad, plaintext)

    def _open(
        self, ring: RingRef, key_id: str, ad: AssociatedData, ciphertext: bytes, name: str
    ) -> bytes:
        """Open one payload of record ``name``.

        Raises:
            RecordDeleted: its record key was destroyed on purpose (the shred log
                says so: a forget decided it).
            DataLoss: the ciphertext fails authentication while its key exists,
                or the key is missing without a decided deletion.
        """
        reader: KeyReader | None = getattr(self._key_batch, "reader", None)
        try:
            if reader is not None:
                return reader.open(ring, key_id, ad, ciphertext)
            return self.keystore.open(ring, key_id, ad, ciphertext)
        except KeyNotFoundError:
            if self.keystore.shredded_at(ring, key_id) is not None:
                raise RecordDeleted(f"{name} was deleted") from None
            raise DataLoss(f"the key of {name} is missing, and no deletion decided it") from None
        except IntegrityError:
            raise DataLoss(f"stored ciphertext of {name} failed authentication") from None

    def open_turn_payload(self, meta: TurnMeta, payload_type: str, ciphertext: bytes) -> bytes:
        """Decrypt one payload of a turn.

        Raises:
            RecordDeleted: its record key was destroyed.
            DataLoss: the ciphertext fails authentication while its key exists.
        """
        ad = AssociatedData(meta.owner, meta.name, meta.version, payload_type)
        return self._open(
            RingRef(meta.owner, meta.ring_thread), meta.key_id, ad, ciphertext, meta.name
        )

    def open_memory(self, meta: MemMeta, version: int, ptype: str, ct: bytes) -> bytes:
        """Decrypt one payload of one memory version.

        Raises:
            RecordDeleted: its key was destroyed. DataLoss: authentication failed.
        """
        ad = AssociatedData(meta.owner, meta.name, version, ptype)
        return self._open(memory_ring(meta), meta.key_ids[str(version)], ad, ct, meta.name)

    def _seal_memory(self, meta: MemMeta, version: int, ptype: str, plain: bytes) -> bytes:
        ad = AssociatedData(meta.owner, meta.name, version, ptype)
        return self._seal(memory_ring(meta), meta.key_ids[str(version)], ad, plain)

    # ------------------------------------------------------------------ views

    def turn_view(self, meta: TurnMeta, cts: dict[str, bytes], with_embedding: bool) -> TurnView:
        """Decrypt a turn's payloads (``cts`` maps payload type to ciphertext).

        Raises:
            RecordDeleted: its key was destroyed. DataLoss: a ciphertext is corrupt
                or missing while the record is live.
        """
        if PAYLOAD_CONTENT not in cts:
            raise RecordDeleted(f"{meta.name} was deleted")
        try:
            speaker, text = unpack_content(
                self.open_turn_payload(meta, PAYLOAD_CONTENT, cts[PAYLOAD_CONTENT])
            )
        except (ValueError, UnicodeDecodeError):
            raise DataLoss(f"stored content of {meta.name} is malformed") from None
        emb = None
        if with_embedding and meta.has_embedding and PAYLOAD_EMBEDDING in cts:
            raw = self.open_turn_payload(meta, PAYLOAD_EMBEDDING, cts[PAYLOAD_EMBEDDING])
            emb = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        return TurnView(meta, text, speaker, emb)

    def memory_view(self, meta: MemMeta, version: int, ct: bytes | None) -> MemoryView:
        """Decrypt one memory version's content payload (``ct``; None when absent).

        Raises:
            RecordDeleted: the payload or its key is gone. DataLoss: corrupt.
        """
        if ct is None:
            raise RecordDeleted(f"{meta.name} was deleted")
        try:
            content = MemoryContent.decode(self.open_memory(meta, version, PAYLOAD_MEMORY, ct))
        except (ValueError, KeyError, TypeError):
            raise DataLoss(f"stored content of {meta.name} is malformed") from None
        status = "SUPERSEDED" if version in meta.superseded else meta.status
        return MemoryView(meta, version, status, content, list(meta.sources))

    def view_of(self, meta: RecordMeta, cts: dict[str, bytes]) -> TurnView | MemoryView:
        """Decrypt a fetched row (see ``fetch``).

        Raises:
            RecordDeleted: its key was destroyed. DataLoss: authentication failed.
        """
        if isinstance(meta, MemMeta):
            return self.memory_view(meta, meta.version, cts.get(PAYLOAD_MEMORY))
        return self.turn_view(meta, cts, with_embedding=False)

    def _thread_view(self, meta: ThreadMeta, ciphertext: bytes | None) -> ThreadView:
        title = ""
        if ciphertext is not None:
            name = thread_name(meta.owner, meta.thread)
            ad = AssociatedData(meta.owner, name, 1, PAYLOAD_TITLE)
            ring = RingRef(meta.owner, meta.thread)
            title = self._open(ring, meta.title_key, ad, ciphertext, name).decode()
        return ThreadView(meta, title)

    def _read_payloads(
        self, txn: lmdb.Transaction, rid: int, with_embedding: bool
    ) -> dict[str, bytes]:
        """A turn's ciphertexts: content, and its vector when ``with_embedding``."""
        types = [PAYLOAD_CONTENT] + ([PAYLOAD_EMBEDDING] if with_embedding else [])
        out = {}
        for ptype in types:
            ct = sk.get(txn, self.t.payloads, sk.payload_key(rid, ptype))
            if ct is not None:
                out[ptype] = ct
        return out

    def _memory_ct(self, txn: lmdb.Transaction, meta: MemMeta, version: int) -> bytes | None:
        """The content ciphertext of one memory version, or None."""
        return sk.get(
            txn, self.t.mpayloads, sk.memory_payload_key(meta.rid, version, PAYLOAD_MEMORY)
        )

    # ------------------------------------------------------------------ lookups

    def _raise_missing(self, txn: lmdb.Transaction, name: str) -> NoReturn:
        """Raise ``RecordDeleted`` if ``name`` has a tombstone, else ``NotFound``."""
        if self._tombstone_of(txn, name) is not None:
            raise RecordDeleted(f"{name} was deleted")
        raise NotFound(f"{name} not found")

    def _tombstone_of(self, txn: lmdb.Transaction, name: str) -> Tombstone | None:
        raw = sk.get(txn, self.t.tombstones, sk.tombstone_key(name))
        return None if raw is None else Tombstone.decode(raw)

    def _turn(self, txn: lmdb.Transaction, rid: int) -> TurnMeta | None:
        raw = sk.get(txn, self.t.turns, sk.rid_key(rid))
        return None if raw is None else TurnMeta.decode(raw)

    def _turns(self, txn: lmdb.Transaction, rids: Sequence[int]) -> list[TurnMeta]:
        """Metadata of ``rids`` that are turns (missing ones skipped), in order."""
        return [m for m in (self._turn(txn, rid) for rid in rids) if m is not None]

    def _turn_at(self, txn: lmdb.Transaction, owner: str, thread: str, seq: int) -> TurnMeta | None:
        rk = sk.get(txn, self.t.seqs, sk.seq_key(owner, thread, seq))
        return None if rk is None else self._turn(txn, sk.rid_of(rk))

    def _memory(self, txn: lmdb.Transaction, rid: int) -> MemMeta | None:
        raw = sk.get(txn, self.t.memories, sk.rid_key(rid))
        return None if raw is None else MemMeta.decode(raw)

    def _mem_by_id(self, txn: lmdb.Transaction, owner: str, memory_id: str) -> MemMeta | None:
        rk = sk.get(txn, self.t.memory_ids, sk.memory_id_key(owner, memory_id))
        return None if rk is None else self._memory(txn, sk.rid_of(rk))

    def _record(self, txn: lmdb.Transaction, rid: int) -> RecordMeta | None:
        """The turn or memory with record number ``rid``."""
        return self._turn(txn, rid) or self._memory(txn, rid)

    def resolve(self, txn: lmdb.Transaction, name: str) -> RecordMeta | None:
        """The metadata row a turn or memory name points at (deleted rows included)."""
        try:
            parsed = parse_record(name)
        except InvalidName:
            return None
        if isinstance(parsed, MemoryName):
            return self._mem_by_id(txn, parsed.owner, parsed.memory)
        return self._turn_at(txn, parsed.owner, parsed.thread, parsed.seq)

    def _thread_row(self, txn: lmdb.Transaction, owner: str, thread: str) -> ThreadMeta | None:
        raw = sk.get(txn, self.t.threads, sk.thread_key(owner, thread))
        return None if raw is None else ThreadMeta.decode(raw)

    def _live_thread(self, txn: lmdb.Transaction, owner: str, thread: str) -> ThreadMeta:
        """The thread's metadata if it exists, is not being forgotten and has not expired.

        Raises:
            RecordDeleted: forgotten (tombstone), being forgotten, or past its
                retention. NotFound: never existed.
        """
        meta = self._thread_row(txn, owner, thread)
        name = thread_name(owner, thread)
        if meta is None:
            self._raise_missing(txn, name)
        if thread_gone(meta, time.time()):
            raise RecordDeleted(f"{name} was deleted")
        return meta

    def _thread_metas(
        self,
        txn: lmdb.Transaction,
        owner: str,
        thread: str,
        *,
        with_deleted: bool = False,
        lo: int = 1,
        hi: int | None = None,
    ) -> list[TurnMeta]:
        """A thread's stored turns of seqs ``lo..hi``, in seq order; reads only those rows.

        ``lo..hi`` is inclusive; ``hi`` None: to the end. Tombstoned turns only
        ``with_deleted``.
        """
        out = []
        start = sk.seq_key(owner, thread, lo) if lo > 1 else None
        for key, rk in sk.scan(txn, self.t.seqs, sk.thread_prefix(owner, thread), start=start):
            if hi is not None and sk.seq_of(key) > hi:
                break
            meta = self._turn(txn, sk.rid_of(rk))
            if meta is not None and (with_deleted or not meta.deleted):
                out.append(meta)
        return out

    def _owner_threads(self, txn: lmdb.Transaction, owner: str) -> list[ThreadMeta]:
        """Every thread row of ``owner`` by id (being-forgotten ones included)."""
        return [
            ThreadMeta.decode(raw)
            for _, raw in sk.scan(txn, self.t.threads, sk.owner_prefix(owner))
        ]

    def _owner_thread_ids(self, txn: lmdb.Transaction, owner: str) -> list[str]:
        prefix = sk.owner_prefix(owner)
        return [key[len(prefix) :].decode() for key in sk.scan_keys(txn, self.t.threads, prefix)]

    def _owner_memory_metas(self, txn: lmdb.Transaction, owner: str) -> list[MemMeta]:
        """Every stored memory of ``owner`` by id (deleted rows included)."""
        out = []
        for _, rk in sk.scan(txn, self.t.memory_ids, sk.owner_prefix(owner)):
            meta = self._memory(txn, sk.rid_of(rk))
            if meta is not None:
                out.append(meta)
        return out

    def _owner_turn_metas(
        self, txn: lmdb.Transaction, owner: str, pace: Callable[[], object] = no_pace
    ) -> list[TurnMeta]:
        """Every stored turn of ``owner`` by record number (deleted rows included).

        ``pace`` is called after each row (background work yielding to calls:
        ``server.lifecycle._pacing``).
        """
        prefix = sk.owner_prefix(owner)
        out = []
        for key in sk.scan_keys(txn, self.t.owner_records, prefix):
            meta = self._turn(txn, sk.rid_of(key[len(prefix) :]))
            if meta is not None:
                out.append(meta)
            pace()
        return out

    def _owner_row(self, txn: lmdb.Transaction, owner: str) -> OwnerRow | None:
        raw = sk.get(txn, self.t.owners, sk.owner_key(owner))
        return None if raw is None else OwnerRow.decode(raw)

    # ------------------------------------------------------------------ lineage at read time

    def _lineage_gone(
        self,
        txn: lmdb.Transaction,
        meta: RecordMeta,
        now: float,
        seen: dict[str, bool] | None = None,
    ) -> bool:
        """Whether a record built on pending material has lost it.

        Lost means a source (or a source's source) expired, was deleted or
        tainted. Checked only once the earliest pending expiry of its lineage
        (``lineage_expiry``) has passed, so the hot path pays one comparison.
        """
        if not meta.lineage_expiry or now < meta.lineage_expiry:
            return False
        seen = {} if seen is None else seen
        if meta.name in seen:
            return seen[meta.name]
        seen[meta.name] = False  # lineage is a DAG; this only guards the walk
        gone = False
        for name, _ in ancestors_of(txn, self.t, meta.name):
            source = self.resolve(txn, name)
            if (
                source is None
                or source.tainted
                or effective_state(source, now) is None
                or self._lineage_gone(txn, source, now, seen)
            ):
                gone = True
                break
        seen[meta.name] = gone
        return gone

    def _as_read(self, txn: lmdb.Transaction, meta: RecordMeta, now: float) -> RecordMeta:
        """``meta`` as every read path must see it now; a copy, the row is unchanged.

        When its lineage lost a pending source that expired (before the sweeper
        forgot it), a turn is tainted and a memory is gone, exactly as after
        the forget.
        """
        if not self._lineage_gone(txn, meta, now):
            return meta
        if isinstance(meta, MemMeta):
            return dataclasses.replace(meta, deleted=True)
        return dataclasses.replace(meta, tainted=True)

    def _turn_read(self, txn: lmdb.Transaction, rid: int, now: float) -> TurnMeta | None:
        """A turn's metadata as reads see it (:meth:`_as_read`)."""
        turn = self._turn(txn, rid)
        return None if turn is None else cast(TurnMeta, self._as_read(txn, turn, now))

    def _memory_read(self, txn: lmdb.Transaction, meta: MemMeta, now: float) -> MemMeta:
        """A memory's metadata as reads see it (:meth:`_as_read`)."""
        return cast(MemMeta, self._as_read(txn, meta, now))

    def _turns_read(
        self, txn: lmdb.Transaction, metas: Sequence[TurnMeta], now: float
    ) -> list[TurnMeta]:
        return [cast(TurnMeta, self._as_read(txn, m, now)) for m in metas]

    def _memories_read(
        self, txn: lmdb.Transaction, metas: Sequence[MemMeta], now: float
    ) -> list[MemMeta]:
        return [cast(MemMeta, self._as_read(txn, m, now)) for m in metas]

    # ------------------------------------------------------------------ writes

    def _put_turn(self, txn: lmdb.Transaction, meta: TurnMeta) -> None:
        txn.put(sk.rid_key(meta.rid), meta.encode(), db=self.t.turns)
        self._note_change(meta.owner, meta.rid)

    def _put_memory(self, txn: lmdb.Transaction, meta: MemMeta) -> None:
        txn.put(sk.rid_key(meta.rid), meta.encode(), db=self.t.memories)
        self._note_change(meta.owner, meta.rid)

    def _note_change(self, owner: str, rid: int) -> None:
        """Note a changed turn or memory row for the change log (:mod:`._changes`)."""

    def _note_reset(self, owner: str) -> None:
        """Note that the owner's indexes must be loaded again (:mod:`._changes`)."""

    def _note_event(self, owner: str) -> None:
        """Note that the owner got events, for the change log (:mod:`._changes`)."""

    def _put_record(self, txn: lmdb.Transaction, meta: RecordMeta) -> None:
        if isinstance(meta, MemMeta):
            self._put_memory(txn, meta)
        else:
            self._put_turn(txn, meta)

    def _put_thread(self, txn: lmdb.Transaction, meta: ThreadMeta) -> None:
        txn.put(sk.thread_key(meta.owner, meta.thread), meta.encode(), db=self.t.threads)

    def _put_owner(self, txn: lmdb.Transaction, owner: str, row: OwnerRow) -> None:
        txn.put(sk.owner_key(owner), row.encode(), db=self.t.owners)

    def _ensure_owner(self, txn: lmdb.Transaction, owner: str, now: float) -> OwnerRow:
        """The owner's row, created (dimension 0) when missing."""
        row = self._owner_row(txn, owner)
        if row is None:
            row = OwnerRow(0, now)
            self._put_owner(txn, owner, row)
        return row

    def _next_rids(self, txn: lmdb.Transaction, count: int) -> int:
        """Reserve ``count`` record numbers; returns the first."""
        return sk.take_numbers(txn, self.t.meta, sk.NEXT_RID, count)

    def _queue_expiry(self, txn: lmdb.Transaction, meta: RecordMeta) -> None:
        """Put a record on its queue at its ``expire_time``.

        A pending record goes on the pending-expiry queue (``expiry``), a
        committed one on the retention queue (``retention``).
        """
        if meta.expire_time and meta.state in (PENDING, COMMITTED):
            table = self.t.expiry if meta.state == PENDING else self.t.retention
            txn.put(sk.expiry_key(meta.expire_time, meta.rid), b"", db=table)

    def _unqueue_expiry(self, txn: lmdb.Transaction, meta: RecordMeta) -> None:
        """Take a record off whichever queue holds it (its ``expire_time`` is unchanged)."""
        if meta.expire_time:
            key = sk.expiry_key(meta.expire_time, meta.rid)
            txn.delete(key, db=self.t.expiry)
            txn.delete(key, db=self.t.retention)

    def _unqueue_thread(self, txn: lmdb.Transaction, meta: ThreadMeta) -> None:
        """Take a thread off the threads' retention queue (its ``expire_time`` is unchanged)."""
        if meta.expire_time:
            key = sk.thread_expiry_key(meta.expire_time, meta.owner, meta.thread)
            txn.delete(key, db=self.t.thread_expiry)

    def _retain(self, txn: lmdb.Transaction, meta: RecordMeta, until: float) -> None:
        """Give a live record the retention ``until`` (seconds; 0: none), in ``txn``.

        A committed record expires then; a pending one's window only gets
        shorter (its retention applies in full once committed). What was derived
        from it rechecks its lineage from then on (:meth:`_propagate_expiry`).
        """
        self._unqueue_expiry(txn, meta)
        meta.retain_until = until
        if meta.state == COMMITTED:
            meta.expire_time = until
        elif meta.state == PENDING and until:
            meta.expire_time = min(meta.expire_time or until, until)
        self._queue_expiry(txn, meta)
        self._put_record(txn, meta)
        if meta.expire_time:
            self._propagate_expiry(txn, meta.name, meta.expire_time)

    def _propagate_expiry(self, txn: lmdb.Transaction, name: str, when: float) -> None:
        """Make every descendant of ``name`` recheck its lineage from ``when`` (seconds) on.

        A derivative is never more durable than its sources: once a source
        expires, reads see the derivative as after its forget (a memory gone, a
        response tainted) before any sweeper runs.
        """
        seen = {name}
        frontier = [name]
        while frontier:
            nxt = []
            for node in frontier:
                for child, _ in children_of(txn, self.t, node):
                    if child in seen:
                        continue
                    seen.add(child)
                    meta = self.resolve(txn, child)
                    if meta is None or meta.deleted:
                        continue
                    if not meta.lineage_expiry or when < meta.lineage_expiry:
                        meta.lineage_expiry = when
                        self._put_record(txn, meta)
                    nxt.append(child)
            frontier = nxt

    def _born_retention(
        self, txn: lmdb.Transaction, owner: str, now: float, *bounds: float
    ) -> float:
        """The retention of a record created now: the owner's default or ``bounds``, the earliest.

        ``bounds`` are absolute times in seconds (0: none), such as the thread's
        retention or one the request asked for. 0 when there is none.
        """
        row = self._owner_row(txn, owner)
        times = [b for b in bounds if b]
        if row is not None and row.retention:
            times.append(now + row.retention)
        return min(times) if times else 0.0

    def _append_event(
        self,
        txn: lmdb.Transaction,
        owner: str,
        event_type: str,
        subject: str,
        now: float,
        sources: Sequence[tuple[str, int]] = (),
        receipt: str = "",
    ) -> None:
        """Append one event (ids only) in the caller's transaction."""
        self._append_events(txn, owner, [(event_type, subject, sources)], now, receipt)

    def _append_events(
        self,
        txn: lmdb.Transaction,
        owner: str,
        events: Sequence[tuple[str, str, Sequence[tuple[str, int]]]],
        now: float,
        receipt: str = "",
    ) -> None:
        """Append ``(type, subject, sources)`` events of one owner (ids only): the one event writer.

        In the caller's transaction, numbered consecutively in that order. The
        counter is read and written once for the whole batch (a 1,000-turn
        forget announces 1,000 events).
        """
        if not events:
            return
        number = sk.take_numbers(txn, self.t.meta, sk.NEXT_EVENT, len(events))
        for event_type, subject, sources in events:
            row = EventRow(str(number), owner, now, event_type, subject, list(sources), receipt)
            txn.put(sk.event_key(owner, number), row.encode(), db=self.t.events)
            number += 1
        self._event_owners.add(owner)  # announced after the commit (see ._events)
        self._note_event(owner)

    def _tombstone(
        self,
        txn: lmdb.Transaction,
        name: str,
        now: float,
        deletion_id: str,
        reason: str,
        *,
        last_seq: int = 0,
        last_version: int = 0,
    ) -> None:
        """Write a tombstone (see :class:`~server.store._records.Tombstone`)."""
        stone = Tombstone(now, reason, deletion_id, last_seq, last_version)
        txn.put(sk.tombstone_key(name), stone.encode(), db=self.t.tombstones)
        parts = name.split("/")
        if len(parts) in (2, 4) and parts[0] == "owners":  # the owner, or a whole thread
            self._note_reset(parts[1])

    def _release_slot(self, txn: lmdb.Transaction, meta: MemMeta) -> None:
        """Free the slot ``meta`` holds, if it holds one."""
        if not meta.slot_digest:
            return
        key = sk.slot_key(meta.owner, meta.slot_digest)
        if sk.get(txn, self.t.slots, key) == sk.rid_key(meta.rid):
            txn.delete(key, db=self.t.slots)
        meta.slot_digest = ""


def lineage_expiry_of(sources: Sequence[RecordMeta]) -> float:
    """The earliest expiry in the lineage of a record built on ``sources``, in seconds.

    A pending source's window or a committed source's retention, or the
    ``lineage_expiry`` a source carries; 0 when there is none. When a record's
    ``lineage_expiry`` passes, reads recheck its lineage.
    """
    times = [s.expire_time for s in sources if s.state in (PENDING, COMMITTED) and s.expire_time]
    times += [s.lineage_expiry for s in sources if s.lineage_expiry]
    return min(times) if times else 0.0
