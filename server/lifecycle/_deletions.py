"""Deletions end to end: the four steps of every forget, and the one path that completes them.

A deletion is planned in one transaction (step 1, :meth:`server.store.Store.plan_forget`,
or inside a seal or a repair's conclusion), then :meth:`Deletions.complete`
runs the rest for every cause alike: step 2 removes what was planned from
every loaded index, steps 3 and 4 destroy the keys (synced) and purge the rows
(:meth:`server.store.Store.finish_forget`), and the completed log entry carries
the *shred horizon*: when the next rotation completes the shred
cryptographically. Who calls it:

================================  ===================  ========================
cause                             shred horizon        ``lethe_deletion_latency``
================================  ===================  ========================
``Forget``, expiry, recovery      the next rotation    observed (request → done)
``ConcludeRepair``                the next rotation    observed
``SealRepair`` (mixed derivatives)  the next rotation  not observed (no request
                                                       to delete)
start-up resumption of the log    the next rotation    not observed (the request
                                                       was before the crash)
================================  ===================  ========================

The shred horizon is 0 ("none due") only where no rotation will ever run: an
in-memory KEK (``LETHE_KEK``, tests) is never rotated.

Thread rules: any thread (each step waits on the store's writer).
"""

from __future__ import annotations

import time
from collections import defaultdict

from server._metrics import Metrics
from server.errors import NotFound
from server.lifecycle._echoes import expire_guards, sweep_echoes
from server.retrieval import Retriever
from server.store import (
    ECHO_IGNORE,
    DeletionEntry,
    ForgetTargets,
    MemMeta,
    MemoryDraft,
    MemoryView,
    Store,
    ThreadView,
)

REASON_FORGET = "FORGET"
REASON_EXPIRED = "EXPIRED"
REASON_RETENTION = "RETENTION"
REASON_KEY_DESTROYED = "KEY_DESTROYED"
DEFAULT_ECHO_GUARD_WINDOW = 72 * 3600.0
"""Seconds an echo guard stands by default: the default pending TTL."""


