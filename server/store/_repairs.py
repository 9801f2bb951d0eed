"""Repair threads: sealing a stretch after the fact, reopening, pausing, and a repair's state.

Sealing a stretch of conversation after the fact, reopening, pausing and the
state of a repair (ARCHITECTURE.md, "Repair threads"; API.md, ``Repairs``).
Concluding one is a forget (:mod:`server.store._forget`).

``seal_repair`` moves turn ``from_seq`` and every later live turn of a
conversation into a new ``REPAIR`` thread (state ``PAUSED``) in one keystore
transaction plus one data transaction: the turns keep their names and place
but become ``SEALED``, and their record keys are re-wrapped under the repair
thread's ring (ciphertext is not rewritten). Derivatives whose sources are all
sealed are sealed with them (their keys move too); derivatives that mix
sealed and unsealed sources are deleted, and a ``REBUILD_REQUESTED`` event
names the unsealed ones. Sealed material is invisible everywhere but
:meth:`RepairsPart.repair_contents` (``ReopenRepair``), and pending expiry
never applies to it.

Thread rules: as every part of :class:`server.store.Store`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

import lmdb

from lethe.names import new_id
from server.errors import Aborted, DataLoss, FailedPrecondition, Reason, RecordDeleted
from server.store import _schema as sk
from server.store._base import memory_ring, thread_name
from server.store._forget import DeletionEntry, ForgetPart, ForgetTargets, Planner
from server.store._lineage import children_of
from server.store._memories import MemoriesPart
from server.store._records import (
    COMMITTED,
    CONVERSATION,
    PAYLOAD_TITLE,
    PENDING,
    REPAIR,
    REPAIR_CONTINUED,
    REPAIR_PAUSED,
    SEALED,
    MemMeta,
    ThreadMeta,
    TurnMeta,
)
from server.store._views import MemoryDraft, MemoryView, ThreadView, TurnView
from server.store._visibility import effective_state
from server.store._writer import WriteOp
from shredder import AssociatedData, RingRef


class RepairsPart(ForgetPart, MemoriesPart):
    """Repair operations of :class:`server.store.Store`, over the forget and memories parts.

    Concluding writes a lesson and forgets in one transaction.
    """

    # ------------------------------------------------------------------ sealing

    def _seal_set(
        self, txn: lmdb.Transaction, owner: str, thread: str, from_seq: int, now: float
    ) -> tuple[list[TurnMeta], list[MemMeta], list[MemMeta]]:
        """(turns to seal, memories sealed with them, mixed memories to delete)."""
        source = self._live_thread(txn, owner, thread)
        if source.kind != CONVERSATION:
            raise FailedPrecondition(
                f"{thread_name(owner, thread)} is a repair thread; it cannot be sealed again",
                reason=Reason.ILLEGAL_TRANSITION,
                subject=thread_name(owner, thread),
            )
        turns = [
            m
            for m in self._thread_metas(txn, owner, thread)
            if m.seq >= from_seq and effective_state(m, now) in (PENDING, COMMITTED)
        ]
        if not turns or turns[0].seq != from_seq:
            name = f"{thread_name(owner, thread)}/turns/{from_seq}"
            first = self._turn_at(txn, owner, thread, from_seq)
            if first is None:
                self._raise_missing(txn, name)
            if first.state == SEALED:
                raise FailedPrecondition(f"{name} is sealed", reason=Reason.SEALED, subject=name)
            raise RecordDeleted(f"{name} was deleted")
        sealed = {m.name for m in turns}
        candidates: dict[str, MemMeta] = {}
        frontier = list(sealed)
        while frontier:
            nxt = []
            for name in frontier:
                for child, _ in children_of(txn, self.t, name):
                    meta = self.resolve(txn, child)
                    if isinstance(meta, MemMeta) and not meta.deleted and child not in candidates:
                        candidates[child] = meta
                        nxt.append(child)
            frontier = nxt
        changed = True
        sealed_mems: list[MemMeta] = []
        while changed:
            changed = False
            for name, meta in list(candidates.items()):
                if all(src in sealed for src, _ in meta.sources):
                    sealed.add(name)
                    sealed_mems.append(meta)
                    del candidates[name]
                    changed = True
        return turns, sealed_mems, list(candidates.values())

    def seal_repair(
        self, owner: str, thread: str, from_seq: int
    ) -> tuple[ThreadView, DeletionEntry | None, list[int]]:
        """Seal turn ``from_seq`` and every later live turn into a new repair thread.

        Returns:
            (the repair thread, the deletion-log entry of the mixed derivatives
            deleted on the way or None, rids that left the general index).

        Raises:
            NotFound / RecordDeleted: the thread or turn ``from_seq``.
            FailedPrecondition: the turn is already sealed (``SEALED``) or the
                thread is a repair (``ILLEGAL_TRANSITION``).
            Aborted: the stretch changed while the seal was prepared; retry.
        """
        now = time.time()
        with self.env.begin() as txn:
            turns, mems, _ = self._seal_set(txn, owner, thread, from_seq, now)
        repair_id = f"repair-{secrets.token_hex(6)}"
        ring = RingRef(owner, repair_id)
        moves = [(RingRef(owner, t.ring_thread), t.key_id) for t in turns] + [
            (memory_ring(m), key_id) for m in mems for key_id in m.key_ids.values()
        ]
        title_key = "title-" + secrets.token_hex(8)
        expected = ({t.rid for t in turns}, {m.rid for m in mems})

        def apply(txn: lmdb.Transaction) -> tuple[ThreadView, DeletionEntry | None, list[int]]:
            now = time.time()
            turns_now, mems_now, mixed = self._seal_set(txn, owner, thread, from_seq, now)
            if ({t.rid for t in turns_now}, {m.rid for m in mems_now}) != expected:
                raise Aborted("the stretch changed while it was being sealed; retry")
            meta = ThreadMeta(owner, repair_id, REPAIR, now, now, 0, title_key)
            meta.repair_source = thread
            meta.repair_from_seq = from_seq
            meta.repair_state = REPAIR_PAUSED
            self._put_thread(txn, meta)
            ad = AssociatedData(owner, thread_name(owner, repair_id), 1, PAYLOAD_TITLE)
            title = f"repair of {thread} from turn {from_seq}"
            txn.put(
                sk.thread_key(owner, repair_id),
                self._seal(ring, title_key, ad, title.encode()),
                db=self.t.titles,
            )
            for turn in turns_now:
                self._unqueue_expiry(txn, turn)
                turn.state, turn.expire_time, turn.key_ring = SEALED, 0.0, repair_id
                self._put_turn(txn, turn)
            for mem in mems_now:
                self._unqueue_expiry(txn, mem)
                mem.state, mem.expire_time, mem.ring_thread = SEALED, 0.0, repair_id
                self._put_memory(txn, mem)
            # Responses elsewhere that used the sealed stretch are tainted: they
            # may repeat it, and sealed material is invisible everywhere.
            sealed_now = {t.name for t in turns_now} | {m.name for m in mems_now}
            tainted: list[int] = []
            for source in sealed_now:
                for child, _ in list(children_of(txn, self.t, source)):
                    found = self.resolve(txn, child)
                    if (
                        isinstance(found, TurnMeta)
                        and child not in sealed_now
                        and not found.tainted
                        and not found.deleted
                    ):
                        found.tainted = True
                        self._put_turn(txn, found)
                        tainted.append(found.rid)
            entry = None
            if mixed:
                sealed_names = {t.name for t in turns_now} | {m.name for m in mems_now}
                plan = Planner(self, txn, owner, now, "SEALED")
                for mem in mixed:
                    if mem.name in plan.deleted_names:
                        continue
                    survivors = [(n, v) for n, v in mem.sources if n not in sealed_names]
                    plan.delete_memory(mem)
                    plan.cascaded += 1
                    plan.targets.append(mem.name)
                    if survivors:
                        plan.events.append(("REBUILD_REQUESTED", mem.name, survivors))
                plan.cascade(delete_responses=False)
                entry = plan.write(now)
            view = ThreadView(meta, title)
            left = [t.rid for t in turns_now] + [m.rid for m in mems_now] + tainted
            return view, entry, left

        return self.writer.run(
            WriteOp(
                apply,
                owner=owner,
                create_keys=[(ring, title_key)],
                rewrap_keys=moves,
                rewrap_to=ring,
                name="seal",
            )
        )

    # ------------------------------------------------------------------ repair state

    def repair(self, owner: str, repair_id: str) -> ThreadView:
        """The repair thread (its title is not read: a repair's view carries none).

        Raises:
            NotFound / RecordDeleted: no such repair. FailedPrecondition: not a repair.
        """
        with self.env.begin() as txn:
            meta = self._live_thread(txn, owner, repair_id)
        if meta.kind != REPAIR:
            name = thread_name(owner, repair_id)
            raise FailedPrecondition(
                f"{name} is not a repair thread", reason=Reason.ILLEGAL_TRANSITION, subject=name
            )
        return ThreadView(meta, "")

    def set_repair_state(
        self,
        owner: str,
        repair_id: str,
        allowed: Sequence[str],
        state: str,
        outcome: str | None = None,
    ) -> ThreadView:
        """Move a repair to ``state`` if it is in one of ``allowed`` states.

        Raises:
            FailedPrecondition: ``ILLEGAL_TRANSITION`` otherwise.
        """

        def apply(txn: lmdb.Transaction) -> ThreadView:
            meta = self._live_thread(txn, owner, repair_id)
            name = thread_name(owner, repair_id)
            if meta.kind != REPAIR or meta.repair_state not in allowed:
                raise FailedPrecondition(
                    f"{name} is {meta.repair_state or meta.kind}; cannot become {state}",
                    reason=Reason.ILLEGAL_TRANSITION,
                    subject=name,
                )
            meta.repair_state = state
            if outcome is not None:
                meta.repair_outcome = outcome
            meta.update_time = time.time()
            self._put_thread(txn, meta)
            return ThreadView(meta, "")

        return self.writer.run(WriteOp(apply, owner=owner, name="repair.state"))

    def repair_contents(
        self, owner: str, repair_id: str
    ) -> tuple[list[TurnView], list[TurnView], list[MemoryView]]:
        """Decrypt what a repair holds: its sealed stretch, its own turns, its sealed memories.

        Returns (sealed stretch of the source thread, the repair thread's own
        turns, sealed memories). The one read path that opens sealed records;
        only ``ReopenRepair`` calls it.
        """
        rows: list[tuple[TurnMeta, dict[str, bytes]]] = []
        own: list[tuple[TurnMeta, dict[str, bytes]]] = []
        mem_rows: list[tuple[MemMeta, bytes | None]] = []
        with self.env.begin() as txn:
            meta = self._live_thread(txn, owner, repair_id)
            for turn in self._thread_metas(txn, owner, meta.repair_source):
                if turn.key_ring == repair_id and turn.state == SEALED:
                    rows.append((turn, self._read_payloads(txn, turn.rid, False)))
            for turn in self._thread_metas(txn, owner, repair_id):
                own.append((turn, self._read_payloads(txn, turn.rid, False)))
            for mem in self._owner_memory_metas(txn, owner):
                if mem.ring_thread == repair_id and mem.state == SEALED and not mem.deleted:
                    mem_rows.append((mem, self._memory_ct(txn, mem, mem.version)))

        def views(items: list[tuple[TurnMeta, dict[str, bytes]]]) -> list[TurnView]:
            out = []
            for turn, cts in items:
                try:
                    out.append(self.turn_view(turn, cts, False))
                except DataLoss:  # one bad record stays one bad record
                    self.note_unreadable(turn)
            return out

        mems: list[MemoryView] = []
        for mem, ct in mem_rows:
            try:
                mems.append(self.memory_view(mem, mem.version, ct))
            except DataLoss:
                self.note_unreadable(mem)
        return views(rows), views(own), mems

    def _repair_members(
        self, txn: lmdb.Transaction, owner: str, meta: ThreadMeta
    ) -> tuple[list[tuple[str, int]], list[str]]:
        """((thread, seq) of every turn a repair holds, its live memory ids)."""
        repair_id = meta.thread
        turns = [
            (t.thread, t.seq)
            for t in self._thread_metas(txn, owner, meta.repair_source)
            if t.key_ring == repair_id
        ] + [(t.thread, t.seq) for t in self._thread_metas(txn, owner, repair_id)]
        mems = [
            m.memory_id
            for m in self._owner_memory_metas(txn, owner)
            if m.ring_thread == repair_id and not m.deleted
        ]
        return turns, mems

    def conclude_repair(
        self,
        owner: str,
        repair_id: str,
        outcome: str,
        lesson: MemoryDraft | None = None,
    ) -> tuple[ThreadView, DeletionEntry, MemoryView | None]:
        """Conclude a repair with ``DESTROY`` or ``DISTILL``, in one transaction.

        The transaction writes the lesson (for ``DISTILL``: a committed root
        ``LESSON`` whose only link is the repair's name), marks the repair
        ``CONCLUDED``, and takes step 1 of forgetting everything it holds (its
        ring is destroyed in step 3). After a crash, either all of it happened
        or none.

        Returns:
            (the concluded repair, the deletion-log entry to finish, the lesson or None).

        Raises:
            NotFound / RecordDeleted: no such repair.
            FailedPrecondition: not a repair, or already concluded other than
                ``PRESERVE_RESTRICTED`` (reason ``ILLEGAL_TRANSITION``).
        """
        key_id = secrets.token_hex(8)
        lesson_id = new_id()
        owner_ring = RingRef(owner, None)

        def apply(txn: lmdb.Transaction) -> tuple[ThreadView, DeletionEntry, MemoryView | None]:
            now = time.time()
            meta = self._live_thread(txn, owner, repair_id)
            name = thread_name(owner, repair_id)
            restricted = meta.repair_outcome == "PRESERVE_RESTRICTED"
            if meta.kind != REPAIR or (
                meta.repair_state not in (REPAIR_PAUSED, REPAIR_CONTINUED) and not restricted
            ):
                raise FailedPrecondition(
                    f"{name} is already concluded", reason=Reason.ILLEGAL_TRANSITION, subject=name
                )
            made = None
            if lesson is not None:
                made = self._insert_memory(
                    txn, owner, lesson_id, lesson, key_id, "", commit=True, pending_ttl=0.0, now=now
                )
            else:
                op.unused.append((owner_ring, key_id))
            turns, memories = self._repair_members(txn, owner, meta)
            targets = ForgetTargets.of(
                turns=turns,
                memories=memories,
                extra_rings=[repair_id],
                conclude_repair=(repair_id, outcome),
            )
            entry = self._plan(
                txn, owner, now, targets, reason=f"REPAIR_{outcome}", request_time=now
            )
            concluded = self._thread_row(txn, owner, repair_id)
            assert concluded is not None
            return ThreadView(concluded, ""), entry, made

        op = WriteOp(apply, owner=owner, create_keys=[(owner_ring, key_id)], name="repair.conclude")
        return self.writer.run(op)
