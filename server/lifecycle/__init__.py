"""The lifecycle of records: deletions end to end, start-up recovery, the sweeper.

==================  ===========================================================
module              holds
==================  ===========================================================
``_deletions``      ``Deletions``: forget, seal, conclude, expiry and start-up
                    resumption, all completed by one path (``complete``:
                    unindex, destroy keys, purge, shred horizon, latency)
``_recovery``       start-up recovery after a crash or a restore
``_lifecycle``      ``Lifecycle``: the above plus audits and gauges
``_sweeper``        the background thread: expiry, rotation, audit, gauges,
                    index snapshots
``_pacing``         ``Pacer``: background work (the periodic audit) sleeping
                    between records while calls are in flight
==================  ===========================================================

May import: the floor (``server.errors``, ``server._metrics``),
``server.store`` (its face), ``server.retrieval`` (its face, for step 2 of a
deletion), ``shredder``; never ``server.edge``, ``server.services`` or
``server.cli``.
"""

from server.lifecycle._deletions import (
    REASON_EXPIRED,
    REASON_FORGET,
    REASON_KEY_DESTROYED,
    Deletions,
)
from server.lifecycle._lifecycle import Lifecycle
from server.lifecycle._recovery import Recovery
from server.lifecycle._sweeper import AUDIT_DUTY, SNAPSHOT_DUTY, SNAPSHOT_SETTLE, Sweeper

__all__ = [
    "AUDIT_DUTY",
    "REASON_EXPIRED",
    "REASON_FORGET",
    "REASON_KEY_DESTROYED",
    "SNAPSHOT_DUTY",
    "SNAPSHOT_SETTLE",
    "Deletions",
    "Lifecycle",
    "Recovery",
    "Sweeper",
]
