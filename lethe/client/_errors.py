"""The typed errors of the Lethe client: a class per gRPC status code and per reason.

Below the class of each status code, one class per ``ErrorReason`` the API
documents (API.md, "Errors").

A failed call raises the most specific class that fits both its code and the
``google.rpc.ErrorInfo`` reason (domain ``lethe``) the server attached, so
callers write ``except lethe.client.RecordDeleted`` instead of comparing codes
and decoding ``grpc-status-details-bin`` themselves. A reason that arrives
with an unexpected code, or that this client does not know yet, raises the
class of the code; :attr:`LetheError.reason_name` still holds the string.

Every :class:`LetheError` is also a ``grpc.RpcError`` answering ``code()``,
``details()`` and ``trailing_metadata()`` as the failed call did, so code
written against the raw stubs (``except grpc.RpcError as err: err.code()``)
keeps working.

Exception tree (code; reason)::

    grpc.RpcError
    └── LetheError
        ├── Cancelled               CANCELLED
        ├── Unknown                 UNKNOWN
        ├── InvalidArgument         INVALID_ARGUMENT
        │   ├── BadField                BAD_FIELD (field_violations name the fields)
        │   ├── DimensionMismatch       DIMENSION_MISMATCH
        │   ├── MalformedRequest        MALFORMED_REQUEST (the bytes did not decode)
        │   ├── OwnerHeaderMismatch     OWNER_HEADER_MISMATCH (x-lethe-owner disagrees)
        │   └── OwnerHeaderMissing      OWNER_HEADER_MISSING (a sharded server needs it)
        ├── DeadlineExceeded        DEADLINE_EXCEEDED
        ├── NotFound                NOT_FOUND; NOT_FOUND (never existed)
        │   └── RecordDeleted           RECORD_DELETED (deleted or expired)
        ├── AlreadyExists           ALREADY_EXISTS; ALREADY_EXISTS (id taken)
        │   └── SlotConflict            SLOT_CONFLICT (subject names the holder)
        ├── PermissionDenied        PERMISSION_DENIED
        │   └── OwnerNotAllowed         OWNER_NOT_ALLOWED
        ├── ResourceExhausted       RESOURCE_EXHAUSTED
        │   ├── StoreFull               STORE_FULL
        │   ├── TooManyRequests         TOO_MANY_REQUESTS (retry_delay: RetryInfo)
        │   └── TooManyStreams          TOO_MANY_STREAMS
        ├── FailedPrecondition      FAILED_PRECONDITION (subject names the record)
        │   ├── SourceDeleted           SOURCE_DELETED
        │   ├── SourceStale             SOURCE_STALE
        │   ├── SourceSealed            SOURCE_SEALED
        │   ├── SourcePending           SOURCE_PENDING
        │   ├── IllegalTransition       ILLEGAL_TRANSITION
        │   ├── RepairNotContinued      REPAIR_NOT_CONTINUED
        │   ├── Restricted              RESTRICTED
        │   ├── Sealed                  SEALED
        │   ├── EchoesForgotten         ECHOES_FORGOTTEN (the text repeats a forgotten one)
        │   └── OwnerMoved              OWNER_MOVED (shard, target: where it went)
        ├── Aborted                 ABORTED
        │   └── VersionMismatch         VERSION_MISMATCH
        ├── OutOfRange              OUT_OF_RANGE
        ├── Unimplemented           UNIMPLEMENTED
        ├── Internal                INTERNAL
        ├── Unavailable             UNAVAILABLE
        │   ├── StorageUnavailable      STORAGE_UNAVAILABLE (the server's disk failed)
        │   ├── Draining                DRAINING (the server is stopping)
        │   ├── ShardUnavailable        SHARD_UNAVAILABLE (the proxy cannot reach the owner's shard)
        │   └── OwnerMoving             OWNER_MOVING (the owner is being moved; retry)
        ├── DataLoss                DATA_LOSS
        │   └── Integrity               INTEGRITY (ciphertext fails authentication)
        └── Unauthenticated         UNAUTHENTICATED
            ├── MissingToken            MISSING_TOKEN
            └── InvalidToken            INVALID_TOKEN

The reasons are the proto enum ``ErrorReason`` (:data:`ErrorReason`); the one
import of its generated module is :data:`_REASONS` below, so moving the enum to
another proto package changes one line.

The details are decoded by :func:`lethe._status.status_details`, the one
decoder (``lethe._rpc`` reads raw stub errors with it too), and :data:`DOMAIN`
is defined there. Imports only grpc, protobuf, googleapis-common-protos,
:mod:`lethe._status` and ``lethe.errors.v1``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple

import grpc
from google.rpc import error_details_pb2

from lethe._status import DOMAIN, status_details
from lethe.errors.v1 import errors_pb2 as _REASONS  # noqa: N812 (the one place the enum is imported)

__all__ = [
    "DOMAIN",
    "Aborted",
    "AlreadyExists",
    "BadField",
    "Cancelled",
    "DataLoss",
    "DeadlineExceeded",
    "DimensionMismatch",
    "Draining",
    "EchoesForgotten",
    "ErrorReason",
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
    "Sealed",
    "ShardUnavailable",
    "SlotConflict",
    "SourceDeleted",
    "SourcePending",
    "SourceSealed",
    "SourceStale",
    "StorageUnavailable",
    "StoreFull",
    "TooManyRequests",
    "TooManyStreams",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "VersionMismatch",
    "error_from_rpc",
]

ErrorReason = _REASONS.ErrorReason
"""The proto enum of reasons: ``ErrorReason.RECORD_DELETED``, ``ErrorReason.Name(v)``, …"""

Metadata = tuple[tuple[str, str | bytes], ...]


class FieldViolation(NamedTuple):
    """One ``google.rpc.BadRequest.FieldViolation``.

    Attributes:
        field: the field path (``turns[0].text``).
        description: what is wrong with it.
    """

    field: str
    description: str


class LetheError(grpc.RpcError):
    """A failed call to Lethe, with its decoded ``google.rpc.Status`` details.

    Attributes:
        message: the status message (human-readable; never compare it).
        reason: the ``ErrorReason`` value, ``ERROR_REASON_UNSPECIFIED`` (0)
            when the server attached none or one this client does not know.
        reason_name: the ``ErrorInfo`` reason string as sent ("" for none).
        field_violations: the ``BadRequest`` violations, in the server's order.
        subject: the record a ``PreconditionFailure`` or ``ResourceInfo``
            detail names ("" for none), e.g. the deleted source or the slot holder.
        retry_delay: seconds a ``google.rpc.RetryInfo`` detail asks the client
            to wait before retrying (refusals under load), or None.
        info_metadata: the ``ErrorInfo.metadata`` of the reason (ids and
            addresses, e.g. ``shard`` and ``target`` of ``OWNER_MOVED``); empty
            for none.
    """

    status_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN
    """The gRPC code this class stands for."""
    reason_value: ClassVar[int] = 0
    """The ``ErrorReason`` this class stands for (0: any reason of its code)."""

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        reason_name: str = "",
        field_violations: Iterable[FieldViolation] = (),
        subject: str = "",
        trailing_metadata: Metadata = (),
        retry_delay: float | None = None,
        info_metadata: dict[str, str] | None = None,
    ) -> None:
        """Build an error; :func:`error_from_rpc` builds the right class from a call.

        Args:
            message: the status message.
            code: the gRPC code (default: the class's).
            reason_name: the ``ErrorInfo`` reason string ("" for none).
            field_violations: the ``BadRequest`` violations.
            subject: the record the error names, or "".
            trailing_metadata: the call's trailing metadata, kept for
                ``trailing_metadata()``.
            retry_delay: the ``RetryInfo`` delay in seconds, or None.
            info_metadata: the ``ErrorInfo.metadata`` entries.
        """
        super().__init__(message)
        self.message = message
        self._code = code or self.status_code
        self.reason_name = reason_name
        known = reason_name in ErrorReason.DESCRIPTOR.values_by_name
        self.reason: _REASONS.ErrorReason.ValueType = (
            ErrorReason.Value(reason_name) if known else ErrorReason.ERROR_REASON_UNSPECIFIED
        )
        self.field_violations = list(field_violations)
        self.subject = subject
        self.retry_delay = retry_delay
        self.info_metadata = dict(info_metadata or {})
        self._trailing = tuple(trailing_metadata)

    @property
    def fields(self) -> list[str]:
        """The field paths of :attr:`field_violations`, in order."""
        return [v.field for v in self.field_violations]

    def code(self) -> grpc.StatusCode:
        """The gRPC status code of the failed call (as ``grpc.Call.code()``)."""
        return self._code

    def details(self) -> str:
        """The status message (as ``grpc.Call.details()``)."""
        return self.message

    def trailing_metadata(self) -> tuple[Any, ...]:
        """The call's trailing metadata, ``grpc-status-details-bin`` included."""
        return self._trailing

    def __str__(self) -> str:
        head = self._code.name + (f"/{self.reason_name}" if self.reason_name else "")
        return f"{head}: {self.message}" if self.message else head

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild,
            (
                type(self),
                self.message,
                self._code.name,
                self.reason_name,
                self.field_violations,
                self.subject,
                self.retry_delay,
                self.info_metadata,
            ),
        )


