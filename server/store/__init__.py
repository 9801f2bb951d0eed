"""The record store on LMDB, behind one face.

Everything in ``server/`` that reads or writes records goes through the names
below; nothing outside ``server/store/`` opens an LMDB transaction, queues a
write op, spells a key layout or imports a ``server.store._*`` module
(``tests/test_layout.py`` checks it). Only this package touches LMDB.

Rooms inside:

==================  ===========================================================
module              holds
==================  ===========================================================
``_schema``         every named database (``Tables``) and every key layout
``_records``        the rows: TurnMeta, ThreadMeta, MemMeta, tombstones, events…
``_views``          decrypted views and validated drafts handed in and out
``_visibility``     the one place that decides visibility (state, expiry, taint)
``_shapes``         kinds, their defaults and state machines, slots, scopes
``_lineage``        both directions of every lineage edge
``_writer``         the one writer thread and its group commit
``_base``           the declared base every part inherits (env, tables, keystore,
                    writer, lookups, views, the one event writer, tombstones)
``_threads``        threads and turns
``_memories``       memories: publication, corrections, transitions, preferences
``_pending``        commit, ExtendPending, expiry queue, ``PENDING_EXPIRING``
``_retention``      retention of committed records, threads and an owner's new records
``_forget``         the forget plan, cascade, purge and the deletion log
``_echoes``         a forget's echo guard: keyed digests under a key of its own,
                    the check of every write, the end of its window
``_repairs``        sealing, reopening and pausing repairs
``_events``         reading, emitting and pruning events
``_manifests``      context manifests
``_audit``          the audit's store counts and key/record reconciliation
``_tokens``         bearer tokens as digests: create, list, revoke, expiry
``_placement``      moved-away markers: owners this shard no longer holds
``_moves``          moving an owner between shards: export, import, release
``_vectors``        which embedder made an owner's vectors; swapping them all at once
``_export``         what an owner's export reads besides the listings: every memory
                    version, lineage edges
``_snapshots``      sealed index snapshots on disk (outside ``data/``) and their key
``_changes``        the change log: which rows of an owner each write changed, for
                    the processes that share a data directory
``_store``          opening a data directory; ``Store`` composes the parts
==================  ===========================================================

May import: ``lethe`` (names, generated messages), ``server.errors`` and
``shredder``; never another ``server`` module, never ``index``.
"""

from server.store._audit import AuditCounts, KeyCheck
from server.store._base import record_ring
from server.store._echoes import (
    ECHO_ACTIONS,
    ECHO_FORGET,
    ECHO_IGNORE,
    ECHO_REPORT,
    ECHO_TAINT,
    EchoSweep,
    GuardKeyRow,
    GuardPlan,
    GuardRow,
    Shingler,
    guard_end,
)
from server.store._events import EVENT_RETENTION
from server.store._forget import DESTINATIONS, DeletionEntry, Destination, ForgetTargets
from server.store._moves import MoveRefused, OwnerExport
from server.store._placement import MovedRow
from server.store._records import (
    COMMITTED,
    PENDING,
    REPAIR_CONCLUDED,
    REPAIR_CONTINUED,
    REPAIR_PAUSED,
    SEALED,
    EventRow,
    ManifestRow,
    MemMeta,
    RecordMeta,
    ThreadMeta,
    TurnMeta,
)
from server.store._reserve import DEFAULT_DISK_RESERVE
from server.store._shapes import KIND_DEFAULTS, SlotConflict, scope_chain
from server.store._snapshots import RowSink, SnapshotCleanup, StagedSnapshot
from server.store._store import (
    DEFAULT_MAX_STORE_SIZE,
    KEK_ENV,
    Store,
    StoreLockedError,
    acquire_lock,
    data_paths,
    open_store_for,
)
from server.store._tokens import TokenReconcile, TokenRow
from server.store._vectors import NO_EMBEDDER, EmbedderChange
from server.store._views import (
    MemoryContent,
    MemoryDraft,
    MemoryView,
    MemoryWrite,
    RecordView,
    ThreadView,
    TurnDraft,
    TurnView,
)
from server.store._visibility import (
    effective_state,
    general_visible,
    indexable,
    pending_indexable,
    pending_visible,
    searchable,
)

__all__ = [
    "COMMITTED",
    "DEFAULT_DISK_RESERVE",
    "DEFAULT_MAX_STORE_SIZE",
    "DESTINATIONS",
    "ECHO_ACTIONS",
    "ECHO_FORGET",
    "ECHO_IGNORE",
    "ECHO_REPORT",
    "ECHO_TAINT",
    "EVENT_RETENTION",
    "KEK_ENV",
    "KIND_DEFAULTS",
    "NO_EMBEDDER",
    "PENDING",
    "REPAIR_CONCLUDED",
    "REPAIR_CONTINUED",
    "REPAIR_PAUSED",
    "SEALED",
    "AuditCounts",
    "DeletionEntry",
    "Destination",
    "EchoSweep",
    "EmbedderChange",
    "EventRow",
    "ForgetTargets",
    "GuardKeyRow",
    "GuardPlan",
    "GuardRow",
    "KeyCheck",
    "ManifestRow",
    "MemMeta",
    "MemoryContent",
    "MemoryDraft",
    "MemoryView",
    "MemoryWrite",
    "MoveRefused",
    "MovedRow",
    "OwnerExport",
    "RecordMeta",
    "RecordView",
    "RowSink",
    "Shingler",
    "SlotConflict",
    "SnapshotCleanup",
    "StagedSnapshot",
    "Store",
    "StoreLockedError",
    "ThreadMeta",
    "ThreadView",
    "TokenReconcile",
    "TokenRow",
    "TurnDraft",
    "TurnMeta",
    "TurnView",
    "acquire_lock",
    "data_paths",
    "effective_state",
    "general_visible",
    "guard_end",
    "indexable",
    "open_store_for",
    "pending_indexable",
    "pending_visible",
    "record_ring",
    "scope_chain",
    "searchable",
]
