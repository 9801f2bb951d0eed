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
from collections.abc import Sequence
from typing import Any

from server._metrics import Metrics
from server._search import Retriever
from server._store import Store

_log = logging.getLogger(__name__)

REASON_FORGET = "FORGET"
REASON_EXPIRED = "EXPIRED"
REASON_KEY_DESTROYED = "KEY_DESTROYED"


class Lifecycle:
    """Runs deletions end to end for one store.

    Args:
        store: the record store.
        retriever: whose loaded indexes lose the deleted ids (step 2).
        metrics: deletion latency and outstanding gauges.
    """

    def __init__(self, store: Store, retriever: Retriever, metrics: Metrics) -> None:
        self.store = store
        self.retriever = retriever
        self.metrics = metrics

    def forget(
        self,
        owner: str,
        *,
        turns: Sequence[tuple[str, int]] = (),
        threads: Sequence[str] = (),
        whole_owner: bool = False,
        reason: str = REASON_FORGET,
    ) -> dict[str, Any]:
        """Forget turns, threads or a whole owner; returns the completed log entry.

        When this returns, the deletion is effective for every reader: the
        tombstones committed in step 1, the index entries are gone, the keys
        are destroyed in the keystore (synced) and the ciphertext is purged.

        Raises:
            NotFound: a named turn or thread never existed (nothing deleted).
        """
        started = time.time()
        plan = self.store.plan_forget(owner, turns, threads, whole_owner, reason, started)
        self.retriever.on_forget(
            owner, plan.rids, plan.entry["threads"], whole_owner, touched=list(turns)
        )
        entry = self.store.finish_forget(plan.entry, time.time())
        self.metrics.deletion_latency.observe(time.time() - started)
        return entry

    def resume_outstanding(self) -> int:
        """Finish every deletion a crash interrupted (start-up; indexes are empty)."""
        entries = self.store.outstanding_deletions()
        for entry in entries:
            self.retriever.on_forget(
                entry["owner"], entry["rids"], entry["threads"], bool(entry["whole_owner"])
            )
            self.store.finish_forget(entry, time.time())
        return len(entries)

    def reconcile_keys(self) -> int:
        """Forget live records whose key no longer exists.

        After a data backup is restored beside the live keystore, records that
        were shredded since the backup are back in LMDB with no key: they are
        unreadable, and this makes them deleted everywhere (reason
        ``KEY_DESTROYED``). Returns how many turns were forgotten.
        """
        count = 0
        for meta in self.store.threads_without_key():
            entry = self.forget(meta.owner, threads=[meta.thread], reason=REASON_KEY_DESTROYED)
            count += int(entry["deleted"])
        by_owner: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for turn in self.store.records_without_key():
            by_owner[turn.owner].append((turn.thread, turn.seq))
        for owner, turns in by_owner.items():
            self.forget(owner, turns=turns, reason=REASON_KEY_DESTROYED)
            count += len(turns)
        return count

    def sweep(self, now: float | None = None) -> int:
        """Forget every pending turn past its expiry; returns how many."""
        expired = self.store.expired(time.time() if now is None else now)
        by_owner: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for meta in expired:
            by_owner[meta.owner].append((meta.thread, meta.seq))
        for owner, turns in by_owner.items():
            self.forget(owner, turns=turns, reason=REASON_EXPIRED)
        return len(expired)

    def refresh_gauges(self) -> None:
        now = time.time()
        count, age = self.store.pending_stats(now)
        self.metrics.pending_records.set(count)
        self.metrics.oldest_pending_age.set(age)
        self.metrics.outstanding_deletions.set(len(self.store.outstanding_deletions()))
        self.metrics.index_vectors.set(self.retriever.cache.total_vectors())
        self.metrics.keystore_keys.set(self.store.keystore.key_count())


class Sweeper:
    """Background thread: expiry sweep and gauges every ``interval`` seconds."""

    def __init__(self, lifecycle: Lifecycle, interval: float) -> None:
        self._lifecycle = lifecycle
        self._interval = interval
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
                self._lifecycle.refresh_gauges()
            except Exception as exc:  # keep sweeping; never log content
                _log.error("sweep failed: %s", type(exc).__name__)