def _rebuild(
    cls: type[LetheError],
    message: str,
    code: str,
    reason_name: str,
    violations: list[FieldViolation],
    subject: str,
    retry_delay: float | None = None,
    info_metadata: dict[str, str] | None = None,
) -> LetheError:
    return cls(
        message,
        code=grpc.StatusCode[code],
        reason_name=reason_name,
        field_violations=violations,
        subject=subject,
        retry_delay=retry_delay,
        info_metadata=info_metadata,
    )


# -- one class per status code ------------------------------------------------------


class Cancelled(LetheError):
    """The call was cancelled (usually by the caller)."""

    status_code = grpc.StatusCode.CANCELLED


class Unknown(LetheError):
    """An error gRPC could not classify."""

    status_code = grpc.StatusCode.UNKNOWN


class InvalidArgument(LetheError):
    """The request is malformed; :attr:`field_violations` name the fields."""

    status_code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(LetheError):
    """The deadline passed before the server answered."""

    status_code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(LetheError):
    """The named record never existed (reason ``NOT_FOUND``)."""

    status_code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(LetheError):
    """The id is taken (reason ``ALREADY_EXISTS``)."""

    status_code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(LetheError):
    """The token may not act for the owner named in the request."""

    status_code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(LetheError):
    """A bound on calls or streams was reached (retryable), or the store is full."""

    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(LetheError):
    """A lifecycle rule refuses the call; :attr:`subject` names the record."""

    status_code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(LetheError):
    """A concurrent change won (optimistic concurrency)."""

    status_code = grpc.StatusCode.ABORTED


