"""Forgetting and expiry: the four steps of a deletion, the sweeper, the
start-up resumer and the reconciliation of records whose keys are gone.

Thread rules: :meth:`Lifecycle.forget` may be called from any thread (it waits
on the writer twice); the sweeper runs on its own daemon thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from server._metrics import Metrics
from server._search import Retriever
from server.errors import StoreFull, Unavailable
from server.store import (
    EVENT_RETENTION,
    AuditCounts,
    DeletionEntry,
    KeyCheck,
    MemMeta,
    MemoryDraft,
    MemoryView,
    Store,
    ThreadView,
    record_ring,
)
from shredder import RingRef

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

REASON_FORGET = "FORGET"
REASON_EXPIRED = "EXPIRED"
REASON_KEY_DESTROYED = "KEY_DESTROYED"


@dataclass(slots=True)
class Recovery:
    """What :meth:`Lifecycle.recover` did at start-up.

    Attributes:
        kek_versions_retired: KEK versions a cut-short rotation left behind.
        keys_relocated: keys moved back to the ring their records name.
        deletions_resumed: outstanding deletion-log entries finished.
        forgotten: records forgotten because their keys were destroyed on
            purpose after they were written (reason ``KEY_DESTROYED``).
        kept_without_key: names of live records whose key is missing with no
            decided deletion: kept, unreadable (``DATA_LOSS``), reported.
        stray_keys_destroyed: keys no record uses.
        deferred: steps that could not write (full disk or store) and wait for
            the next start.
    """

    kek_versions_retired: list[int]
    keys_relocated: int
    deletions_resumed: int
    forgotten: int
    kept_without_key: list[str]
    stray_keys_destroyed: int
    deferred: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One log line (ids and counts only)."""
        return (
            f"{self.deletions_resumed} deletions resumed, {self.forgotten} records whose keys "
            f"were shredded forgotten, {len(self.kept_without_key)} records without a key kept, "
            f"{self.keys_relocated} keys relocated, {self.stray_keys_destroyed} stray keys "
            f"destroyed, KEK versions {self.kek_versions_retired} retired"
            + (f"; deferred: {', '.join(self.deferred)}" if self.deferred else "")
        )


