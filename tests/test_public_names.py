"""Pins the public names of the ``server`` package and of its rooms' faces.

STYLE.md: private modules, explicit public names. ``shredder`` and ``index``
pin theirs in their own tests.
"""

from __future__ import annotations

import server


def test_server_public_names_are_pinned() -> None:
    assert sorted(server.__all__) == [
        "LetheError",
        "LetheServer",
        "ServerConfig",
        "Store",
        "StoreLockedError",
        "new_token",
        "principal_record",
        "token_digest",
    ]


def test_store_face_is_pinned() -> None:
    """``server.store`` is the only way the rest of the server reaches the store."""
    import server.store

    assert sorted(server.store.__all__) == sorted(
        [
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
            "ForgetTargets",
            "GuardKeyRow",
            "GuardPlan",
            "GuardRow",
            "KeyCheck",
            "EventRow",
            "ManifestRow",
            "MemMeta",
            "MemoryContent",
            "MemoryDraft",
            "MemoryWrite",
            "MemoryView",
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
    )
    for name in server.store.__all__:
        assert hasattr(server.store, name), name


def test_services_face_is_pinned() -> None:
    import server.services

    assert sorted(server.services.__all__) == [
        "EventsService",
        "LifecycleService",
        "MemoriesService",
        "RepairsService",
        "RetrievalService",
        "ThreadsService",
    ]


def test_edge_face_is_pinned() -> None:
    import server.edge

    assert sorted(server.edge.__all__) == sorted(
        [
            "LABEL_RE",
            "TOKEN_CACHE_SECONDS",
            "Admission",
            "Authenticator",
            "ConnectApp",
            "Edge",
            "EventHub",
            "FairExecutor",
            "Limits",
            "Method",
            "Principal",
            "Router",
            "StreamContext",
            "SyncContext",
            "authorize",
            "new_token",
            "principal_record",
            "token_digest",
        ]
    )


def test_retrieval_face_is_pinned() -> None:
    import server.retrieval

    assert sorted(server.retrieval.__all__) == sorted(
        [
            "BUILD_CHUNK",
            "DEFAULT_MAX_CHARS",
            "DEFAULT_RECENT",
            "DEFAULT_TOP_K",
            "ECHO_RULE",
            "MODE_DENSE",
            "MODE_HYBRID",
            "MODE_LEXICAL",
            "ContextBundle",
            "Retriever",
            "SearchHit",
            "TermMemo",
            "assemble",
            "check_embedder",
            "date_text",
            "echo_shingles",
            "echo_terms",
            "find_owner_echoes",
            "index_drift",
            "indexed_text",
            "plain_text",
            "reembed_owner",
            "session_key",
        ]
    )


def test_lifecycle_face_is_pinned() -> None:
    import server.lifecycle

    assert sorted(server.lifecycle.__all__) == sorted(
        [
            "AUDIT_DUTY",
            "SNAPSHOT_DUTY",
            "SNAPSHOT_SETTLE",
            "REASON_EXPIRED",
            "REASON_FORGET",
            "REASON_KEY_DESTROYED",
            "Deletions",
            "Lifecycle",
            "Recovery",
            "Sweeper",
        ]
    )


def test_every_face_resolves_its_names() -> None:
    import importlib

    for room in ("server.edge", "server.retrieval", "server.lifecycle", "server.services"):
        module = importlib.import_module(room)
        for name in module.__all__:
            assert hasattr(module, name), f"{room}.{name}"


def test_server_public_names_resolve() -> None:
    for name in server.__all__:
        assert getattr(server, name).__module__.startswith("server"), name


def test_every_rpc_of_the_api_is_served_by_our_servicers() -> None:
    """Every method of every lethe.v1 service is overridden by the servicer class we register.

    The generated ``*Servicer`` base classes answer NotImplementedError.
    """
    from lethe.v1 import (
        events_pb2,
        lifecycle_pb2,
        memories_pb2,
        repairs_pb2,
        retrieval_pb2,
        threads_pb2,
    )
    from server.services import (
        EventsService,
        LifecycleService,
        MemoriesService,
        RepairsService,
        RetrievalService,
        ThreadsService,
    )

    servicers = {
        (threads_pb2, "Threads"): ThreadsService,
        (memories_pb2, "Memories"): MemoriesService,
        (retrieval_pb2, "Retrieval"): RetrievalService,
        (lifecycle_pb2, "Lifecycle"): LifecycleService,
        (repairs_pb2, "Repairs"): RepairsService,
        (events_pb2, "Events"): EventsService,
    }
    missing = []
    for (module, service), cls in servicers.items():
        base = cls.__mro__[1]
        for method in module.DESCRIPTOR.services_by_name[service].methods:
            if getattr(cls, method.name) is getattr(base, method.name):
                missing.append(f"{service}.{method.name}")
    assert missing == []
