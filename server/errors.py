"""Domain errors of the server and their mapping to gRPC status.

Every error a client can see is a ``LetheError``: it knows its gRPC status
code, its ``ErrorInfo`` reason (domain ``lethe``; a constant of
:data:`Reason`, which *is* the proto enum ``lethe.errors.v1.ErrorReason``, so
the server cannot raise a reason clients do not have) and, where it applies,
the offending field
(``BadRequest``) or source (``PreconditionFailure``). The one boundary that
turns them into ``google.rpc.Status`` is :func:`to_rpc_status`; anything else
that escapes a handler becomes ``INTERNAL`` with no internals in the message.

Exception tree::

    LetheError
    ├── Unauthenticated        UNAUTHENTICATED      MISSING_TOKEN | INVALID_TOKEN
    ├── PermissionDenied       PERMISSION_DENIED    OWNER_NOT_ALLOWED
    ├── InvalidArgument        INVALID_ARGUMENT     BAD_FIELD | DIMENSION_MISMATCH
    ├── MalformedRequest       INVALID_ARGUMENT     MALFORMED_REQUEST
    ├── WrongOwnerHeader       INVALID_ARGUMENT     OWNER_HEADER_MISMATCH | OWNER_HEADER_MISSING
    ├── NotFound               NOT_FOUND            NOT_FOUND
    │   └── RecordDeleted      NOT_FOUND            RECORD_DELETED
    ├── FailedPrecondition     FAILED_PRECONDITION  SEALED | SOURCE_* | ...
    │   └── OwnerMoved         FAILED_PRECONDITION  OWNER_MOVED (metadata: shard, target)
    ├── AlreadyExists          ALREADY_EXISTS       ALREADY_EXISTS | SLOT_CONFLICT
    ├── Aborted                ABORTED              VERSION_MISMATCH
    ├── StoreFull              RESOURCE_EXHAUSTED   STORE_FULL
    ├── Overloaded             RESOURCE_EXHAUSTED   TOO_MANY_REQUESTS | TOO_MANY_STREAMS
    ├── Draining               UNAVAILABLE          DRAINING
    ├── Unavailable            UNAVAILABLE          STORAGE_UNAVAILABLE
    │   └── OwnerMoving        UNAVAILABLE          OWNER_MOVING (metadata: shard)
    ├── DataLoss               DATA_LOSS            INTEGRITY
    └── Unimplemented          UNIMPLEMENTED        (no reason)
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from lethe._status import DOMAIN as DOMAIN  # defined once in lethe; re-exported to server
from lethe.errors.v1 import errors_pb2

Reason = errors_pb2.ErrorReason
"""The reasons, as the proto enum: ``Reason.SEALED``, ``Reason.RECORD_DELETED``, …"""
NO_REASON = Reason.ERROR_REASON_UNSPECIFIED


class LetheError(Exception):
    """An error a client may see, with its gRPC code and ErrorInfo reason.

    Args:
        message: Human-readable text; never content of a record.
        reason: A :data:`Reason` constant (default: the class's), or
            ``NO_REASON`` for none.

    Raises:
        ValueError: ``reason`` is not a value of ``ErrorReason``.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    default_reason: errors_pb2.ErrorReason.ValueType = NO_REASON

    def __init__(
        self, message: str, *, reason: errors_pb2.ErrorReason.ValueType | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = self.default_reason if reason is None else reason
        Reason.Name(self.reason)  # ValueError for a number outside the enum

    @property
    def reason_name(self) -> str:
        """The ErrorInfo reason string (the enum value's name), "" for none."""
        return "" if self.reason == NO_REASON else Reason.Name(self.reason)

    def details(self) -> list[any_pb2.Any]:
        """The ``google.rpc`` detail messages beyond ErrorInfo."""
        return []

    def info_metadata(self) -> dict[str, str]:
        """The ``ErrorInfo.metadata`` entries (ids and addresses only, never content)."""
        return {}


class Unauthenticated(LetheError):
    """The call has no bearer token (``MISSING_TOKEN``), or a malformed, unknown or repeated one."""

    code = grpc.StatusCode.UNAUTHENTICATED
    default_reason = Reason.INVALID_TOKEN


class PermissionDenied(LetheError):
    """The token may not act for the owner the request names."""

    code = grpc.StatusCode.PERMISSION_DENIED
    default_reason = Reason.OWNER_NOT_ALLOWED


class InvalidArgument(LetheError):
    """A request field is malformed; ``field`` is its path (``turns[3].text``)."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = Reason.BAD_FIELD

    def __init__(
        self,
        field: str,
        description: str,
        *,
        reason: errors_pb2.ErrorReason.ValueType | None = None,
    ) -> None:
        super().__init__(f"{field}: {description}", reason=reason)
        self.field = field
        self.description = description

    def details(self) -> list[any_pb2.Any]:
        """One ``google.rpc.BadRequest`` naming :attr:`field` and its description."""
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=self.field, description=self.description
                )
            ]
        )
        packed = any_pb2.Any()
        packed.Pack(bad)
        return [packed]


class NotFound(LetheError):
    """The named resource never existed (:class:`RecordDeleted`: it existed and is gone)."""

    code = grpc.StatusCode.NOT_FOUND
    default_reason = Reason.NOT_FOUND


class RecordDeleted(NotFound):
    """The record existed and was deleted or has expired (a tombstone)."""

    default_reason = Reason.RECORD_DELETED


class FailedPrecondition(LetheError):
    """A lifecycle rule refuses the call; ``subject`` names the offending record."""

    code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(
        self, message: str, *, reason: errors_pb2.ErrorReason.ValueType, subject: str = ""
    ) -> None:
        super().__init__(message, reason=reason)
        self.subject = subject

    def details(self) -> list[any_pb2.Any]:
        """One ``google.rpc.PreconditionFailure`` naming :attr:`subject`; none without one."""
        if not self.subject:
            return []
        failure = error_details_pb2.PreconditionFailure(
            violations=[
                error_details_pb2.PreconditionFailure.Violation(
                    type=self.reason_name, subject=self.subject, description=self.message
                )
            ]
        )
        packed = any_pb2.Any()
        packed.Pack(failure)
        return [packed]


class OwnerMoved(FailedPrecondition):
    """This shard no longer holds the owner: it moved to ``shard`` (at ``target``).

    Args:
        owner: the owner's id.
        shard: the destination shard's name.
        target: its ``HOST:PORT``, or "" when not recorded.
    """

    def __init__(self, owner: str, shard: str, target: str = "") -> None:
        where = f"shard {shard}" + (f" ({target})" if target else "")
        super().__init__(
            f"owners/{owner} moved to {where}; route it there",
            reason=Reason.OWNER_MOVED,
            subject=f"owners/{owner}",
        )
        self.owner = owner
        self.shard = shard
        self.target = target

    def info_metadata(self) -> dict[str, str]:
        """``owner``, ``shard`` and, when recorded, ``target``."""
        meta = {"owner": self.owner, "shard": self.shard}
        if self.target:
            meta["target"] = self.target
        return meta


class AlreadyExists(LetheError):
    """The id is taken (``ALREADY_EXISTS``), or a slot already holds an active memory."""

    code = grpc.StatusCode.ALREADY_EXISTS
    default_reason = Reason.ALREADY_EXISTS


class Aborted(LetheError):
    """A version check failed: ``expected_version`` is stale, or records changed meanwhile."""

    code = grpc.StatusCode.ABORTED
    default_reason = Reason.VERSION_MISMATCH


class StoreFull(LetheError):
    """The store has reached ``--max-store-size``; the write is refused whole."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_reason = Reason.STORE_FULL


class Overloaded(LetheError):
    """A bound on calls in flight or open streams is reached: refused at once.

    Args:
        message: which bound (never whose data).
        reason: ``TOO_MANY_REQUESTS`` (calls) or ``TOO_MANY_STREAMS`` (streams).
        retry_after: seconds a client should wait before retrying, sent as a
            ``google.rpc.RetryInfo`` detail.
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_reason = Reason.TOO_MANY_REQUESTS

    def __init__(
        self,
        message: str,
        *,
        reason: errors_pb2.ErrorReason.ValueType | None = None,
        retry_after: float = 0.1,
    ) -> None:
        super().__init__(message, reason=reason)
        self.retry_after = retry_after

    def details(self) -> list[any_pb2.Any]:
        """One ``google.rpc.RetryInfo`` whose delay is :attr:`retry_after` seconds."""
        info = error_details_pb2.RetryInfo()
        info.retry_delay.FromNanoseconds(int(self.retry_after * 1e9))
        packed = any_pb2.Any()
        packed.Pack(info)
        return [packed]


class MalformedRequest(LetheError):
    """The request bytes do not decode as the method's request message."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = Reason.MALFORMED_REQUEST


class WrongOwnerHeader(LetheError):
    """The ``x-lethe-owner`` routing header is missing, malformed, repeated, or names another owner.

    Missing counts only when the header is required; another owner than the
    request's is a misrouted call.
    """

    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = Reason.OWNER_HEADER_MISMATCH


class Draining(LetheError):
    """The server is stopping: new calls are refused while running ones finish."""

    code = grpc.StatusCode.UNAVAILABLE
    default_reason = Reason.DRAINING


class Unavailable(LetheError):
    """A storage fault (full disk, I/O error) stopped a write; nothing was applied."""

    code = grpc.StatusCode.UNAVAILABLE
    default_reason = Reason.STORAGE_UNAVAILABLE


class OwnerMoving(Unavailable):
    """The owner is being moved between shards: retry; nothing was written.

    After the cut-over the proxy routes the owner to its new shard.

    Args:
        owner: the owner's id.
        shard: the other side of the move (the destination when raised by the
            source, the source when raised by the destination).
        writes_only: raised by the source, which still serves reads.
    """

    default_reason = Reason.OWNER_MOVING

    def __init__(self, owner: str, shard: str, *, writes_only: bool) -> None:
        what = "its writes are refused" if writes_only else "it is not served here yet"
        super().__init__(f"owners/{owner} is moving (shard {shard}): {what}; retry")
        self.owner = owner
        self.shard = shard

    def info_metadata(self) -> dict[str, str]:
        """``owner`` and ``shard`` (the other side of the move)."""
        return {"owner": self.owner, "shard": self.shard}


class DataLoss(LetheError):
    """Stored ciphertext fails authentication, or a key is missing that no deletion explains."""

    code = grpc.StatusCode.DATA_LOSS
    default_reason = Reason.INTEGRITY


class Unimplemented(LetheError):
    """The method is not implemented; carries no reason (no ``ErrorInfo``)."""

    code = grpc.StatusCode.UNIMPLEMENTED


def to_rpc_status(error: BaseException) -> status_pb2.Status:
    """Turn any exception into the ``google.rpc.Status`` a client receives.

    A ``LetheError`` keeps its code, message, ErrorInfo reason and details;
    anything else becomes ``INTERNAL`` with a fixed message, so internals
    (paths, keys, content) never leave the server.
    """
    if not isinstance(error, LetheError):
        return status_pb2.Status(code=code_pb2.INTERNAL, message="internal error")
    details: list[any_pb2.Any] = []
    if error.reason_name:
        info = any_pb2.Any()
        info.Pack(
            error_details_pb2.ErrorInfo(
                reason=error.reason_name, domain=DOMAIN, metadata=error.info_metadata()
            )
        )
        details.append(info)
    details.extend(error.details())
    return status_pb2.Status(code=error.code.value[0], message=error.message, details=details)