class Lifecycle:
    """Runs deletions end to end for one store.

    Args:
        store: the record store.
        retriever: whose loaded indexes lose the deleted ids (step 2).
        metrics: deletion latency and outstanding gauges.
    """

    def __init__(
        self,
        store: Store,
        retriever: Retriever,
        metrics: Metrics,
        rotation_interval: float = 3600.0,
    ) -> None:
        self.store = store
        self.retriever = retriever
        self.metrics = metrics
        # Seconds between rotations (0: never); only a KEK file can be rotated.
        self.rotation_interval = rotation_interval if store.kek_rotatable else 0.0
        self.last_rotation = time.time()

    def shred_horizon(self) -> float:
        """When the next rotation completes today's shreds (seconds), 0 if none is due."""
        if not self.rotation_interval:
            return 0.0
        return self.last_rotation + self.rotation_interval

    def rotate_if_due(self, now: float, force: bool = False) -> bool:
        """Rotate when a shred awaits completion and the interval has passed."""
        if not self.rotation_interval and not force:
            return False
        if self.store.unrotated_since() is None:
            return False
        if not force and now - self.last_rotation < self.rotation_interval:
            return False
        self.store.rotate()
        self.last_rotation = time.time()
        return True

    def forget(
        self,
        owner: str,
        *,
        turns: Sequence[tuple[str, int]] = (),
        ranges: Sequence[tuple[str, int, int]] = (),
        threads: Sequence[str] = (),
        whole_owner: bool = False,
        memories: Sequence[str] = (),
        delete_responses: bool = False,
        reason: str = REASON_FORGET,
        extra_rings: Sequence[str] = (),
        conclude_repair: tuple[str, str] | None = None,
    ) -> DeletionEntry:
        """Forget turns, turn ranges, threads, memories or a whole owner; returns
        the completed log entry (arguments as :meth:`server.store.Store.plan_forget`).

        When this returns, the deletion is effective for every reader: the
        tombstones committed in step 1, the index entries are gone, the keys
        are destroyed in the keystore (synced) and the ciphertext is purged.

        Raises:
            NotFound / RecordDeleted: a named record never existed / is gone
                (nothing deleted).
        """
        started = time.time()
        entry = self.store.plan_forget(
            owner,
            reason=reason,
            request_time=started,
            turns=turns,
            ranges=ranges,
            threads=threads,
            whole_owner=whole_owner,
            memories=memories,
            delete_responses=delete_responses,
            extra_rings=extra_rings,
            conclude_repair=conclude_repair,
        )
        self._unindex(owner, entry, whole_owner)
        entry = self.store.finish_forget(entry, time.time(), self.shred_horizon())
        self.metrics.deletion_latency.observe(time.time() - started)
        return entry

    def _unindex(self, owner: str, entry: DeletionEntry, whole_owner: bool) -> None:
        """Step 2 of a forget: what ``entry`` planned leaves every loaded index."""
        self.retriever.on_forget(
            owner,
            entry.index_rids(),
            entry.threads,
            whole_owner,
            touched_threads=entry.touched,
            positions=entry.positions,
        )

    def seal(self, owner: str, thread: str, from_seq: int) -> ThreadView:
        """Seal a stretch into a new repair; sealed records leave the general
        index at once, mixed derivatives are deleted like any forget."""
        view, entry, left = self.store.seal_repair(owner, thread, from_seq)
        extra = [] if entry is None else entry.memory_rids + entry.tainted_rids
        self.retriever.on_forget(owner, left + extra, [], False, touched_threads=[thread])
        if entry is not None:
            self.store.finish_forget(entry, time.time())
        return view

    def conclude(
        self, owner: str, repair_id: str, outcome: str, lesson: MemoryDraft | None
    ) -> tuple[ThreadView, DeletionEntry, MemoryView | None]:
        """Conclude a repair with ``DESTROY`` or ``DISTILL`` (one transaction, see
        :meth:`server.store.Store.conclude_repair`), then finish forgetting what
        it held: when this returns, its ring is destroyed and its rows purged.
        """
        started = time.time()
        view, entry, made = self.store.conclude_repair(owner, repair_id, outcome, lesson)
        if made is not None:
            self.retriever.on_write(owner, [made.meta])
        self._unindex(owner, entry, False)
        entry = self.store.finish_forget(entry, time.time(), self.shred_horizon())
        self.metrics.deletion_latency.observe(time.time() - started)
        return view, entry, made

    def resume_outstanding(self) -> int:
        """Finish every deletion a crash interrupted (start-up; indexes are empty)."""
        entries = self.store.outstanding_deletions()
        for entry in entries:
            self.retriever.on_forget(
                entry.owner, entry.index_rids(), entry.threads, entry.whole_owner
            )
            self.store.finish_forget(entry, time.time())
        return len(entries)

    def recover(self) -> Recovery:
        """Bring the store to a consistent state after a crash or a restore, at
        start-up (no call is being served; the indexes are empty).

        In order: finish a rotation cut short (destroy KEK versions that wrap
        nothing); move keys an interrupted seal left in another ring back to
        the ring their records name (the data decided whether the seal
        happened); resume every outstanding deletion; forget the records whose
        keys were destroyed on purpose since the data was written (the shred
        log names them: a restored backup); keep and report loudly every live
        record whose key is missing with no decided deletion; destroy keys no
        record uses (made for writes that never committed). Start-up never
        forgets what nobody decided to forget.

        A step that cannot write (a full disk, ``--max-store-size`` reached) is
        deferred to the next start, logged at error level: the store still
        opens and serves reads, and nothing it defers makes a forgotten record
        readable (tombstones and destroyed keys already hold).
        """
        deferred: list[str] = []

        def attempt(step: str, run: Callable[[], _T], otherwise: Callable[[], _T]) -> _T:
            try:
                return run()
            except (Unavailable, StoreFull) as exc:
                _log.error("recovery: %s deferred to the next start: %s", step, exc.message)
                deferred.append(step)
                return otherwise()  # only then: it may cost a pass over the store

        retired = self.store.retire_unused_kek_versions()
        # One pass over the data and the keystore answers the next three steps
        # unless a step changed something, which makes it stale.
        check = self.store.check_keys()
        relocated = attempt(
            "key relocation", lambda: self.store.relocate_keys(check.misplaced), lambda: 0
        )
        resumed = attempt("resuming deletions", self.resume_outstanding, lambda: 0)
        if relocated or resumed:
            check = self.store.check_keys()
        forgotten = attempt(
            "forgetting shredded threads", lambda: self._forget_decided_threads(check), lambda: 0
        )
        if forgotten:
            check = self.store.check_keys()
        more, kept = attempt(
            "forgetting shredded records",
            lambda: self._forget_decided_records(check),
            lambda: (0, [r.name for r in self.store.records_without_key()]),
        )
        if more:  # forgetting destroyed keys: the check's key listing is stale
            check = self.store.check_keys()
        stray = attempt(
            "destroying stray keys", lambda: self.store.destroy_unreferenced_keys(check), lambda: 0
        )
        for name in kept:
            _log.error(
                "%s has no key and no decided deletion: kept unreadable for an operator "
                "(lethe audit; forget it to remove it)",
                name,
            )
        self.metrics.records_without_key.set(len(kept))
        return Recovery(retired, relocated, resumed, forgotten + more, kept, stray, deferred)

    def _forget_decided_threads(self, check: KeyCheck) -> int:
        count = 0
        for meta in self.store.threads_without_key(check):
            ring = RingRef(meta.owner, meta.thread)
            if self.store.shred_decided(meta, ring, meta.title_key):
                entry = self.forget(meta.owner, threads=[meta.thread], reason=REASON_KEY_DESTROYED)
                count += entry.deleted
        return count

    def _forget_decided_records(self, check: KeyCheck) -> tuple[int, list[str]]:
        by_owner: dict[str, list[tuple[str, int]]] = defaultdict(list)
        mems_by_owner: dict[str, list[str]] = defaultdict(list)
        kept: list[str] = []
        for record in self.store.records_without_key(check):
            if not self.store.shred_decided(record, record_ring(record), record.key_id):
                kept.append(record.name)
            elif isinstance(record, MemMeta):
                mems_by_owner[record.owner].append(record.memory_id)
            else:
                by_owner[record.owner].append((record.thread, record.seq))
        count = 0
        for owner in {*by_owner, *mems_by_owner}:
            entry = self.forget(
                owner,
                turns=by_owner[owner],
                memories=mems_by_owner[owner],
                reason=REASON_KEY_DESTROYED,
            )
            count += entry.deleted
        return count, kept

    def sweep(self, now: float | None = None) -> int:
        """Forget every pending turn past its expiry; returns how many."""
        expired = self.store.expired(time.time() if now is None else now)
        by_owner: dict[str, list[tuple[str, int]]] = defaultdict(list)
        mems_by_owner: dict[str, list[str]] = defaultdict(list)
        for meta in expired:
            if isinstance(meta, MemMeta):
                mems_by_owner[meta.owner].append(meta.memory_id)
            else:
                by_owner[meta.owner].append((meta.thread, meta.seq))
        for owner in {*by_owner, *mems_by_owner}:
            self.forget(
                owner, turns=by_owner[owner], memories=mems_by_owner[owner], reason=REASON_EXPIRED
            )
        return len(expired)

    def audit(self, owner: str, *, integrity: bool = True) -> AuditCounts:
        """The owner's AuditReport: the store's counts plus the loaded index's
        drift (``integrity``: open every live record, see
        :meth:`server.store.Store.audit`)."""
        counts = self.store.audit(owner, integrity=integrity)
        counts.index_drift = self.retriever.index_drift(owner)
        return counts

    def drop_owner(self, owner: str) -> None:
        """Drop what this process holds of ``owner`` in memory: its loaded indexes
        (with their decrypted text) and its cached unwrapped keys. Called when
        another process changed the owner's placement (an owner move)."""
        self.retriever.drop_owner(owner)
        self.store.keystore.evict_owner(owner)

    def periodic_audit(self) -> None:
        """Audit every owner into the orphan, stale-summary and keyless-record
        gauges; prune old events; drop from memory the owners that moved away."""
        for row in self.store.moved_owners():
            if row.state == "moved":
                self.drop_owner(row.owner)
        orphans = stale = keyless = 0
        for owner in self.store.owners():
            counts = self.audit(owner, integrity=False)
            orphans += counts.orphans
            stale += counts.stale_summaries
            keyless += counts.records_without_key
        self.metrics.orphan_derivatives.set(orphans)
        self.metrics.stale_summaries.set(stale)
        self.metrics.records_without_key.set(keyless)
        self.store.prune_events(time.time() - EVENT_RETENTION)

    def refresh_gauges(self) -> None:
        now = time.time()
        count, age = self.store.pending_stats(now)
        self.metrics.pending_records.set(count)
        self.metrics.oldest_pending_age.set(age)
        self.metrics.outstanding_deletions.set(len(self.store.outstanding_deletions()))
        self.metrics.index_vectors.set(self.retriever.cache.total_vectors())
        self.metrics.index_bytes.set(self.retriever.cache.total_bytes())
        self.metrics.keystore_keys.set(self.store.key_count())
        self.metrics.unreadable_records.set(self.store.unreadable_count())
        used = self.store.used_bytes()
        self.metrics.store_bytes.set(used)
        self.metrics.store_fill_ratio.set(used / self.store.max_size)
        since = self.store.unrotated_since()
        self.metrics.shred_horizon.set(0.0 if since is None else now - since)


