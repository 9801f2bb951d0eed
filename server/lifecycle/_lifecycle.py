"""The lifecycle of one store: deletions, start-up recovery, audits, gauges and snapshots.

:class:`Lifecycle` is what the servicers, the app and ``lethe restore`` hold:
the deletion path of :class:`~server.lifecycle._deletions.Deletions`, plus the
start-up recovery (:func:`~server.lifecycle._recovery.recover`), the audit of
one owner (with the loaded index's drift), the periodic audit, the gauges the
sweeper refreshes, and the index snapshots it writes (and the app at a clean
stop).

Thread rules: any thread; the sweeper calls the periodic parts from its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from server.lifecycle._deletions import Deletions
from server.lifecycle._pacing import Pacer, Stopped, never_busy, never_stopped
from server.lifecycle._recovery import Recovery, recover
from server.store import EVENT_RETENTION, AuditCounts

STOP_SNAPSHOT_SECONDS = 10.0
"""Seconds a clean stop may spend starting index snapshots (``deploy/``'s systemd
unit allows 45 s to stop, the drain's 30 s included; a 100k-turn owner's snapshot
takes about a second). Owners left over are built from LMDB, or replayed from
an older snapshot, on their next first use; a stop killed while writing one
leaves a temporary file that start-up removes."""


class Lifecycle(Deletions):
    """Deletions end to end, recovery, audits and gauges for one store.

    Args:
        store: the record store.
        retriever: whose loaded indexes lose the deleted ids (step 2).
        metrics: deletion latency and outstanding gauges.
        rotation_interval: seconds between rotations (0: never); only a KEK
            file can be rotated, so an in-memory KEK makes it 0.
    """

    def recover(self) -> Recovery:
        """Bring the store to a consistent state at start-up (see :func:`recover`)."""
        return recover(self)

    def audit(self, owner: str, *, integrity: bool = True) -> AuditCounts:
        """The owner's AuditReport: the store's counts plus the loaded index's drift.

        ``integrity``: open every live record (see
        :meth:`server.store.Store.audit`).
        """
        counts = self.store.audit(owner, integrity=integrity)
        counts.index_drift = self.retriever.index_drift(owner)
        return counts

    def drop_owner(self, owner: str) -> None:
        """Drop what this process holds of ``owner`` in memory: its loaded indexes and cached keys.

        The indexes hold decrypted text, the keys are unwrapped. Called when
        another process changed the owner's placement (an owner move).
        """
        self.retriever.drop_owner(owner)
        self.retriever.drop_snapshot(owner)
        self.store.discard_snapshot(owner)
        self.store.keystore.evict_owner(owner)

    def save_snapshots_at_stop(self) -> int:
        """At a clean stop, once no call runs: snapshot every loaded owner that changed.

        Within :data:`STOP_SNAPSHOT_SECONDS`, most recently used owners first.

        Returns:
            How many snapshots were written.
        """
        return self.save_snapshots(0.0, time.monotonic() + STOP_SNAPSHOT_SECONDS)

    def save_snapshots(self, settle: float = 0.0, deadline: float | None = None) -> int:
        """Write the index snapshots of loaded owners whose indexes changed since their last one.

        Args:
            settle: seconds without a change an owner's indexes need first (0
                at a clean stop: every changed owner).
            deadline: ``time.monotonic()`` past which no further owner is started.

        Returns:
            How many snapshots were written (see
            :meth:`server.retrieval.Retriever.save_snapshots`).
        """
        return len(self.retriever.save_snapshots(settle, deadline))

    def periodic_audit(
        self,
        stopped: Callable[[], bool] = never_stopped,
        busy: Callable[[], bool] = never_busy,
    ) -> bool:
        """Audit every owner into the gauges, prune old events, drop owners that moved away.

        The gauges: orphans, stale summaries, keyless records and stray index
        snapshots. The owners
        that moved away are dropped from memory. Only what the gauges show is
        counted: not the index drift nor the keys without a record (an audit
        asked for, :meth:`audit`, counts those).

        It yields to calls: while ``busy`` (calls in flight; the sweeper's), a
        :class:`Pacer` keeps it to
        ``server.lifecycle._pacing.AUDIT_DUTY_UNDER_LOAD`` of the time. Once
        ``stopped`` (the sweeper's stop) it is abandoned, the gauges left as
        they were.

        Returns:
            False if it was abandoned, else True.
        """
        for row in self.store.moved_owners():
            if row.state == "moved":
                self.drop_owner(row.owner)
        orphans = stale = keyless = 0
        pace = Pacer(busy, stopped=stopped)
        try:
            for owner in self.store.owners():
                counts = self.store.audit(owner, integrity=False, keys=False, pace=pace)
                orphans += counts.orphans
                stale += counts.stale_summaries
                keyless += counts.records_without_key
        except Stopped:
            return False
        self.metrics.orphan_derivatives.set(orphans)
        self.metrics.stale_summaries.set(stale)
        self.metrics.records_without_key.set(keyless)
        self.metrics.index_snapshot_strays.set(self.store.snapshot_strays())
        self.store.prune_events(time.time() - EVENT_RETENTION)
        return True

    def refresh_gauges(self) -> None:
        """Set the gauges the sweeper refreshes: pending, deletions, index, keystore, store."""
        now = time.time()
        count, age = self.store.pending_stats(now)
        self.metrics.pending_records.set(count)
        self.metrics.oldest_pending_age.set(age)
        self.metrics.outstanding_deletions.set(len(self.store.outstanding_deletions()))
        self.metrics.index_vectors.set(self.retriever.cache.total_vectors())
        self.metrics.index_bytes.set(self.retriever.cache.total_bytes())
        self.metrics.keystore_keys.set(self.store.key_count())
        self.metrics.echo_guard_keys.set(self.store.guard_count())
        hits = self.store.echo_guard_hits
        self.metrics.echo_guard_hits.inc(max(0, hits - self._guard_hits_seen))
        self._guard_hits_seen = hits
        self.metrics.stray_key_files.set(self.store.stray_key_files())
        self.metrics.disk_reserve_bytes.set(self.store.disk_reserve.held())
        self.metrics.unreadable_records.set(self.store.unreadable_count())
        used = self.store.used_bytes()
        self.metrics.store_bytes.set(used)
        self.metrics.store_fill_ratio.set(self.store.live_bytes() / self.store.max_size)
        since = self.store.unrotated_since()
        self.metrics.shred_horizon.set(0.0 if since is None else now - since)
