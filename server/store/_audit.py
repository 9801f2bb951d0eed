"""The store's half of the audit, and the key/record reconciliation queries.

See API.md, ``Lifecycle.Audit``, and ``lethe audit``.

Counts of broken invariants, all zero in a healthy store (``lethe audit``
exits 1 on any of them):

- ``orphans``: live derivatives with a source that is missing, deleted or
  expired (zero by construction: a deletion cascades in its own transaction);
- ``keys_without_record``: record keys in the keystore that no record uses;
- ``records_without_key``: live records whose record key is gone (kept for an
  operator; see ``server.lifecycle.Lifecycle.recover``);
- ``unreadable_records``: live records whose ciphertext fails to open.

A hint, reported but not a failure:

- ``stale_summaries``: live ``SUMMARY`` memories built before a record in
  their own lineage range changed: a turn whose seq lies between the first
  and the last turn a summary names (in one thread) was forgotten or expired
  after the summary was built. An unrelated turn of the same thread does not
  make it stale. Rebuild it from the sources ``Search`` still finds.
The owner's index-snapshot key, like its slot-digest key, belongs to no record:
it is never counted in ``keys_without_record`` nor destroyed as unused; stray
snapshots and snapshot keys are counted apart
(:meth:`server.store.Store.snapshot_strays`, the periodic audit's
``lethe_index_snapshot_strays``).

``index_drift`` needs the in-memory indexes, which the store does not hold:
the retriever measures it (:meth:`server.retrieval.Retriever.index_drift`).

Thread rules: read-only except :meth:`AuditPart.destroy_unreferenced_keys`
(writer thread, through a ``WriteOp``); any thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import lmdb

from lethe.names import InvalidName, TurnName, parse_record
from server.errors import DataLoss, RecordDeleted
from server.store import _json
from server.store import _schema as sk
from server.store._base import memory_ring, no_pace, record_ring, thread_name
from server.store._echoes import guard_keys_in
from server.store._records import MemMeta, RecordMeta, ThreadMeta, TurnMeta
from server.store._shapes import SLOT_KEY_ID
from server.store._snapshots import SNAPSHOT_KEY_ID, SnapshotsPart
from server.store._visibility import effective_state
from server.store._writer import WriteOp
from shredder import RingRef


@dataclass(slots=True)
class KeyCheck:
    """Where live records' keys are (:meth:`AuditPart.check_keys`).

    Attributes:
        missing: live records (and threads) with a key that is in no ring.
        misplaced: ``(ring it is in, key id, ring the data names)`` of keys an
            interrupted move left in another ring of the owner.
        unreferenced: record keys in the keystore that no stored row names
            (deleted rows included) and that are no owner's slot or snapshot key: what
            :meth:`AuditPart.destroy_unreferenced_keys` destroys.
    """

    missing: list[RecordMeta | ThreadMeta] = field(default_factory=list)
    misplaced: list[tuple[RingRef, str, RingRef]] = field(default_factory=list)
    unreferenced: list[tuple[RingRef, str]] = field(default_factory=list)


@dataclass(slots=True)
class AuditCounts:
    """Counts of an audit (see the module docstring); ``checked`` = records examined."""

    checked: int = 0
    orphans: int = 0
    stale_summaries: int = 0
    keys_without_record: int = 0
    records_without_key: int = 0
    index_drift: int = 0
    unreadable_records: int = 0

    def healthy(self) -> bool:
        """No broken invariant (stale summaries are a rebuild hint, not a failure)."""
        return not (
            self.orphans
            or self.keys_without_record
            or self.records_without_key
            or self.index_drift
            or self.unreadable_records
        )


def _noop(txn: lmdb.Transaction) -> None:
    del txn


class AuditPart(SnapshotsPart):
    """Audit and reconciliation queries of :class:`server.store.Store`."""

    def owners(self) -> list[str]:
        """Every owner with a row in the store."""
        with self.env.begin() as txn:
            return [key.decode() for key in sk.scan_keys(txn, self.t.owners, b"")]

    def audit(
        self,
        owner: str,
        *,
        integrity: bool = True,
        keys: bool = True,
        pace: Callable[[], object] = no_pace,
    ) -> AuditCounts:
        """Audit one owner's records and keys (``index_drift`` left at 0).

        A record whose key is missing is read again in a new transaction and
        counted only if it is still live then: a forget marks its records
        deleted before it destroys their keys, so one that lands while the
        audit runs is not counted as a key loss.

        Args:
            owner: the owner audited.
            integrity: open every live record's ciphertext (content and vector)
                to count the unreadable ones; without it, count those bulk
                reads found unreadable since start (the cheap periodic audit).
            keys: count ``keys_without_record`` (a listing of the owner's
                keystore rings); the periodic audit, which has no gauge for
                it, skips it (0).
            pace: called after each record read and each checked (the
                periodic audit's :class:`server.lifecycle._pacing.Pacer`,
                which sleeps while calls are in flight; the read transaction
                stays open meanwhile).
        """
        counts = AuditCounts()
        now = time.time()
        keyless_turns: list[int] = []
        keyless_memories: list[int] = []
        with self.env.begin() as txn:
            turns = self._owner_turn_metas(txn, owner, pace)
            memories = self._owner_memory_metas(txn, owner)
            threads = {meta.thread: meta for meta in self._owner_threads(txn, owner)}
            counts.checked = len(turns) + len(memories)
            for turn in turns:
                if not turn.deleted and not self.keystore.has_record_key(
                    RingRef(owner, turn.ring_thread), turn.key_id
                ):
                    keyless_turns.append(turn.rid)
                pace()
            for mem in self._memories_read(txn, memories, now):
                pace()
                if mem.deleted or effective_state(mem, now) is None:
                    continue
                if not self.keystore.has_record_key(memory_ring(mem), mem.key_id):
                    keyless_memories.append(mem.rid)
                if any(self._gone(txn, name, now) for name, _ in mem.sources):
                    counts.orphans += 1
                if mem.kind == "SUMMARY" and self._stale(txn, mem, threads):
                    counts.stale_summaries += 1
            if integrity:
                counts.unreadable_records = self._unreadable(txn, turns, memories, now)
            guards = guard_keys_in(txn, self.t, owner) if keys else set()
        counts.records_without_key = self._still_keyless(owner, keyless_turns, keyless_memories)
        if not integrity:
            counts.unreadable_records = self.unreadable_count(owner)
        if keys:  # a standing echo guard's key is used
            used = self._used_keys(owner, threads.values(), turns, memories) | guards
            counts.keys_without_record = len(self._unused(owner, used))
        return counts

    def _still_keyless(self, owner: str, turn_rids: list[int], memory_rids: list[int]) -> int:
        """How many of these records, found without their key, are live and keyless now.

        Read in a transaction begun after the keys were looked up: a record a
        forget deleted meanwhile reads deleted (or is gone) and is not counted.
        """
        if not turn_rids and not memory_rids:
            return 0
        now = time.time()
        count = 0
        with self.env.begin() as txn:
            for rid in turn_rids:
                turn = self._turn(txn, rid)
                if turn is not None and not turn.deleted:
                    ring = RingRef(owner, turn.ring_thread)
                    count += not self.keystore.has_record_key(ring, turn.key_id)
            found = [m for m in (self._memory(txn, rid) for rid in memory_rids) if m is not None]
            for mem in self._memories_read(txn, found, now):
                if not mem.deleted and effective_state(mem, now) is not None:
                    count += not self.keystore.has_record_key(memory_ring(mem), mem.key_id)
        return count

    def _unreadable(
        self, txn: lmdb.Transaction, turns: list[TurnMeta], memories: list[MemMeta], now: float
    ) -> int:
        """Open every live record's content (and vector); count those that fail."""
        bad = 0
        for turn in turns:
            if turn.deleted or not self.keystore.has_record_key(record_ring(turn), turn.key_id):
                continue
            try:
                cts = self._read_payloads(txn, turn.rid, turn.has_embedding)
                self.turn_view(turn, cts, with_embedding=turn.has_embedding)
            except (DataLoss, RecordDeleted):
                self.note_unreadable(turn)
                bad += 1
        for mem in memories:
            if mem.deleted or effective_state(mem, now) is None:
                continue
            if not self.keystore.has_record_key(memory_ring(mem), mem.key_id):
                continue
            try:
                self.memory_view(mem, mem.version, self._memory_ct(txn, mem, mem.version))
                vec = sk.get(
                    txn, self.t.mpayloads, sk.memory_payload_key(mem.rid, mem.version, "embedding")
                )
                if mem.has_embedding and vec is not None:
                    self.open_memory(mem, mem.version, "embedding", vec)
            except (DataLoss, RecordDeleted):
                self.note_unreadable(mem)
                bad += 1
        return bad

    def _stale(self, txn: lmdb.Transaction, mem: MemMeta, threads: dict[str, ThreadMeta]) -> bool:
        """Whether a turn in the summary's own lineage range went away after the summary was built.

        Gone means forgotten or expired (see the module docstring).
        """
        ranges: dict[str, tuple[int, int]] = {}
        for name, _ in mem.sources:
            try:
                parsed = parse_record(name)
            except InvalidName:
                continue
            if not isinstance(parsed, TurnName) or parsed.thread not in threads:
                continue
            lo, hi = ranges.get(parsed.thread, (parsed.seq, parsed.seq))
            ranges[parsed.thread] = (min(lo, parsed.seq), max(hi, parsed.seq))
        for thread, (lo, hi) in ranges.items():
            last = threads[thread].last_deletion_time
            if not last or last <= mem.update_time:
                continue  # nothing of this thread was forgotten since the summary
            for seq in range(lo, hi + 1):
                stone = self._tombstone_of(txn, f"owners/{mem.owner}/threads/{thread}/turns/{seq}")
                if stone is not None and stone.time > mem.update_time:
                    return True
        return False

    def _gone(self, txn: lmdb.Transaction, name: str, now: float) -> bool:
        meta = self.resolve(txn, name)
        return meta is None or effective_state(self._as_read(txn, meta, now), now) is None

    @staticmethod
    def _used_keys(
        owner: str,
        threads: Iterable[ThreadMeta],
        turns: list[TurnMeta],
        memories: list[MemMeta],
    ) -> set[tuple[RingRef, str]]:
        # The owner's slot-digest key indexes slots, its snapshot key seals its
        # index snapshot: they belong to no single record.
        used: set[tuple[RingRef, str]] = {
            (RingRef(owner, None), SLOT_KEY_ID),
            (RingRef(owner, None), SNAPSHOT_KEY_ID),
        }
        for meta in threads:
            used.add((RingRef(owner, meta.thread), meta.title_key))
        for turn in turns:
            used.add((RingRef(owner, turn.ring_thread), turn.key_id))
        for mem in memories:
            for key_id in mem.key_ids.values():
                used.add((memory_ring(mem), key_id))
        return used

    def _unused(self, owner: str, used: set[tuple[RingRef, str]]) -> list[tuple[RingRef, str]]:
        return [ref for ref in self.keystore.list_record_keys(owner) if ref not in used]

    def unreferenced_keys(self, owner: str) -> list[tuple[RingRef, str]]:
        """Record keys of ``owner`` that no record uses (``keys_without_record``).

        An echo guard's key is used while its guard's rows stand.
        """
        with self.env.begin() as txn:
            threads = self._owner_threads(txn, owner)
            turns = self._owner_turn_metas(txn, owner)
            memories = self._owner_memory_metas(txn, owner)
            guards = guard_keys_in(txn, self.t, owner)
        return self._unused(owner, self._used_keys(owner, threads, turns, memories) | guards)

    def destroy_unreferenced_keys(self, check: KeyCheck | None = None) -> int:
        """Destroy record keys no record uses; returns how many.

        They are keys made for writes a crash cut short, or the keys of records
        a restored backup does not hold. Only at start-up and restore, when no
        write is in flight. ``check``: a :meth:`check_keys` made since the last
        change (start-up has one; its pass already found them), else the keys
        are looked up owner by owner.
        """
        if check is not None:
            stray = list(check.unreferenced)
        else:
            owners = set(self.owners()) | {r.owner for r, _ in self.keystore.list_record_keys()}
            stray = [ref for owner in sorted(owners) for ref in self.unreferenced_keys(owner)]
        if stray:
            self.writer.run(WriteOp(_noop, destroy_keys=stray, name="keys.destroy_stray"))
        return len(stray)

    def _record_keys_named(
        self, txn: lmdb.Transaction
    ) -> Iterator[tuple[bytes | RecordMeta | ThreadMeta, str, str | None, str, bool]]:
        """Every key a stored row names: a turn's, each memory version's, a thread's title key.

        Yields (the record or thread, or a turn's stored row to decode with
        ``TurnMeta.decode``; the owner and thread of the ring its data names,
        None for the owner ring; key id; whether the data needs the key); the
        key is needed when the row is live (a repair concluded with DESTROY
        keeps no title key, by design).

        A turn's row is read for those fields only: start-up reads every row,
        and at 100k turns whole decodes were most of its time.
        """
        for _, raw in sk.scan(txn, self.t.turns, b""):
            row = _json.loads(raw)
            thread = row.get("key_ring") or row["thread"]
            yield raw, row["owner"], thread, row["key_id"], not row.get("deleted")
        for _, raw in sk.scan(txn, self.t.memories, b""):
            mem = MemMeta.decode(raw)
            for key_id in mem.key_ids.values():
                yield mem, mem.owner, mem.ring_thread or None, key_id, not mem.deleted
        for _, raw in sk.scan(txn, self.t.threads, b""):
            thread = ThreadMeta.decode(raw)
            needed = bool(thread.title_key) and not thread.deleted
            yield thread, thread.owner, thread.thread, thread.title_key, needed

    def check_keys(self) -> KeyCheck:
        """Where the key of every live record is: one pass over the data, one keystore listing.

        Used by start-up recovery and by the audit. Keys are compared as
        ``(owner, thread or None, key id)`` tuples of strings.
        """
        inventory = {
            (ring.owner, ring.thread, key_id): ring
            for ring, key_id in self.keystore.list_record_keys()
        }
        by_id: dict[tuple[str, str], list[RingRef]] = {}
        for (owner, _, key_id), ring in inventory.items():
            by_id.setdefault((owner, key_id), []).append(ring)
        check = KeyCheck()
        named: set[tuple[str, str | None, str]] = set()
        missing: set[str] = set()
        with self.env.begin() as txn:
            # An echo guard's key, while it stands.
            named |= {(r.owner, r.thread, key_id) for r, key_id in guard_keys_in(txn, self.t)}
            for found, owner, thread, key_id, needed in self._record_keys_named(txn):
                ident = (owner, thread, key_id)
                named.add(ident)
                if not needed or ident in inventory:
                    continue
                ring = RingRef(owner, thread)
                elsewhere = [r for r in by_id.get((owner, key_id), []) if r != ring]
                if len(elsewhere) == 1:
                    check.misplaced.append((elsewhere[0], key_id, ring))
                    continue
                record = TurnMeta.decode(found) if isinstance(found, bytes) else found
                name = (
                    thread_name(record.owner, record.thread)
                    if isinstance(record, ThreadMeta)
                    else record.name
                )
                if name not in missing:
                    missing.add(name)
                    check.missing.append(record)
        check.unreferenced = sorted(
            (
                (inventory[ident], ident[2])
                for ident in inventory.keys() - named
                if not (ident[1] is None and ident[2] in (SLOT_KEY_ID, SNAPSHOT_KEY_ID))
            ),
            key=lambda ref: (ref[0].owner, ref[1]),
        )
        return check

    def relocate_keys(self, misplaced: Sequence[tuple[RingRef, str, RingRef]]) -> int:
        """Move each key back to the ring its record names; returns how many keys moved.

        This completes or undoes a move (a seal) that a crash cut between the
        keystore and the data commit, as the data decided.
        """
        by_target: dict[RingRef, list[tuple[RingRef, str]]] = {}
        for found, key_id, wanted in misplaced:
            by_target.setdefault(wanted, []).append((found, key_id))
        for wanted, refs in by_target.items():
            op = WriteOp(_noop, rewrap_keys=refs, rewrap_to=wanted, name="keys.relocate")
            self.writer.run(op)
        return len(misplaced)

    def shred_decided(self, record: RecordMeta | ThreadMeta, ring: RingRef, key_id: str) -> bool:
        """Whether a missing key was destroyed on purpose after ``record`` was made.

        The shred log names the key, its ring or its owner: the record's
        deletion was decided, and forgetting it is only the rest of that
        decision.
        """
        when = self.keystore.shredded_at(ring, key_id)
        return when is not None and when >= record.create_time - 1.0

    def records_without_key(self, check: KeyCheck | None = None) -> list[TurnMeta | MemMeta]:
        """Live turns and memories whose current record key is in no ring.

        From ``check`` when the caller has a current one, else from a new
        :meth:`check_keys`.
        """
        out: list[TurnMeta | MemMeta] = []
        for record in (check or self.check_keys()).missing:
            if isinstance(record, TurnMeta):
                out.append(record)
            elif isinstance(record, MemMeta):
                current = self.keystore.has_record_key(memory_ring(record), record.key_id)
                if not current:
                    out.append(record)
        return out

    def threads_without_key(self, check: KeyCheck | None = None) -> list[ThreadMeta]:
        """Live threads whose title key is in no ring (their ring was destroyed).

        ``check`` as for :meth:`records_without_key`.
        """
        return [r for r in (check or self.check_keys()).missing if isinstance(r, ThreadMeta)]

    def retire_unused_kek_versions(self) -> list[int]:
        """Finish a rotation a crash cut short; returns the KEK versions destroyed.

        See :meth:`shredder.Keystore.retire_unused_kek_versions`.
        """
        return self.keystore.retire_unused_kek_versions()

    def key_count(self) -> int:
        """Live wrapped keys in the keystore (``lethe_keystore_keys``)."""
        return self.keystore.key_count()

    def unrotated_since(self) -> float | None:
        """When the oldest shred not yet completed by a rotation happened (seconds), or None."""
        return self.keystore.unrotated_since()

    def rotate(self) -> tuple[int, int, list[int]]:
        """Complete pending shreds now (:meth:`shredder.Keystore.rotate`).

        On the writer thread, like every keystore write.

        Returns:
            (rings renewed, ring keys moved to a new KEK version, KEK versions destroyed).
        """
        return self.writer.run(WriteOp(lambda txn: self.keystore.rotate(), name="rotation"))
