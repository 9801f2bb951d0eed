"""The typed Python client of Lethe: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

One method per RPC of ``lethe.v1``, with typed errors by code and reason,
retries where they are safe, default deadlines, page iterators and a
resuming event stream.

Example::

    from lethe.client import Client, RecordDeleted

    with Client("127.0.0.1:50051", token) as lethe:
        thread = lethe.create_thread("owners/alice")
        lethe.append_turns(thread.name, [{"role": "USER", "text": "I adopted a puppy"}])
        try:
            lethe.get_turn(thread.name + "/turns/1")
        except RecordDeleted:
            ...

Importable without the server: grpc, protobuf, googleapis-common-protos and
``lethe.v1`` only. Public names (pinned by ``tests/lethe/test_client_contract.py``):

- clients: :class:`Client`, :class:`AsyncClient`, :class:`EventStream`,
  :class:`AsyncEventStream`, :func:`new_request_id`;
- settings: :class:`TLSConfig`, :class:`RetryPolicy`, :data:`DEFAULT_TIMEOUT`,
  :data:`RETRIED_METHODS`, :data:`MAX_MESSAGE_BYTES`;
- errors (tree in :mod:`lethe.client._errors`): :class:`LetheError`, a class
  per status code and per documented ``ErrorReason``, :class:`FieldViolation`,
  :data:`ErrorReason`, :data:`DOMAIN`, :func:`error_from_rpc`.

Every call carries ``x-lethe-owner: {owner}`` (:data:`lethe.names.OWNER_HEADER`),
the owner of its resource names, for a proxy that shards by owner
(:mod:`lethe.client._routing`).

Layout (private modules): the asyncio client is the source, written once.
``_async`` holds :class:`AsyncClient` (it composes the method groups and adds
the channel's lifecycle), ``_base_async`` their declared base (the channel
and the unary call), and each service has its method group: ``_threads_async``,
``_memories_async``, ``_retrieval_async``, ``_lifecycle_async``,
``_repairs_async`` and ``_events_async`` (``watch`` and the resuming event
stream). The blocking client is generated from them by
``scripts/gen_sync_client.py`` into ``_sync``, ``_base_sync``,
``_threads_sync`` … (never edit those: ``tests/test_generated_code.py``
fails when they are stale). What the two flavours cannot share (the channel,
the unary call, what an event stream waits on and reads with) is hand-written
twice, in ``_transport_async`` and ``_transport_sync``, which also give the
thread rules. Both flavours share ``_build`` (requests from keyword
arguments), ``_config`` (TLS, retries, deadlines, reconnects), ``_errors``,
``_routing`` and ``_types``.
"""

from lethe.client._async import AsyncClient
from lethe.client._build import new_request_id
from lethe.client._config import (
    DEFAULT_TIMEOUT,
    MAX_MESSAGE_BYTES,
    RETRIED_METHODS,
    RetryPolicy,
    TLSConfig,
)
from lethe.client._errors import (
    DOMAIN,
    Aborted,
    AlreadyExists,
    BadField,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    DimensionMismatch,
    Draining,
    EchoesForgotten,
    ErrorReason,
    FailedPrecondition,
    FieldViolation,
    IllegalTransition,
    Integrity,
    Internal,
    InvalidArgument,
    InvalidToken,
    LetheError,
    MalformedRequest,
    MissingToken,
    NotFound,
    OutOfRange,
    OwnerHeaderMismatch,
    OwnerHeaderMissing,
    OwnerMoved,
    OwnerMoving,
    OwnerNotAllowed,
    PermissionDenied,
    RecordDeleted,
    RepairNotContinued,
    ResourceExhausted,
    Restricted,
    Sealed,
    ShardUnavailable,
    SlotConflict,
    SourceDeleted,
    SourcePending,
    SourceSealed,
    SourceStale,
    StorageUnavailable,
    StoreFull,
    TooManyRequests,
    TooManyStreams,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
    VersionMismatch,
    error_from_rpc,
)
from lethe.client._events_async import AsyncEventStream
from lethe.client._events_sync import EventStream
from lethe.client._sync import Client

__all__ = [
    "DEFAULT_TIMEOUT",
    "DOMAIN",
    "MAX_MESSAGE_BYTES",
    "RETRIED_METHODS",
    "Aborted",
    "AlreadyExists",
    "AsyncClient",
    "AsyncEventStream",
    "BadField",
    "Cancelled",
    "Client",
    "DataLoss",
    "DeadlineExceeded",
    "DimensionMismatch",
    "Draining",
    "EchoesForgotten",
    "ErrorReason",
    "EventStream",
    "FailedPrecondition",
    "FieldViolation",
    "IllegalTransition",
    "Integrity",
    "Internal",
    "InvalidArgument",
    "InvalidToken",
    "LetheError",
    "MalformedRequest",
    "MissingToken",
    "NotFound",
    "OutOfRange",
    "OwnerHeaderMismatch",
    "OwnerHeaderMissing",
    "OwnerMoved",
    "OwnerMoving",
    "OwnerNotAllowed",
    "PermissionDenied",
    "RecordDeleted",
    "RepairNotContinued",
    "ResourceExhausted",
    "Restricted",
    "RetryPolicy",
    "Sealed",
    "ShardUnavailable",
    "SlotConflict",
    "SourceDeleted",
    "SourcePending",
    "SourceSealed",
    "SourceStale",
    "StorageUnavailable",
    "StoreFull",
    "TLSConfig",
    "TooManyRequests",
    "TooManyStreams",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "VersionMismatch",
    "error_from_rpc",
    "new_request_id",
]
