"""The sweeper: the background thread that expires, rotates, audits, measures and snapshots.

Thread rules: :class:`Sweeper` runs its own daemon thread; ``start`` and
``stop`` are called by the app.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from server.lifecycle._lifecycle import Lifecycle
from server.lifecycle._pacing import never_busy

_log = logging.getLogger(__name__)


AUDIT_DUTY = 0.05
"""Most share of the time the periodic audit may run: it reads every owner's
records (at a million turns, about 20 s of one core), so an audit of ``d``
seconds that started at ``t`` is followed by the next one at ``t + d /
AUDIT_DUTY`` if that is later than ``t`` plus the audit interval, instead of
running back to back with the searches."""


SNAPSHOT_SETTLE = 10.0
"""Seconds an owner's loaded index must go without a change before the sweeper
writes its snapshot (less on a sweeper faster than a second: ten sweep
intervals), so a stream of writes is not snapshotted after each one."""

SNAPSHOT_DUTY = 0.1
"""Most share of the time the sweeper spends writing index snapshots: a pass of
``d`` seconds that started at ``t`` is followed by the next one no sooner than
``t + d / SNAPSHOT_DUTY`` (a 100k-turn owner's snapshot takes about a second to
write), and a pass starts no new owner after :data:`SNAPSHOT_PASS` seconds."""

SNAPSHOT_PASS = 5.0
"""Seconds after which a snapshot pass starts no further owner (the rest wait
for the next pass)."""


class Sweeper:
    """Background thread: expiry, echo guards, gauges, the audit and event pruning, on a schedule.

    The expiry sweep and gauges run every ``interval`` seconds; the audit
    gauges and event pruning every ``audit_interval`` seconds, or less often on
    a store whose audit takes longer (:data:`AUDIT_DUTY`); the snapshots of
    loaded owners whose indexes changed and then settled
    (:data:`SNAPSHOT_SETTLE`) within :data:`SNAPSHOT_DUTY`.
    """

    def __init__(
        self,
        lifecycle: Lifecycle,
        interval: float,
        audit_interval: float = 60.0,
        expiry_warning: float = 3600.0,
        busy: Callable[[], bool] = never_busy,
    ) -> None:
        self._lifecycle = lifecycle
        self._busy = busy  # calls in flight: the periodic audit yields to them
        self._interval = interval
        self._expiry_warning = expiry_warning
        self._audit_interval = audit_interval
        self._next_audit = 0.0  # time.monotonic() at which the next audit is due
        self._next_snapshots = 0.0  # time.monotonic() at which the next snapshot pass may run
        self._settle = min(SNAPSHOT_SETTLE, 10 * interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lethe-sweeper", daemon=True)

    def start(self) -> None:
        """Start the sweeper's thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the sweeper and wait for its thread (a sweep under way finishes first)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._lifecycle.store.writer.tidy()  # what a storage fault left undone
                self._lifecycle.store.disk_reserve.ensure()  # after a deletion spent it
                self._lifecycle.sweep()
                self._lifecycle.expire_guards()
                self._lifecycle.rotate_if_due(time.time())
                self._lifecycle.store.warn_expiring(time.time(), self._expiry_warning)
                overdue = self._lifecycle.store.announce_due_commitments(time.time())
                self._lifecycle.metrics.overdue_commitments.set(overdue)
                self._lifecycle.refresh_gauges()
                if time.monotonic() >= self._next_audit:
                    started = time.monotonic()
                    try:
                        # yields to calls; abandoned at stop
                        self._lifecycle.periodic_audit(self._stop.is_set, self._busy)
                    finally:
                        took = time.monotonic() - started
                        self._next_audit = started + max(self._audit_interval, took / AUDIT_DUTY)
                if time.monotonic() >= self._next_snapshots:
                    started = time.monotonic()
                    try:
                        self._lifecycle.save_snapshots(self._settle, started + SNAPSHOT_PASS)
                    finally:
                        took = time.monotonic() - started
                        self._next_snapshots = started + took / SNAPSHOT_DUTY
            except Exception as exc:  # keep sweeping; never log content
                _log.error("sweep failed: %s", type(exc).__name__)