class OutOfRange(LetheError):
    status_code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(LetheError):
    """The server does not serve this method."""

    status_code = grpc.StatusCode.UNIMPLEMENTED


class Internal(LetheError):
    """The server failed; its message carries no internals."""

    status_code = grpc.StatusCode.INTERNAL


class Unavailable(LetheError):
    """The server could not be reached (retryable)."""

    status_code = grpc.StatusCode.UNAVAILABLE


class DataLoss(LetheError):
    status_code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(LetheError):
    """No bearer token, or one the server does not know."""

    status_code = grpc.StatusCode.UNAUTHENTICATED


# -- one class per documented reason ------------------------------------------------


class MissingToken(Unauthenticated):
    reason_value = ErrorReason.MISSING_TOKEN


class InvalidToken(Unauthenticated):
    reason_value = ErrorReason.INVALID_TOKEN


class OwnerNotAllowed(PermissionDenied):
    reason_value = ErrorReason.OWNER_NOT_ALLOWED


class BadField(InvalidArgument):
    """A malformed field; :attr:`field_violations` name it."""

    reason_value = ErrorReason.BAD_FIELD


class DimensionMismatch(InvalidArgument):
    """A vector's dimension differs from the owner's index (or the embedder's)."""

    reason_value = ErrorReason.DIMENSION_MISMATCH


class RecordDeleted(NotFound):
    """The record existed and was deleted, or expired: a tombstone remains."""

    reason_value = ErrorReason.RECORD_DELETED


class MalformedRequest(InvalidArgument):
    """The request bytes did not decode as the method's request message.

    A client bug, or bytes not meant for this method.
    """

    reason_value = ErrorReason.MALFORMED_REQUEST


