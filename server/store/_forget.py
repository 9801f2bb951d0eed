"""Forgetting: the plan, the cascade, the purge, and the deletion log.

A forget follows ARCHITECTURE.md "Lineage and deletion":

1. :meth:`ForgetPart.plan_forget` — one write transaction: tombstones for the
   targets and every transitive descendant (:class:`Planner`), tainted
   responses, what the echo sweep found acted on (``EchoSweep``: found by the
   lifecycle before this step, from :meth:`ForgetPart.forget_texts`) and the
   echo guard's rows (:mod:`server.store._echoes`), events, and a
   :class:`DeletionEntry` in the deletion log with every destination
   outstanding;
2. the caller removes the ids from the in-memory indexes;
3. and 4. :meth:`ForgetPart.finish_forget` — the keys are destroyed in the
   keystore (synced) by the writer group, the owner's index-snapshot key with
   them (:mod:`server.store._snapshots`), then the ciphertext rows are purged
   and the entry is marked complete, in the group's data transaction; the
   snapshot file goes after it.

A crash between the steps leaves the entry outstanding; start-up resumes it
(:meth:`ForgetPart.outstanding_deletions`). The sweep ran before step 1 and its
results are part of the plan, so a resumed entry never sweeps again (it could
not: from step 3 on the forgotten texts' keys are gone). The log holds
identifiers, kinds, destinations, times and counts only — never content, nor
digests of content (the guard's keyed digests live in its own rows, under its
own key, and go when its window ends).

Thread rules: as every part of the store (writes on the writer thread).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import lmdb

from server.errors import RecordDeleted
from server.store import _json
from server.store import _schema as sk
from server.store._base import StoreBase, thread_name
from server.store._echoes import (
    ECHO_FORGET,
    ECHO_IGNORE,
    ECHO_REPORT,
    EchoPart,
    EchoSweep,
)
from server.store._lineage import children_of, remove_edges_from, remove_edges_of
from server.store._records import (
    REPAIR,
    REPAIR_CONCLUDED,
    SEALED,
    MemMeta,
    RecordMeta,
    TurnMeta,
)
from server.store._snapshots import SNAPSHOT_KEY_ID, SnapshotsPart
from server.store._visibility import effective_state
from server.store._writer import WriteOp
from shredder import RingRef

DESTINATIONS = ("lmdb", "index", "lexical", "keystore", "cache")
"""The cleanup destinations of every deletion, in receipt order."""
MAX_ECHO_NAMES = 1000
"""Most echo names a deletion-log entry (and its receipt) lists."""


@dataclass(frozen=True, slots=True)
class ForgetTargets:
    """What one forget deletes: the targets a ``Forget`` names, and a repair conclusion's extras.

    The one value every layer passes along (the servicer,
    :class:`server.lifecycle.Lifecycle` and :meth:`ForgetPart.plan_forget`).

    Attributes:
        turns: ``(thread id, seq)`` of single turns.
        ranges: ``(thread id, from_seq, to_seq)``: every stored, not yet deleted
            turn of the thread in the range, expanded inside the plan's
            transaction (seqs past the thread's last are ignored).
        threads: thread ids forgotten whole.
        whole_owner: every thread and memory of the owner.
        memories: memory ids.
        delete_responses: delete (not taint) the responses built on the targets.
        extra_rings: thread ids whose rings are destroyed without the thread
            being forgotten (a repair concluded with ``DESTROY``).
        conclude_repair: ``(repair thread id, outcome)`` marked ``CONCLUDED`` in
            the same transaction, its title removed.
    """

    turns: tuple[tuple[str, int], ...] = ()
    ranges: tuple[tuple[str, int, int], ...] = ()
    threads: tuple[str, ...] = ()
    whole_owner: bool = False
    memories: tuple[str, ...] = ()
    delete_responses: bool = False
    extra_rings: tuple[str, ...] = ()
    conclude_repair: tuple[str, str] | None = None

    @classmethod
    def of(
        cls,
        *,
        turns: Iterable[tuple[str, int]] = (),
        ranges: Iterable[tuple[str, int, int]] = (),
        threads: Iterable[str] = (),
        whole_owner: bool = False,
        memories: Iterable[str] = (),
        delete_responses: bool = False,
        extra_rings: Iterable[str] = (),
        conclude_repair: tuple[str, str] | None = None,
    ) -> ForgetTargets:
        """The targets from any iterables (each is copied into a tuple)."""
        return cls(
            tuple(turns),
            tuple(ranges),
            tuple(threads),
            whole_owner,
            tuple(memories),
            delete_responses,
            tuple(extra_rings),
            conclude_repair,
        )


@dataclass(slots=True)
class Destination:
    """One cleanup destination of a deletion: done, and when (seconds)."""

    done: bool = False
    time: float = 0.0


@dataclass(slots=True)
class DeletionEntry:
    """One deletion-log entry (ids and counts only).

    Attributes:
        id: time-ordered deletion id (12 hex digits of milliseconds, 8 random).
        targets: the names the request named (and cascaded memories' names
            that count as targets of a repair's mixed derivatives).
        rids: record numbers of the turns tombstoned.
        memory_rids: record numbers of the memories tombstoned.
        tainted_rids: record numbers of responses tainted (they stay readable
            by name but leave every index).
        threads: ids of threads forgotten whole (their rows are purged).
        touched: ids of threads that lost single turns (their index contexts
            are rebuilt).
        record_keys: ``(owner, ring thread or "", key id)`` of record keys to
            destroy one by one.
        rings: thread ids whose whole ring is destroyed.
        whole_owner: every ring of the owner is destroyed.
        deleted, cascaded, tainted, rebuilds_requested: receipt counts.
        echo_action: what was done to echoes (``REPORT``, ``TAINT``,
            ``FORGET``; ``IGNORE`` when none were looked for).
        echoes: names of the echoes found (names only), at most
            :data:`MAX_ECHO_NAMES`; ``echoes_found`` counts them all.
        echoes_found, echoes_acted, echo_texts: the sweep's counts (found,
            acted on, forgotten texts looked for).
        echo_guard_expire_time: when the echo guard ends (0: no guard).
        request_time, complete_time, shred_horizon_time: seconds since the
            epoch (0 while not reached).
        positions: ``rid -> (thread, seq)`` of the turns among ``rids`` and
            ``tainted_rids``, known to the process that planned the deletion
            (step 2 re-contexts their neighbours without reading the rows
            again); not written to the log, empty in an entry read back.
    """

    id: str
    owner: str
    reason: str
    request_time: float
    targets: list[str] = field(default_factory=list)
    rids: list[int] = field(default_factory=list)
    memory_rids: list[int] = field(default_factory=list)
    tainted_rids: list[int] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)
    touched: list[str] = field(default_factory=list)
    record_keys: list[tuple[str, str, str]] = field(default_factory=list)
    rings: list[str] = field(default_factory=list)
    whole_owner: bool = False
    deleted: int = 0
    cascaded: int = 0
    tainted: int = 0
    rebuilds_requested: int = 0
    echo_action: str = ECHO_IGNORE
    echoes: list[str] = field(default_factory=list)
    echoes_found: int = 0
    echoes_acted: int = 0
    echo_texts: int = 0
    echo_guard_expire_time: float = 0.0
    complete_time: float = 0.0
    shred_horizon_time: float = 0.0
    destinations: dict[str, Destination] = field(
        default_factory=lambda: {d: Destination() for d in DESTINATIONS}
    )
    positions: dict[int, tuple[str, int]] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        """The receipt's resource name, ``owners/{owner}/deletions/{id}``."""
        return f"owners/{self.owner}/deletions/{self.id}"

    def index_rids(self) -> list[int]:
        """Every record number that leaves the in-memory indexes (step 2)."""
        return [*self.rids, *self.memory_rids, *self.tainted_rids]

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            name: getattr(self, name)
            for name in self.__dataclass_fields__
            if name not in ("destinations", "positions")
        }
        body["destinations"] = {
            k: {"done": d.done, "time": d.time} for k, d in self.destinations.items()
        }
        return _json.dumps(body)

    @classmethod
    def decode(cls, raw: bytes) -> DeletionEntry:
        data = _json.loads(raw)
        return cls(
            id=str(data["id"]),
            owner=str(data["owner"]),
            reason=str(data["reason"]),
            request_time=float(data["request_time"]),
            targets=list(data.get("targets", [])),
            rids=[int(r) for r in data.get("rids", [])],
            memory_rids=[int(r) for r in data.get("memory_rids", [])],
            tainted_rids=[int(r) for r in data.get("tainted_rids", [])],
            threads=list(data.get("threads", [])),
            touched=list(data.get("touched", [])),
            record_keys=[(str(o), str(t), str(k)) for o, t, k in data.get("record_keys", [])],
            rings=list(data.get("rings", [])),
            whole_owner=bool(data.get("whole_owner", False)),
            deleted=int(data.get("deleted", 0)),
            cascaded=int(data.get("cascaded", 0)),
            tainted=int(data.get("tainted", 0)),
            rebuilds_requested=int(data.get("rebuilds_requested", 0)),
            echo_action=str(data.get("echo_action", ECHO_IGNORE)),
            echoes=[str(n) for n in data.get("echoes", [])],
            echoes_found=int(data.get("echoes_found", 0)),
            echoes_acted=int(data.get("echoes_acted", 0)),
            echo_texts=int(data.get("echo_texts", 0)),
            echo_guard_expire_time=float(data.get("echo_guard_expire_time", 0.0)),
            complete_time=float(data.get("complete_time", 0.0)),
            shred_horizon_time=float(data.get("shred_horizon_time", 0.0)),
            destinations={
                k: Destination(bool(v["done"]), float(v["time"]))
                for k, v in data.get("destinations", {}).items()
            },
        )


