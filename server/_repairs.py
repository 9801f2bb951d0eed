"""Repair threads: sealing a stretch of conversation after the fact, and the
pending-window operations that sit beside it (ARCHITECTURE.md, "Repair
threads"; API.md, ``Repairs`` and ``Lifecycle.ExtendPending``).

``seal_repair`` moves turn ``from_seq`` and every later live turn of a
conversation into a new ``REPAIR`` thread (state ``PAUSED``) in one keystore
transaction plus one data transaction: the turns keep their names and place
but become ``SEALED``, and their record keys are re-wrapped under the repair
thread's ring (ciphertext is not rewritten). Derivatives whose sources are all
sealed are sealed with them (their keys move too); derivatives that mix
sealed and unsealed sources are deleted, and a ``REBUILD_REQUESTED`` event
names the unsealed ones. Sealed material is invisible everywhere but
:meth:`RepairMixin.repair_contents` (``ReopenRepair``), and pending expiry
never applies to it.

Thread rules: as :class:`server._store.Store`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import lmdb

from server._lineage import children_of
from server._memories import memory_ring
from server._records import (
    COMMITTED,
    PAYLOAD_CONTENT,
    PAYLOAD_MEMORY,
    PAYLOAD_TITLE,
    PENDING,
    SEALED,
    MemMeta,
    ThreadMeta,
    TurnMeta,
    expiry_key,
    memory_payload_key,
    payload_key,
    rid_key,
    thread_key,
)
from server._visibility import effective_state
from server._writer import WriteOp
from server.errors import Aborted, FailedPrecondition, RecordDeleted
from shredder import AssociatedData, RingRef

if TYPE_CHECKING:
    from server._memories import MemoryView
    from server._store import ThreadView, TurnView, _PlanState
    from server._writer import Writer
    from shredder import Keystore

REPAIR_PAUSED = "PAUSED"
REPAIR_CONTINUED = "CONTINUED"
REPAIR_CONCLUDED = "CONCLUDED"


class RepairMixin:
    """Repair and pending-window operations of :class:`server._store.Store`."""

    if TYPE_CHECKING:  # provided by Store and MemoryMixin
        env: lmdb.Environment
        db: dict[str, Any]
        writer: Writer
        keystore: Keystore

        def _raise_missing(self, txn: lmdb.Transaction, name: str) -> NoReturn: ...
        def _live_thread(self, txn: lmdb.Transaction, owner: str, thread: str) -> ThreadMeta: ...
        def _thread_metas(
            self, txn: lmdb.Transaction, owner: str, thread: str
        ) -> list[TurnMeta]: ...
        def _owner_memory_metas(self, txn: lmdb.Transaction, owner: str) -> list[MemMeta]: ...
        def resolve(self, txn: lmdb.Transaction, name: str) -> TurnMeta | MemMeta | None: ...
        def _seal(
            self,
            txn: lmdb.Transaction,
            ring: RingRef,
            key_id: str,
            ad: AssociatedData,
            plaintext: bytes,
        ) -> bytes: ...
        def _plan_state(
            self, txn: lmdb.Transaction, owner: str, now: float, reason: str
        ) -> _PlanState: ...
        def _write_plan(
            self, txn: lmdb.Transaction, plan: _PlanState, now: float
        ) -> dict[str, Any]: ...
        def turn_view(
            self, meta: TurnMeta, cts: dict[str, bytes], with_embedding: bool
        ) -> TurnView: ...
        def memory_view(self, meta: MemMeta, version: int, ct: bytes | None) -> MemoryView: ...
        def _thread_view(self, meta: ThreadMeta, ciphertext: bytes | None) -> ThreadView: ...

    # ------------------------------------------------------------------ sealing

    def _seal_set(
        self, txn: lmdb.Transaction, owner: str, thread: str, from_seq: int, now: float
    ) -> tuple[list[TurnMeta], list[MemMeta], list[MemMeta]]:
        """(turns to seal, memories sealed with them, mixed memories to delete)."""
        source = self._live_thread(txn, owner, thread)
        if source.kind != "CONVERSATION":
            raise FailedPrecondition(
                f"owners/{owner}/threads/{thread} is a repair thread; it cannot be sealed again",
                reason="ILLEGAL_TRANSITION",
                subject=f"owners/{owner}/threads/{thread}",
            )
        turns = [
            m
            for m in self._thread_metas(txn, owner, thread)
            if m.seq >= from_seq and effective_state(m, now) in (PENDING, COMMITTED)
        ]
        if not turns or turns[0].seq != from_seq:
            name = f"owners/{owner}/threads/{thread}/turns/{from_seq}"
            first = self.resolve(txn, name)
            if first is None:
                self._raise_missing(txn, name)
            if first.state == SEALED:
                raise FailedPrecondition(f"{name} is sealed", reason="SEALED", subject=name)
            raise RecordDeleted(f"{name} was deleted")
        sealed = {m.name for m in turns}
        candidates: dict[str, MemMeta] = {}
        frontier = list(sealed)
        while frontier:
            nxt = []
            for name in frontier:
                for child, _ in children_of(txn, self.db["lineage_down"], name):
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
    ) -> tuple[ThreadView, dict[str, Any] | None, list[int]]:
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

        def apply(txn: lmdb.Transaction) -> tuple[ThreadView, dict[str, Any] | None, list[int]]:
            now = time.time()
            turns_now, mems_now, mixed = self._seal_set(txn, owner, thread, from_seq, now)
            if ({t.rid for t in turns_now}, {m.rid for m in mems_now}) != expected:
                raise Aborted("the stretch changed while it was being sealed; retry")
            meta = ThreadMeta(owner, repair_id, "REPAIR", now, now, 0, title_key)
            meta.repair_source = thread
            meta.repair_from_seq = from_seq
            meta.repair_state = REPAIR_PAUSED
            txn.put(thread_key(owner, repair_id), meta.encode(), db=self.db["threads"])
            name = f"owners/{owner}/threads/{repair_id}"
            ad = AssociatedData(owner, name, 1, PAYLOAD_TITLE)
            title = f"repair of {thread} from turn {from_seq}".encode()
            txn.put(
                thread_key(owner, repair_id),
                self._seal(txn, ring, title_key, ad, title),
                db=self.db["titles"],
            )
            for turn in turns_now:
                if turn.expire_time:
                    txn.delete(expiry_key(turn.expire_time, turn.rid), db=self.db["expiry"])
                turn.state, turn.expire_time, turn.key_ring = SEALED, 0.0, repair_id
                txn.put(rid_key(turn.rid), turn.encode(), db=self.db["turns"])
            for mem in mems_now:
                if mem.expire_time:
                    txn.delete(expiry_key(mem.expire_time, mem.rid), db=self.db["expiry"])
                mem.state, mem.expire_time, mem.ring_thread = SEALED, 0.0, repair_id
                txn.put(rid_key(mem.rid), mem.encode(), db=self.db["memories"])
            # Responses elsewhere that used the sealed stretch are tainted: they
            # may repeat it, and sealed material is invisible everywhere.
            sealed_now = {t.name for t in turns_now} | {m.name for m in mems_now}
            tainted: list[int] = []
            for source in sealed_now:
                for child, _ in list(children_of(txn, self.db["lineage_down"], source)):
                    found = self.resolve(txn, child)
                    if (
                        isinstance(found, TurnMeta)
                        and child not in sealed_now
                        and not found.tainted
                        and not found.deleted
                    ):
                        found.tainted = True
                        txn.put(rid_key(found.rid), found.encode(), db=self.db["turns"])
                        tainted.append(found.rid)
            entry = None
            if mixed:
                sealed_names = {t.name for t in turns_now} | {m.name for m in mems_now}
                plan = self._plan_state(txn, owner, now, "SEALED")
                for mem in mixed:
                    if mem.name in plan.deleted_names:
                        continue
                    survivors = [(n, v) for n, v in mem.sources if n not in sealed_names]
                    plan.delete_memory(mem)
                    plan.cascaded += 1
                    plan.targets.append(mem.name)
                    if survivors:
                        plan.events.append(
                            {"type": "REBUILD_REQUESTED", "subject": mem.name, "sources": survivors}
                        )
                plan.cascade(delete_responses=False)
                entry = self._write_plan(txn, plan, now)
            view = self._thread_view(meta, None)
            view.title = title.decode()
            left = [t.rid for t in turns_now] + [m.rid for m in mems_now] + tainted
            return view, entry, left

        return self.writer.run(
            WriteOp(apply, create_keys=[(ring, title_key)], rewrap_keys=moves, rewrap_to=ring)
        )

    # ------------------------------------------------------------------ repair state

    def repair(self, owner: str, repair_id: str) -> ThreadMeta:
        """The repair thread's metadata.

        Raises:
            NotFound / RecordDeleted: no such repair. FailedPrecondition: not a repair.
        """
        with self.env.begin() as txn:
            meta = self._live_thread(txn, owner, repair_id)
        if meta.kind != "REPAIR":
            name = f"owners/{owner}/threads/{repair_id}"
            raise FailedPrecondition(
                f"{name} is not a repair thread", reason="ILLEGAL_TRANSITION", subject=name
            )
        return meta

    def set_repair_state(
        self,
        owner: str,
        repair_id: str,
        allowed: Sequence[str],
        state: str,
        outcome: str | None = None,
    ) -> ThreadMeta:
        """Move a repair to ``state`` if it is in one of ``allowed`` states.

        Raises:
            FailedPrecondition: ``ILLEGAL_TRANSITION`` otherwise.
        """

        def apply(txn: lmdb.Transaction) -> ThreadMeta:
            meta = self._live_thread(txn, owner, repair_id)
            name = f"owners/{owner}/threads/{repair_id}"
            if meta.kind != "REPAIR" or meta.repair_state not in allowed:
                raise FailedPrecondition(
                    f"{name} is {meta.repair_state or meta.kind}; cannot become {state}",
                    reason="ILLEGAL_TRANSITION",
                    subject=name,
                )
            meta.repair_state = state
            if outcome is not None:
                meta.repair_outcome = outcome
            meta.update_time = time.time()
            txn.put(thread_key(owner, repair_id), meta.encode(), db=self.db["threads"])
            return meta

        return self.writer.run(WriteOp(apply))

    def repair_contents(
        self, owner: str, repair_id: str
    ) -> tuple[list[TurnView], list[TurnView], list[MemoryView]]:
        """Decrypt what a repair holds: (sealed stretch of the source thread, the
        repair thread's own turns, sealed memories). The one read path that
        opens sealed records; only ``ReopenRepair`` calls it."""
        rows: list[tuple[TurnMeta, bytes | None]] = []
        own: list[tuple[TurnMeta, bytes | None]] = []
        mem_rows: list[tuple[MemMeta, bytes | None]] = []
        with self.env.begin() as txn:
            meta = self._live_thread(txn, owner, repair_id)
            for turn in self._thread_metas(txn, owner, meta.repair_source):
                if turn.key_ring == repair_id and turn.state == SEALED:
                    rows.append(
                        (
                            turn,
                            txn.get(payload_key(turn.rid, PAYLOAD_CONTENT), db=self.db["payloads"]),
                        )
                    )
            for turn in self._thread_metas(txn, owner, repair_id):
                own.append(
                    (turn, txn.get(payload_key(turn.rid, PAYLOAD_CONTENT), db=self.db["payloads"]))
                )
            for mem in self._owner_memory_metas(txn, owner):
                if mem.ring_thread == repair_id and mem.state == SEALED and not mem.deleted:
                    ct = txn.get(
                        memory_payload_key(mem.rid, mem.version, PAYLOAD_MEMORY),
                        db=self.db["mpayloads"],
                    )
                    mem_rows.append((mem, None if ct is None else bytes(ct)))

        def views(items: list[tuple[TurnMeta, bytes | None]]) -> list[TurnView]:
            return [
                self.turn_view(t, {PAYLOAD_CONTENT: bytes(ct)} if ct is not None else {}, False)
                for t, ct in items
            ]

        return views(rows), views(own), [self.memory_view(m, m.version, ct) for m, ct in mem_rows]

    def repair_members(
        self, owner: str, repair_id: str
    ) -> tuple[ThreadMeta, list[tuple[str, int]], list[str]]:
        """(repair meta, (thread, seq) of every turn it holds, its memory ids)."""
        with self.env.begin() as txn:
            meta = self._live_thread(txn, owner, repair_id)
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
        return meta, turns, mems

    # ------------------------------------------------------------------ pending window

    def extend_pending(self, names: Sequence[str], ttl: float) -> list[TurnMeta | MemMeta]:
        """Give pending records ``ttl`` seconds from now; committed ones are returned
        unchanged.

        Raises:
            NotFound / RecordDeleted: a record never existed / is gone or expired.
            FailedPrecondition: a record is sealed (``SEALED``).
        """

        def apply(txn: lmdb.Transaction) -> list[TurnMeta | MemMeta]:
            now = time.time()
            out: list[TurnMeta | MemMeta] = []
            for name in names:
                meta = self.resolve(txn, name)
                if meta is None:
                    self._raise_missing(txn, name)
                state = effective_state(meta, now)
                if state is None:
                    raise RecordDeleted(f"{name} was deleted")
                if state == SEALED:
                    raise FailedPrecondition(f"{name} is sealed", reason="SEALED", subject=name)
                if state == PENDING:
                    txn.delete(expiry_key(meta.expire_time, meta.rid), db=self.db["expiry"])
                    meta.expire_time = now + ttl
                    meta.expiry_warned = False
                    txn.put(expiry_key(meta.expire_time, meta.rid), b"", db=self.db["expiry"])
                    db = self.db["memories"] if isinstance(meta, MemMeta) else self.db["turns"]
                    txn.put(rid_key(meta.rid), meta.encode(), db=db)
                out.append(meta)
            return out

        return self.writer.run(WriteOp(apply))

    def warn_expiring(self, now: float, window: float, limit: int = 1000) -> int:
        """Emit ``PENDING_EXPIRING`` once for each pending record expiring within
        ``window`` seconds; returns how many were announced."""

        def apply(txn: lmdb.Transaction) -> int:
            end = expiry_key(now + window, 0)[:8]
            announced = 0
            cur = txn.cursor(db=self.db["expiry"])
            keys: list[bytes] = []
            if cur.first():
                for raw_key in cur.iternext(keys=True, values=False):
                    key = bytes(raw_key)
                    if key[:8] > end or len(keys) >= limit:
                        break
                    keys.append(key)
            for key in keys:
                rk = key[8:]
                for db_name, cls in (("turns", TurnMeta), ("memories", MemMeta)):
                    raw = txn.get(rk, db=self.db[db_name])
                    if raw is None:
                        continue
                    meta = cls.decode(bytes(raw))
                    if meta.deleted or meta.expiry_warned or meta.state != PENDING:
                        break
                    meta.expiry_warned = True
                    txn.put(rk, meta.encode(), db=self.db[db_name])
                    self._event(
                        txn,
                        meta.owner,
                        {"type": "PENDING_EXPIRING", "subject": meta.name, "sources": []},
                        now,
                    )
                    announced += 1
                    break
            return announced

        return self.writer.run(WriteOp(apply))

    def _event(self, txn: lmdb.Transaction, owner: str, event: dict[str, Any], now: float) -> None:
        number = int(txn.get(b"next_event", db=self.db["meta"]) or b"1")
        txn.put(b"next_event", str(number + 1).encode(), db=self.db["meta"])
        body = {"id": str(number), "owner": owner, "time": now, "receipt": "", **event}
        key = f"{owner}\x00".encode() + number.to_bytes(8, "big")
        txn.put(key, json.dumps(body).encode(), db=self.db["events"])