class SlotConflict(AlreadyExists):
    """A second active fact on a slot and scope; :attr:`subject` names the holder."""

    reason_value = ErrorReason.SLOT_CONFLICT


class StoreFull(ResourceExhausted):
    """The store cannot grow (not retryable)."""

    reason_value = ErrorReason.STORE_FULL


class TooManyRequests(ResourceExhausted):
    """A bound on calls in flight (the server's or the token's) was reached.

    The call was refused at once, nothing of it ran. Retry after :attr:`retry_delay`.
    """

    reason_value = ErrorReason.TOO_MANY_REQUESTS


class TooManyStreams(ResourceExhausted):
    """A bound on open ``Watch`` streams (the server's or the token's) was reached."""

    reason_value = ErrorReason.TOO_MANY_STREAMS


class SourceDeleted(FailedPrecondition):
    reason_value = ErrorReason.SOURCE_DELETED


class SourceStale(FailedPrecondition):
    reason_value = ErrorReason.SOURCE_STALE


class SourceSealed(FailedPrecondition):
    reason_value = ErrorReason.SOURCE_SEALED


class SourcePending(FailedPrecondition):
    reason_value = ErrorReason.SOURCE_PENDING


class IllegalTransition(FailedPrecondition):
    reason_value = ErrorReason.ILLEGAL_TRANSITION


class RepairNotContinued(FailedPrecondition):
    reason_value = ErrorReason.REPAIR_NOT_CONTINUED


class Restricted(FailedPrecondition):
    reason_value = ErrorReason.RESTRICTED


class Sealed(FailedPrecondition):
    """The record is sealed in a repair; only ``ReopenRepair`` reads it."""

    reason_value = ErrorReason.SEALED


class EchoesForgotten(FailedPrecondition):
    """The write's text echoes a text forgotten within an echo guard's window; nothing written.

    ``subject`` names the offending field (``turns[i].text``, ``memory.text``)
    or, for a commit, the record. Rebuild it from what is still remembered.
    """

    reason_value = ErrorReason.ECHOES_FORGOTTEN


class VersionMismatch(Aborted):
    """``expected_version`` is not the current version (the etag failed)."""

    reason_value = ErrorReason.VERSION_MISMATCH


class StorageUnavailable(Unavailable):
    """The server's disk refused a write (EIO, ENOSPC).

    Nothing of the call was applied; reads keep working. Retrying helps only
    once an operator has freed or repaired the disk.
    """

    reason_value = ErrorReason.STORAGE_UNAVAILABLE


class Draining(Unavailable):
    """The server is stopping: new calls are refused while running ones finish.

    Retry on this server once it is back, or on another (streams: resume with
    ``after``).
    """

    reason_value = ErrorReason.DRAINING


class OwnerHeaderMismatch(InvalidArgument):
    """The call's ``x-lethe-owner`` header names another owner than its resource names.

    Or it is malformed or repeated: a misrouted call, refused before anything
    was read or written.
    """

    reason_value = ErrorReason.OWNER_HEADER_MISMATCH


class OwnerHeaderMissing(InvalidArgument):
    """The call has no ``x-lethe-owner`` header and the server is a shard.

    A shard runs with ``--require-owner-header``; the typed clients always
    send the header.
    """

    reason_value = ErrorReason.OWNER_HEADER_MISSING


class OwnerMoved(FailedPrecondition):
    """The server no longer holds the owner: it moved to another shard.

    Attributes:
        shard: the destination shard's name ("" if the server sent none).
        target: its ``HOST:PORT`` ("" when not recorded).
    """

    reason_value = ErrorReason.OWNER_MOVED

    @property
    def shard(self) -> str:
        return self.info_metadata.get("shard", "")

    @property
    def target(self) -> str:
        return self.info_metadata.get("target", "")


class ShardUnavailable(Unavailable):
    """The sharding proxy cannot reach the server that holds the owner.

    The call was not sent elsewhere; other owners' calls are unaffected.
    ``target`` names the unreachable shard's ``HOST:PORT``.
    """

    reason_value = ErrorReason.SHARD_UNAVAILABLE

    @property
    def target(self) -> str:
        return self.info_metadata.get("target", "")