def new_deletion_id() -> str:
    """A time-ordered deletion id: 12 hex digits of milliseconds, then 8 random."""
    return f"{int(time.time() * 1000):012x}-{secrets.token_hex(4)}"


class Planner:
    """Accumulates one forget's step-1 work inside its write transaction.

    Args:
        store: the store part whose helpers write the tombstones.
        txn: the forget's write transaction.
        owner, now (seconds), reason: of the deletion.
    """

    def __init__(
        self, store: StoreBase, txn: lmdb.Transaction, owner: str, now: float, reason: str
    ) -> None:
        self.store = store
        self.txn = txn
        self.owner = owner
        self.now = now
        self.deletion_id = new_deletion_id()
        self.reason = reason
        self.targets: list[str] = []
        self.rids: list[int] = []
        self.memory_rids: list[int] = []
        self.tainted_rids: list[int] = []
        self.positions: dict[int, tuple[str, int]] = {}
        self.record_keys: list[tuple[str, str, str]] = []
        self.rings: list[str] = []
        self.done_threads: set[str] = set()
        self.touched_threads: set[str] = set()
        self.deleted_names: set[str] = set()
        self.queue: list[str] = []
        self.cascaded_memories: list[MemMeta] = []
        self.cascaded = 0
        self.tainted = 0
        self.echo_action = ECHO_IGNORE
        self.echoes: list[str] = []
        self.echoes_acted = 0
        self.echo_texts = 0
        self.echo_memories: list[MemMeta] = []
        self.echo_guard_expire_time = 0.0
        # (type, subject, sources) of the events the deletion announces.
        self.events: list[tuple[str, str, list[tuple[str, int]]]] = []

    def delete_turn(self, meta: TurnMeta, *, key_in_ring: bool) -> None:
        """Tombstone a turn; its key goes with its thread's ring when ``key_in_ring``."""
        self.rids.append(meta.rid)
        self.positions[meta.rid] = (meta.thread, meta.seq)
        if not key_in_ring or meta.key_ring:  # a sealed turn's key is in its repair's ring
            self.record_keys.append((meta.owner, meta.ring_thread, meta.key_id))
        self._mark_deleted(meta)
        self.deleted_names.add(meta.name)
        self.queue.append(meta.name)

    def delete_memory(self, meta: MemMeta) -> None:
        """Tombstone a memory; every version's record key is destroyed."""
        self.memory_rids.append(meta.rid)
        ring_gone = meta.ring_thread and meta.ring_thread in self.done_threads
        if not ring_gone:
            for key_id in meta.key_ids.values():
                self.record_keys.append((meta.owner, meta.ring_thread, key_id))
        self._mark_deleted(meta)
        self.deleted_names.add(meta.name)
        self.queue.append(meta.name)

    def _mark_deleted(self, meta: RecordMeta) -> None:
        store, txn = self.store, self.txn
        store._unqueue_expiry(txn, meta)
        meta.deleted = True
        if isinstance(meta, MemMeta):
            store._release_slot(txn, meta)  # the slot is free from the tombstone on
            store._put_memory(txn, meta)
            store._tombstone(
                txn, meta.name, self.now, self.deletion_id, self.reason, last_version=meta.version
            )
        else:
            store._put_turn(txn, meta)
            store._tombstone(txn, meta.name, self.now, self.deletion_id, self.reason)

    def cascade(self, delete_responses: bool) -> None:
        """Follow lineage down from everything deleted so far (transitively).

        Cascade (ARCHITECTURE.md, "Lineage and deletion"): every memory derived
        from a deleted record is deleted; if it had sources that survive, a
        ``REBUILD_REQUESTED`` event names them. A turn whose lineage names a
        deleted record (an assistant response) becomes ``tainted``, or is
        deleted (and cascades) when ``delete_responses``; what was derived
        from a tainted response cascades too.
        """
        explicit = set(self.deleted_names)
        self.follow(delete_responses)
        self.announce(explicit)

    def follow(self, delete_responses: bool) -> None:
        """The lineage walk of :meth:`cascade`, without the events (they come once, at the end)."""
        store, txn = self.store, self.txn
        while self.queue:
            source = self.queue.pop()
            for child, _ in list(children_of(txn, store.t, source)):
                if child in self.deleted_names:
                    continue
                meta = store.resolve(txn, child)
                if meta is None or meta.deleted:
                    continue
                if isinstance(meta, TurnMeta):
                    if delete_responses:
                        self.delete_turn(meta, key_in_ring=meta.thread in self.done_threads)
                        self.touched_threads.add(meta.thread)
                        self.cascaded += 1
                    elif not meta.tainted:
                        meta.tainted = True
                        store._put_turn(txn, meta)
                        self.tainted += 1
                        self.tainted_rids.append(meta.rid)
                        self.positions[meta.rid] = (meta.thread, meta.seq)
                        # What was derived from a tainted response carries the
                        # forgotten material too: it cascades like a deletion.
                        self.queue.append(meta.name)
                    continue
                self.delete_memory(meta)
                self.cascaded += 1
                self.cascaded_memories.append(meta)

    def announce(self, explicit: set[str]) -> None:
        """The events of the deletion: ``REBUILD_REQUESTED`` and ``RECORD_DELETED``.

        ``explicit``: the names deleted before the lineage walk (the targets).
        """
        for meta in [*self.cascaded_memories, *self.echo_memories]:
            surviving = [
                (name, version)
                for name, version in meta.sources
                if name not in self.deleted_names and self._alive(name)
            ]
            if surviving:
                self.events.append(("REBUILD_REQUESTED", meta.name, surviving))
        targets = set(self.targets)  # a list: 'in' on it made a 1,000-turn range O(n^2)
        echoed = [m.name for m in self.echo_memories]
        if self.echo_action == ECHO_FORGET:
            echoed = [n for n in self.echoes if n in self.deleted_names]
        for name in [*self.targets, *(m.name for m in self.cascaded_memories), *echoed]:
            if name not in explicit or name in targets:
                self.events.append(("RECORD_DELETED", name, []))

    def act_on_echoes(self, sweep: EchoSweep, delete_responses: bool) -> None:
        """Act on what the echo sweep found, after the declared lineage was followed.

        An echo is a live, unsealed record of the owner that this forget did
        not already delete or taint by lineage (declared lineage wins: such a
        record is a descendant, not an echo). ``REPORT`` names it; ``TAINT``
        treats it as if it had declared the forgotten record (a turn tainted,
        a memory deleted); ``FORGET`` deletes it with the targets. Lineage is
        then followed down from what was tainted or deleted.
        """
        store, txn = self.store, self.txn
        self.echo_action = sweep.action
        self.echo_texts = sweep.texts
        for rid in sweep.echoes:
            meta = store._record(txn, rid)
            if (
                meta is None
                or meta.owner != self.owner
                or meta.deleted
                or meta.tainted
                or meta.name in self.deleted_names
                or effective_state(meta, self.now) in (None, SEALED)
            ):
                continue
            self.echoes.append(meta.name)
            if sweep.action == ECHO_REPORT:
                continue
            self.echoes_acted += 1
            if isinstance(meta, TurnMeta):
                if sweep.action == ECHO_FORGET:
                    self.delete_turn(meta, key_in_ring=meta.thread in self.done_threads)
                    self.touched_threads.add(meta.thread)
                else:
                    meta.tainted = True
                    store._put_turn(txn, meta)
                    self.tainted_rids.append(meta.rid)
                    self.positions[meta.rid] = (meta.thread, meta.seq)
                    self.queue.append(meta.name)
            else:
                self.delete_memory(meta)
                self.echo_memories.append(meta)
        self.follow(delete_responses)

    def _alive(self, name: str) -> bool:
        meta = self.store.resolve(self.txn, name)
        return meta is not None and not meta.tainted and effective_state(meta, self.now) is not None

    def entry(self, whole_owner: bool, request_time: float) -> DeletionEntry:
        return DeletionEntry(
            id=self.deletion_id,
            owner=self.owner,
            reason=self.reason,
            request_time=request_time,
            targets=self.targets,
            rids=self.rids,
            memory_rids=self.memory_rids,
            tainted_rids=self.tainted_rids,
            threads=sorted(self.done_threads),
            touched=sorted(self.touched_threads - self.done_threads),
            record_keys=self.record_keys,
            rings=self.rings,
            whole_owner=whole_owner,
            deleted=len(self.rids) + len(self.memory_rids),
            cascaded=self.cascaded,
            tainted=self.tainted,
            rebuilds_requested=sum(1 for e in self.events if e[0] == "REBUILD_REQUESTED"),
            echo_action=self.echo_action,
            echoes=self.echoes[:MAX_ECHO_NAMES],
            echoes_found=len(self.echoes),
            echoes_acted=self.echoes_acted,
            echo_texts=self.echo_texts,
            echo_guard_expire_time=self.echo_guard_expire_time,
            positions=self.positions,
        )

    def write(self, request_time: float, whole_owner: bool = False) -> DeletionEntry:
        """Write the plan's events and deletion-log entry; returns the entry."""
        entry = self.entry(whole_owner, request_time)
        self.store._append_events(self.txn, self.owner, self.events, self.now, entry.name)
        self.txn.put(
            sk.deletion_key(self.owner, entry.id), entry.encode(), db=self.store.t.deletions
        )
        return entry


