"""The error details of a failed Lethe call: the one decoder, and the ``ErrorInfo`` domain.

Every error the Lethe server raises carries a ``google.rpc.Status`` in the
call's trailing metadata under ``grpc-status-details-bin`` (API.md,
"Errors"): a ``google.rpc.ErrorInfo`` of domain :data:`DOMAIN` whose reason is
a value name of ``lethe.errors.v1.ErrorReason`` (``RECORD_DELETED``), and, as
the error calls for them, a ``BadRequest`` (the malformed fields), a
``PreconditionFailure`` or ``ResourceInfo`` (the record it names) and a
``RetryInfo`` (how long to wait under load).

:func:`status_details` is the one place those bytes are decoded:
:func:`lethe.client.error_from_rpc` builds its typed errors from it, and
:mod:`lethe._rpc` (``reason_of``, ``error_info``, ``bad_fields``) reads raw
stub errors with it. The server names its domain with :data:`DOMAIN` from
here, so client and server cannot disagree on it.

Imports only protobuf and googleapis-common-protos.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

__all__ = ["DETAIL_TYPES", "DOMAIN", "STATUS_DETAILS_KEY", "status_details"]

DOMAIN = "lethe"
"""The ``ErrorInfo.domain`` of every reason the Lethe server attaches."""

STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""The trailing metadata key that holds the serialised ``google.rpc.Status``."""

DETAIL_TYPES: tuple[type[Message], ...] = (
    error_details_pb2.ErrorInfo,
    error_details_pb2.BadRequest,
    error_details_pb2.PreconditionFailure,
    error_details_pb2.ResourceInfo,
    error_details_pb2.RetryInfo,
)
"""The ``google.rpc`` detail messages Lethe attaches, which :func:`status_details` unpacks."""


def _status(trailing_metadata: Iterable[tuple[str, Any]]) -> status_pb2.Status | None:
    """The first ``google.rpc.Status`` in the metadata; None when absent or malformed."""
    for key, value in trailing_metadata:
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status()
            try:
                status.ParseFromString(value)
            except Exception:  # a malformed detail is no detail
                return None
            return status
    return None


def status_details(trailing_metadata: Iterable[tuple[str, Any]] | None) -> list[Message]:
    """The details of the ``google.rpc.Status`` in a failed call's trailing metadata.

    Args:
        trailing_metadata: the call's trailing metadata as ``(key, value)``
            pairs (what ``grpc.Call.trailing_metadata()`` returns), or None.

    Returns:
        Each detail whose type is one of :data:`DETAIL_TYPES`, unpacked, in
        the order the server attached them; details of other types are
        skipped. [] when the metadata holds no ``grpc-status-details-bin``
        entry, or one that does not parse.
    """
    status = _status(trailing_metadata or ())
    if status is None:
        return []
    out: list[Message] = []
    for detail in status.details:
        for cls in DETAIL_TYPES:
            if detail.Is(cls.DESCRIPTOR):
                message = cls()
                detail.Unpack(message)
                out.append(message)
                break
    return out