class OwnerMoving(Unavailable):
    """The owner is being moved between shards (``lethe owner export`` … ``release``).

    Nothing was written; retry with backoff, and after the cut-over the proxy
    routes the owner to its new shard. ``shard`` names the other side of the
    move.
    """

    reason_value = ErrorReason.OWNER_MOVING

    @property
    def shard(self) -> str:
        return self.info_metadata.get("shard", "")


class Integrity(DataLoss):
    """Stored ciphertext fails authentication while its key exists."""

    reason_value = ErrorReason.INTEGRITY


_BY_CODE: dict[grpc.StatusCode, type[LetheError]] = {
    cls.status_code: cls
    for cls in (
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    )
}
_BY_REASON: dict[str, type[LetheError]] = {
    ErrorReason.Name(cls.reason_value): cls
    for cls in (
        MissingToken,
        InvalidToken,
        OwnerNotAllowed,
        BadField,
        DimensionMismatch,
        RecordDeleted,
        SlotConflict,
        StoreFull,
        StorageUnavailable,
        MalformedRequest,
        TooManyRequests,
        TooManyStreams,
        Draining,
        SourceDeleted,
        SourceStale,
        SourceSealed,
        SourcePending,
        IllegalTransition,
        RepairNotContinued,
        Restricted,
        Sealed,
        EchoesForgotten,
        VersionMismatch,
        Integrity,
        OwnerHeaderMismatch,
        OwnerHeaderMissing,
        OwnerMoved,
        ShardUnavailable,
        OwnerMoving,
    )
}


def _error_class(code: grpc.StatusCode, reason_name: str) -> type[LetheError]:
    by_code = _BY_CODE.get(code, Unknown)
    by_reason = _BY_REASON.get(reason_name)
    if by_reason is not None and by_reason.status_code == code:
        return by_reason
    return by_code


def error_from_rpc(err: grpc.RpcError) -> LetheError:
    """The typed error for a failed call (sync ``grpc.RpcError`` or ``grpc.aio.AioRpcError``).

    Args:
        err: the error a stub raised; it must be a ``grpc.Call`` (have
            ``code()``, ``details()`` and ``trailing_metadata()``), as every
            error a gRPC stub raises is.

    Returns:
        An instance of the most specific class for the call's code and its
        ``ErrorInfo`` reason of domain ``lethe``; ``err`` itself when it
        already is a :class:`LetheError`.
    """
    if isinstance(err, LetheError):
        return err
    call: Any = err
    code = call.code() if callable(getattr(call, "code", None)) else grpc.StatusCode.UNKNOWN
    message = call.details() if callable(getattr(call, "details", None)) else str(err)
    raw = call.trailing_metadata() if callable(getattr(call, "trailing_metadata", None)) else ()
    trailing = tuple((str(k), v) for k, v in (raw or ()))
    reason = ""
    violations: list[FieldViolation] = []
    subject = ""
    retry_delay: float | None = None
    info_metadata: dict[str, str] = {}
    for detail in status_details(trailing):
        if isinstance(detail, error_details_pb2.ErrorInfo):
            if detail.domain == DOMAIN and not reason:
                reason = str(detail.reason)
                info_metadata = {str(k): str(v) for k, v in detail.metadata.items()}
        elif isinstance(detail, error_details_pb2.BadRequest):
            violations.extend(
                FieldViolation(str(v.field), str(v.description)) for v in detail.field_violations
            )
        elif isinstance(detail, error_details_pb2.PreconditionFailure):
            if detail.violations and not subject:
                subject = str(detail.violations[0].subject)
        elif isinstance(detail, error_details_pb2.ResourceInfo):
            subject = subject or str(detail.resource_name)
        elif isinstance(detail, error_details_pb2.RetryInfo):
            retry_delay = detail.retry_delay.ToNanoseconds() / 1e9
    cls = _error_class(code, reason)
    return cls(
        message or "",
        code=code,
        reason_name=reason,
        field_violations=violations,
        subject=subject,
        trailing_metadata=trailing,
        retry_delay=retry_delay,
        info_metadata=info_metadata,
    )