class Deletions:
    """Runs deletions end to end for one store.

    Args:
        store: the record store.
        retriever: whose loaded indexes lose the deleted ids (step 2).
        metrics: deletion latency and outstanding gauges.
        rotation_interval: seconds between rotations (0: never); only a KEK
            file can be rotated, so an in-memory KEK makes it 0.
        echo_guard_window: seconds a forget's echo guard stands unless the
            request says otherwise (``--echo-guard-window``; 0: no guard).
    """

    def __init__(
        self,
        store: Store,
        retriever: Retriever,
        metrics: Metrics,
        rotation_interval: float = 3600.0,
        echo_guard_window: float = DEFAULT_ECHO_GUARD_WINDOW,
    ) -> None:
        self.store = store
        self.retriever = retriever
        self.metrics = metrics
        self.echo_guard_window = echo_guard_window
        self._guard_hits_seen = 0
        self.rotation_interval = rotation_interval if store.kek_rotatable else 0.0
        self.last_rotation = time.time()

    def shred_horizon(self) -> float:
        """When the next rotation completes today's shreds (seconds), 0 if none will run."""
        if not self.rotation_interval:
            return 0.0
        return self.last_rotation + self.rotation_interval

    def rotate_if_due(self, now: float, force: bool = False) -> bool:
        """Rotate when a shred awaits completion and the interval has passed.

        Returns:
            Whether a rotation ran.
        """
        if not self.rotation_interval and not force:
            return False
        if self.store.unrotated_since() is None:
            return False
        if not force and now - self.last_rotation < self.rotation_interval:
            return False
        self.store.rotate()
        self.last_rotation = time.time()
        return True

    def complete(
        self,
        entry: DeletionEntry,
        *,
        requested: float | None,
        touched_threads: tuple[str, ...] = (),
        also_unindex: tuple[int, ...] = (),
    ) -> DeletionEntry:
        """Steps 2 to 4 of a planned deletion: the one path every cause takes.

        Args:
            entry: the planned (or, at start-up, outstanding) log entry.
            requested: when the deletion was requested (seconds), for
                ``lethe_deletion_latency_seconds``; None: not a request
                (a seal's mixed derivatives, a resumed entry), not observed.
            touched_threads: threads whose pending bundles are dropped besides
                the entry's own (a seal's source thread).
            also_unindex: record numbers leaving the indexes besides the
                entry's (the turns a seal moved out of general retrieval).

        Returns:
            The completed entry, its ``shred_horizon_time`` set to
            :meth:`shred_horizon`.
        """
        # Positions of the turns leaving are known when this process planned
        # the entry (and nothing else leaves); otherwise step 2 reads them.
        known = entry.positions if entry.positions and not also_unindex else None
        self.retriever.on_forget(
            entry.owner,
            [*also_unindex, *entry.index_rids()],
            entry.threads,
            entry.whole_owner,
            touched_threads=[*touched_threads, *entry.touched],
            positions=known,
        )
        done = self.store.finish_forget(entry, time.time(), self.shred_horizon())
        if requested is not None:
            self.metrics.deletion_latency.observe(time.time() - requested)
        return done

    def forget(
        self,
        owner: str,
        targets: ForgetTargets,
        *,
        reason: str = REASON_FORGET,
        echoes: str = ECHO_IGNORE,
        echo_guard: float | None = None,
    ) -> DeletionEntry:
        """Forget turns, turn ranges, threads, memories or a whole owner.

        When this returns, the deletion is effective for every reader: the
        tombstones committed in step 1, the index entries are gone, the keys
        are destroyed in the keystore (synced) and the ciphertext is purged.

        Args:
            owner: whose records.
            targets: what to forget.
            reason: the receipt's reason (``FORGET``, ``EXPIRED``, …).
            echoes: what to do with echoes of the forgotten texts outside their
                declared lineage (``REPORT``, ``TAINT``, ``FORGET``), found
                before step 1 (:mod:`server.lifecycle._echoes`); ``IGNORE``
                (expiry, recovery, a whole owner) looks for none.
            echo_guard: seconds the echo guard stands (None: the default
                window; 0: no guard).

        Returns:
            The completed log entry (the receipt).

        Raises:
            NotFound / RecordDeleted: a named record never existed / is gone
                (nothing deleted).
        """
        started = time.time()
        sweep = None
        if echoes != ECHO_IGNORE and not targets.whole_owner:
            window = self.echo_guard_window if echo_guard is None else echo_guard
            sweep = sweep_echoes(self.store, self.retriever, owner, targets, echoes, window)
        entry = self.store.plan_forget(
            owner, targets, reason=reason, request_time=started, echoes=sweep
        )
        self.metrics.echoes_found.inc(entry.echoes_found)
        self.metrics.echoes_acted.inc(entry.echoes_acted)
        return self.complete(entry, requested=started)

    def expire_guards(self, now: float | None = None) -> int:
        """End the echo guards whose window passed (the sweeper; start-up).

        Returns:
            How many guards ended.
        """
        return expire_guards(self.store, time.time() if now is None else now)

    def seal(self, owner: str, thread: str, from_seq: int) -> ThreadView:
        """Seal a stretch into a new repair.

        Sealed records leave the general index at once; mixed derivatives are
        deleted like any forget (through :meth:`complete`).

        Returns:
            The new repair thread.
        """
        view, entry, left = self.store.seal_repair(owner, thread, from_seq)
        if entry is None:
            self.retriever.on_forget(owner, left, [], False, touched_threads=[thread])
        else:
            self.complete(
                entry, requested=None, touched_threads=(thread,), also_unindex=tuple(left)
            )
        return view

    def conclude(
        self, owner: str, repair_id: str, outcome: str, lesson: MemoryDraft | None
    ) -> tuple[ThreadView, DeletionEntry, MemoryView | None]:
        """Conclude a repair with ``DESTROY`` or ``DISTILL``.

        One transaction concludes it and plans the deletion of what it held
        (see :meth:`server.store.Store.conclude_repair`); when this returns, its
        ring is destroyed and its rows purged.

        Returns:
            The concluded repair, the completed log entry, and the distilled
            lesson (None for ``DESTROY``).
        """
        started = time.time()
        view, entry, made = self.store.conclude_repair(owner, repair_id, outcome, lesson)
        if made is not None:
            self.retriever.on_write(owner, [made.meta])
        return view, self.complete(entry, requested=started), made

    def resume_outstanding(self) -> int:
        """Finish every deletion a crash interrupted (start-up; indexes are empty).

        Returns:
            How many log entries were finished.
        """
        entries = self.store.outstanding_deletions()
        for entry in entries:
            self.complete(entry, requested=None)
        return len(entries)

    def sweep(self, now: float | None = None) -> int:
        """Forget what expired, as reads already see it: gone.

        Threads and committed records past their retention go with reason
        ``RETENTION``, pending records past their window with ``EXPIRED``. It is
        the same deletion as a ``Forget`` (one per owner and cause, with its
        receipt), so a crash half-way is finished at start-up or by the next
        sweep.

        Returns:
            How many threads and records were forgotten.
        """
        now = time.time() if now is None else now
        count = 0
        for owner, thread in self.store.expired_threads(now):
            try:
                self.forget(owner, ForgetTargets.of(threads=[thread]), reason=REASON_RETENTION)
            except NotFound:  # being forgotten by another deletion (RecordDeleted too)
                continue
            count += 1
        for retention, reason in ((True, REASON_RETENTION), (False, REASON_EXPIRED)):
            expired = self.store.expired(now, retention=retention)
            by_owner: dict[str, list[tuple[str, int]]] = defaultdict(list)
            mems_by_owner: dict[str, list[str]] = defaultdict(list)
            for meta in expired:
                if isinstance(meta, MemMeta):
                    mems_by_owner[meta.owner].append(meta.memory_id)
                else:
                    by_owner[meta.owner].append((meta.thread, meta.seq))
            for owner in {*by_owner, *mems_by_owner}:
                targets = ForgetTargets.of(turns=by_owner[owner], memories=mems_by_owner[owner])
                self.forget(owner, targets, reason=reason)
            count += len(expired)
        return count