AUDIT_DUTY = 0.05
"""Most share of the time the periodic audit may run: it reads every owner's
records (at a million turns, about 20 s of one core), so an audit of ``d``
seconds that started at ``t`` is followed by the next one at ``t + d /
AUDIT_DUTY`` if that is later than ``t`` plus the audit interval, instead of
running back to back with the searches."""


class Sweeper:
    """Background thread: expiry sweep and gauges every ``interval`` seconds, the
    audit gauges and event pruning every ``audit_interval`` seconds, or less
    often on a store whose audit takes longer (:data:`AUDIT_DUTY`)."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        interval: float,
        audit_interval: float = 60.0,
        expiry_warning: float = 3600.0,
    ) -> None:
        self._lifecycle = lifecycle
        self._interval = interval
        self._expiry_warning = expiry_warning
        self._audit_interval = audit_interval
        self._next_audit = 0.0  # time.monotonic() at which the next audit is due
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lethe-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._lifecycle.sweep()
                self._lifecycle.rotate_if_due(time.time())
                self._lifecycle.store.warn_expiring(time.time(), self._expiry_warning)
                overdue = self._lifecycle.store.announce_due_commitments(time.time())
                self._lifecycle.metrics.overdue_commitments.set(overdue)
                self._lifecycle.refresh_gauges()
                if time.monotonic() >= self._next_audit:
                    started = time.monotonic()
                    try:
                        self._lifecycle.periodic_audit()
                    finally:
                        took = time.monotonic() - started
                        self._next_audit = started + max(self._audit_interval, took / AUDIT_DUTY)
            except Exception as exc:  # keep sweeping; never log content
                _log.error("sweep failed: %s", type(exc).__name__)