class ForgetPart(EchoPart, SnapshotsPart):
    """Forget and the deletion log of :class:`~server.store.Store`."""

    def plan_forget(
        self,
        owner: str,
        targets: ForgetTargets,
        *,
        reason: str,
        request_time: float,
        echoes: EchoSweep | None = None,
    ) -> DeletionEntry:
        """Step 1 of a forget, in one transaction (see :class:`Planner`).

        Args:
            owner: whose records.
            targets: what to forget (:class:`ForgetTargets`).
            reason: the receipt's reason (``FORGET``, ``EXPIRED``, …).
            request_time: when the request arrived (seconds).
            echoes: what the echo sweep found and the guard to set, or None
                (the guard's bucket key exists: ``ensure_guard_key``); the
                guard's rows commit with the plan.

        Raises:
            NotFound / RecordDeleted: a named record or a range's thread never
                existed / is already gone (nothing is deleted).
        """

        def apply(txn: lmdb.Transaction) -> DeletionEntry:
            return self._plan(
                txn,
                owner,
                time.time(),
                targets,
                reason=reason,
                request_time=request_time,
                echoes=echoes,
            )

        return self.writer.run(WriteOp(apply, owner=owner, name="forget.plan"))

    def _plan(
        self,
        txn: lmdb.Transaction,
        owner: str,
        now: float,
        targets: ForgetTargets,
        *,
        reason: str,
        request_time: float,
        echoes: EchoSweep | None = None,
    ) -> DeletionEntry:
        """Step 1 of a forget inside the caller's transaction (see :meth:`plan_forget`)."""
        whole_owner = targets.whole_owner
        plan = Planner(self, txn, owner, now, reason)
        plan.rings.extend(targets.extra_rings)
        if targets.conclude_repair is not None:
            repair_id, outcome = targets.conclude_repair
            rmeta = self._live_thread(txn, owner, repair_id)
            rmeta.repair_state, rmeta.repair_outcome = REPAIR_CONCLUDED, outcome
            rmeta.title_key, rmeta.update_time = "", now
            self._put_thread(txn, rmeta)
            txn.delete(sk.thread_key(owner, repair_id), db=self.t.titles)
        single = list(targets.turns)
        in_range: dict[tuple[str, int], TurnMeta] = {}  # read once, by the range scan
        for thread, lo, hi in targets.ranges:
            last = self._live_thread(txn, owner, thread).last_seq
            for m in self._thread_metas(txn, owner, thread, lo=lo, hi=min(hi, last)):
                in_range[(thread, m.seq)] = m
                single.append((thread, m.seq))
        thread_ids = list(targets.threads)
        if whole_owner:
            plan.targets.append(f"owners/{owner}")
            thread_ids.extend(self._owner_thread_ids(txn, owner))
        for thread in list(dict.fromkeys(thread_ids)):
            name = thread_name(owner, thread)
            row = self._thread_row(txn, owner, thread)
            if row is None:
                self._raise_missing(txn, name)
            tmeta = row
            if tmeta.deleted:  # another forget is finishing it
                if whole_owner:
                    thread_ids.remove(thread)
                    continue
                raise RecordDeleted(f"{name} was deleted")
            tmeta.deleted = True
            self._unqueue_thread(txn, tmeta)
            self._put_thread(txn, tmeta)
            if not whole_owner:
                plan.targets.append(name)
                plan.rings.append(thread)
            self._tombstone(txn, name, now, plan.deletion_id, reason, last_seq=tmeta.last_seq)
            for meta in self._thread_metas(txn, owner, thread):
                plan.delete_turn(meta, key_in_ring=True)
            if tmeta.kind == REPAIR:
                # The repair's ring holds the sealed stretch's keys and its
                # sealed memories' keys: they go with it.
                for meta in self._thread_metas(txn, owner, tmeta.repair_source):
                    if meta.key_ring == thread:
                        plan.delete_turn(meta, key_in_ring=False)
                        plan.touched_threads.add(tmeta.repair_source)
                for sealed_mem in self._owner_memory_metas(txn, owner):
                    if sealed_mem.ring_thread == thread and not sealed_mem.deleted:
                        plan.delete_memory(sealed_mem)
        plan.done_threads = set(thread_ids)
        for thread, seq in dict.fromkeys(single):
            if thread in plan.done_threads:
                continue
            name = f"{thread_name(owner, thread)}/turns/{seq}"
            found = in_range.get((thread, seq)) or self._turn_at(txn, owner, thread, seq)
            if found is None:
                self._raise_missing(txn, name)
            plan.targets.append(name)
            if not found.deleted:
                plan.delete_turn(found, key_in_ring=False)
                plan.touched_threads.add(thread)
        memory_ids = list(targets.memories)
        if whole_owner:
            memory_ids.extend(m.memory_id for m in self._owner_memory_metas(txn, owner))
        for memory_id in dict.fromkeys(memory_ids):
            name = f"owners/{owner}/memories/{memory_id}"
            mem = self._mem_by_id(txn, owner, memory_id)
            if mem is None:
                self._raise_missing(txn, name)
            if mem.deleted:
                if whole_owner:
                    continue
                raise RecordDeleted(f"{name} was deleted")
            if not whole_owner:
                plan.targets.append(name)
            plan.delete_memory(mem)
        explicit = set(plan.deleted_names)
        plan.follow(targets.delete_responses)
        if echoes is not None and not whole_owner:
            plan.act_on_echoes(echoes, targets.delete_responses)
            guard = echoes.guard
            if guard is not None and self._install_guard(txn, owner, plan.deletion_id, guard):
                plan.echo_guard_expire_time = guard.expire_time
        plan.announce(explicit)
        for thread in plan.touched_threads - plan.done_threads:
            touched = self._thread_row(txn, owner, thread)
            if touched is not None:
                touched.last_deletion_time = now
                self._put_thread(txn, touched)
        if whole_owner:
            self._tombstone(txn, f"owners/{owner}", now, plan.deletion_id, reason)
        return plan.write(request_time, whole_owner)

    def finish_forget(
        self, entry: DeletionEntry, index_done_time: float, shred_horizon: float = 0.0
    ) -> DeletionEntry:
        """Steps 3 and 4: destroy the keys (synced), purge the rows, close the log entry.

        The owner's index-snapshot key is destroyed in the same keystore
        transaction as the deletion's keys, and the snapshot file is removed
        once the entry is complete: no snapshot written before this deletion
        opens again.

        Args:
            entry: the entry from :meth:`plan_forget` (or from the log on resume).
            index_done_time: when the index entries were removed (seconds).
            shred_horizon: when the next rotation completes the shred (seconds, 0: none due).

        Returns:
            The completed entry.
        """
        owner = entry.owner
        rings = [RingRef(owner, t) for t in entry.rings]
        keys = [(RingRef(o, t or None), k) for o, t, k in entry.record_keys]
        keys.append((RingRef(owner, None), SNAPSHOT_KEY_ID))

        def apply(txn: lmdb.Transaction) -> DeletionEntry:
            now = time.time()
            for rid in entry.rids:
                at = entry.positions.get(rid)
                if at is None:  # an entry read back from the log
                    self._purge_turn(txn, rid)
                else:
                    self._purge_turn_rows(txn, owner, rid, *at)
            for rid in entry.memory_rids:
                self._purge_memory(txn, rid)
            for thread in entry.threads:
                tkey = sk.thread_key(owner, thread)
                txn.delete(tkey, db=self.t.threads)
                txn.delete(tkey, db=self.t.titles)
                sk.delete_prefix(txn, self.t.requests, sk.thread_prefix(owner, thread))
            if entry.whole_owner:
                txn.delete(sk.owner_key(owner), db=self.t.owners)
                self._drop_owner_guards(txn, owner)  # their keys went with the owner's rings
            for dest in ("index", "lexical", "cache"):
                entry.destinations[dest] = Destination(True, index_done_time)
            entry.destinations["keystore"] = Destination(True, now)
            entry.destinations["lmdb"] = Destination(True, now)
            entry.complete_time = now
            entry.shred_horizon_time = shred_horizon
            txn.put(sk.deletion_key(owner, entry.id), entry.encode(), db=self.t.deletions)
            return entry

        done = self.writer.run(
            WriteOp(
                apply,
                destroy_keys=keys,
                destroy_rings=rings,
                destroy_owners=[owner] if entry.whole_owner else [],
                name="forget.finish",
            )
        )
        self.discard_snapshot(owner)  # its key is gone: nothing left to open
        return done

    def _purge_memory(self, txn: lmdb.Transaction, rid: int) -> None:
        meta = self._memory(txn, rid)
        if meta is None:
            return
        sk.delete_prefix(txn, self.t.mpayloads, sk.rid_key(rid))
        txn.delete(sk.rid_key(rid), db=self.t.memories)
        self._note_change(meta.owner, rid)
        txn.delete(sk.memory_id_key(meta.owner, meta.memory_id), db=self.t.memory_ids)
        txn.delete(sk.owner_record_key(meta.owner, rid), db=self.t.owner_records)
        self._unqueue_expiry(txn, meta)
        remove_edges_of(txn, self.t, meta.name)
        remove_edges_from(txn, self.t, meta.name)

    def _purge_turn(self, txn: lmdb.Transaction, rid: int) -> None:
        """Purge a turn known only by its record number (reads its row first)."""
        meta = self._turn(txn, rid)
        if meta is None:
            return
        self._purge_turn_rows(txn, meta.owner, rid, meta.thread, meta.seq)
        self._unqueue_expiry(txn, meta)

    def _purge_turn_rows(
        self, txn: lmdb.Transaction, owner: str, rid: int, thread: str, seq: int
    ) -> None:
        """Delete a tombstoned turn's rows: lineage edges, payloads, the row and its index entries.

        In full: lineage edges both ways, payloads (ciphertext), the row, its
        seq and owner index entries. Rows already gone are skipped. Its
        expiry-queue entry left in step 1 (``Planner``), in the transaction
        that tombstoned it; :meth:`_purge_turn` also takes it off for an entry
        read back from the log.
        """
        name = f"{thread_name(owner, thread)}/turns/{seq}"
        remove_edges_of(txn, self.t, name)
        remove_edges_from(txn, self.t, name)
        for ptype in sk.TURN_PAYLOAD_TYPES:
            txn.delete(sk.payload_key(rid, ptype), db=self.t.payloads)
        txn.delete(sk.rid_key(rid), db=self.t.turns)
        self._note_change(owner, rid)
        txn.delete(sk.seq_key(owner, thread, seq), db=self.t.seqs)
        txn.delete(sk.owner_record_key(owner, rid), db=self.t.owner_records)

    # ------------------------------------------------------------------ the sweep's reads

    def forget_texts(self, owner: str, targets: ForgetTargets) -> list[tuple[RecordMeta, str]]:
        """The texts a forget of ``targets`` is about to forget, decrypted while their keys exist.

        Turns (named, in ranges, of whole threads) give their text, memories
        their current version's text. Targets that do not exist or are gone are
        left out (the plan reports them). Never for a whole owner.

        Returns:
            ``(record, text)`` per readable target record, in target order.
        """
        metas: list[RecordMeta] = []
        with self.env.begin() as txn:
            for thread, seq in targets.turns:
                meta = self._turn_at(txn, owner, thread, seq)
                if meta is not None and not meta.deleted:
                    metas.append(meta)
            for thread, lo, hi in targets.ranges:
                metas.extend(self._thread_metas(txn, owner, thread, lo=lo, hi=hi))
            for thread in targets.threads:
                metas.extend(self._thread_metas(txn, owner, thread))
            for memory_id in targets.memories:
                mem = self._mem_by_id(txn, owner, memory_id)
                if mem is not None and not mem.deleted:
                    metas.append(mem)
            unique = list({m.rid: m for m in metas}.values())
            rows = [(m, self._payloads_of(txn, m)) for m in unique]
        return self.open_each(rows, lambda m, cts: (m, _text_of(self.view_of(m, cts))))

    def _payloads_of(self, txn: lmdb.Transaction, meta: RecordMeta) -> dict[str, bytes]:
        if isinstance(meta, MemMeta):
            ct = self._memory_ct(txn, meta, meta.version)
            return {} if ct is None else {"memory": ct}
        return self._read_payloads(txn, meta.rid, with_embedding=False)

    # ------------------------------------------------------------------ the log

    def outstanding_deletions(self) -> list[DeletionEntry]:
        """Deletion-log entries with a destination not yet done."""
        with self.env.begin() as txn:
            entries = [DeletionEntry.decode(raw) for _, raw in sk.scan(txn, self.t.deletions, b"")]
        return [e for e in entries if not e.complete_time]

    def deletion(self, owner: str, deletion_id: str) -> DeletionEntry | None:
        """One deletion-log entry, or None."""
        with self.env.begin() as txn:
            raw = sk.get(txn, self.t.deletions, sk.deletion_key(owner, deletion_id))
        return None if raw is None else DeletionEntry.decode(raw)

    def list_deletions(self, owner: str, after: str, limit: int) -> tuple[list[DeletionEntry], str]:
        """Deletion-log entries of ``owner``, oldest first (ids are time-ordered).

        Returns:
            (entries, the id to resume after, or "" at the end).
        """
        prefix = sk.owner_prefix(owner)
        start = prefix + after.encode() + b"\x01" if after else None
        out: list[DeletionEntry] = []
        more = False
        with self.env.begin() as txn:
            for _, raw in sk.scan(txn, self.t.deletions, prefix, start=start):
                if len(out) == limit:
                    more = True
                    break
                out.append(DeletionEntry.decode(raw))
        return out, (out[-1].id if more and out else "")


def _text_of(view: object) -> str:
    """The text a record says: a turn's text, a memory's text (or its edge's words)."""
    text = getattr(view, "text", None)
    if isinstance(text, str):
        return text
    content = getattr(view, "content", None)
    if content is None:
        return ""
    if content.text or content.edge is None:
        return str(content.text)
    return " ".join(content.edge)
