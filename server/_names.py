"""Request fields that hold resource names, parsed by :mod:`lethe.names` (the one grammar).

Its :class:`~lethe.names.InvalidName` is turned into ``INVALID_ARGUMENT``
naming the request field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lethe import names
from lethe.names import (
    ID_RE,
    ManifestName,
    MemoryName,
    OwnerName,
    ThreadName,
    TurnName,
    new_id,
)
from server.errors import InvalidArgument

__all__ = [
    "ID_RE",
    "ManifestName",
    "MemoryName",
    "OwnerName",
    "ThreadName",
    "TurnName",
    "check_id",
    "new_id",
    "parse_manifest",
    "parse_memory",
    "parse_owner",
    "parse_record",
    "parse_target",
    "parse_thread",
    "parse_turn",
]

_T = TypeVar("_T")


def _field(parse: Callable[[str], _T], value: str, field: str) -> _T:
    try:
        return parse(value)
    except names.InvalidName as exc:
        raise InvalidArgument(field, exc.description) from None


def check_id(value: str, field: str) -> str:
    """Raises: InvalidArgument: ``value`` is not an id."""
    return _field(names.check_id, value, field)


def parse_owner(value: str, field: str) -> str:
    """The owner id of ``owners/{owner}``. Raises: InvalidArgument."""
    return _field(names.parse_owner, value, field).owner


def parse_thread(value: str, field: str) -> ThreadName:
    """Raises: InvalidArgument: not a thread name."""
    return _field(names.parse_thread, value, field)


def parse_turn(value: str, field: str) -> TurnName:
    """Raises: InvalidArgument: not a turn name, or seq not a positive integer."""
    return _field(names.parse_turn, value, field)


def parse_memory(value: str, field: str) -> MemoryName:
    """Raises: InvalidArgument: not a memory name."""
    return _field(names.parse_memory, value, field)


def parse_manifest(value: str, field: str) -> ManifestName:
    """Raises: InvalidArgument: not a manifest name."""
    return _field(names.parse_manifest, value, field)


def parse_record(value: str, field: str) -> TurnName | MemoryName:
    """A turn or memory name. Raises: InvalidArgument: neither."""
    return _field(names.parse_record, value, field)


def parse_target(value: str, field: str) -> OwnerName | ThreadName | TurnName | MemoryName:
    """What ``Forget`` accepts. Raises: InvalidArgument: none of those."""
    return _field(names.parse_target, value, field)
