"""The routing header of every call: ``x-lethe-owner`` from the request's names.

A sharded deployment routes each call to the server that holds its owner on
the :data:`lethe.names.OWNER_HEADER` metadata (README, "Across machines"), so
the typed clients send it on every call, with the owner read from the
request's resource names — the same owner the server authorises, so a call
can never be routed by one owner and act on another (the server refuses a
disagreeing header with ``OWNER_HEADER_MISMATCH``).

Where the owner is read, first match wins: ``parent``, ``name``, ``thread``,
``memory.name`` (``UpdateMemory``), ``names[0]`` (``Commit``,
``ExtendPending``, ``Forget``), ``range.thread`` (``Forget`` of a range). A
request naming no owner (a malformed name) is sent without the header; the
server refuses it for its name anyway.

Imports only protobuf and :mod:`lethe.names`.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from lethe.names import OWNER_HEADER, owner_of

_NAME_FIELDS = ("parent", "name", "thread")


def _has(request: Message, field: str) -> bool:
    return field in request.DESCRIPTOR.fields_by_name


def request_owner(request: Message) -> str | None:
    """The owner id the request's resource names start with.

    The fields are read in the order the module docstring gives; None when no
    field names an owner.
    """
    for field in _NAME_FIELDS:
        if _has(request, field):
            value: Any = getattr(request, field)
            if isinstance(value, str) and value:
                return owner_of(value)
    if _has(request, "memory") and request.HasField("memory"):
        value = getattr(request, "memory").name  # noqa: B009 (not every request has it)
        if value:
            return owner_of(value)
    if _has(request, "names"):
        names: Any = getattr(request, "names")  # noqa: B009
        if names:
            return owner_of(str(names[0]))
    if _has(request, "range") and request.HasField("range"):
        value = getattr(request, "range").thread  # noqa: B009
        if value:
            return owner_of(value)
    return None


def routed(metadata: tuple[tuple[str, str], ...], request: Message) -> tuple[tuple[str, str], ...]:
    """``metadata`` plus ``x-lethe-owner: {owner}`` for ``request``.

    Unchanged when the request names no owner.
    """
    owner = request_owner(request)
    return metadata if owner is None else (*metadata, (OWNER_HEADER, owner))
