"""Resource names and ids (API.md, "Resource names").

Ids are ``[a-z0-9][a-z0-9-]{0,62}``; they are not secret and not encrypted.
Every parser raises :class:`server.errors.InvalidArgument` naming the field.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from server.errors import InvalidArgument

ID_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_OWNER_RE = re.compile(r"owners/([^/]+)")
_THREAD_RE = re.compile(r"owners/([^/]+)/threads/([^/]+)")
_TURN_RE = re.compile(r"owners/([^/]+)/threads/([^/]+)/turns/([^/]+)")
_MEMORY_RE = re.compile(r"owners/([^/]+)/memories/([^/]+)")
_SEQ_RE = re.compile(r"[1-9][0-9]{0,18}")  # ASCII only: str.isdigit() admits "²" and "٣"
MAX_SEQ = 2**62


def new_id() -> str:
    """A fresh server-generated id: 16 lowercase hex characters (64 random bits)."""
    return secrets.token_hex(8)


def check_id(value: str, field: str) -> str:
    """Return ``value`` if it is a valid id.

    Raises:
        InvalidArgument: ``value`` does not match ``[a-z0-9][a-z0-9-]{0,62}``.
    """
    if not ID_RE.fullmatch(value):
        raise InvalidArgument(field, "must match [a-z0-9][a-z0-9-]{0,62}")
    return value


@dataclass(frozen=True, slots=True)
class ThreadName:
    owner: str
    thread: str

    def __str__(self) -> str:
        return f"owners/{self.owner}/threads/{self.thread}"


@dataclass(frozen=True, slots=True)
class TurnName:
    owner: str
    thread: str
    seq: int

    def __str__(self) -> str:
        return f"owners/{self.owner}/threads/{self.thread}/turns/{self.seq}"

    @property
    def thread_name(self) -> ThreadName:
        return ThreadName(self.owner, self.thread)


@dataclass(frozen=True, slots=True)
class MemoryName:
    owner: str
    memory: str

    def __str__(self) -> str:
        return f"owners/{self.owner}/memories/{self.memory}"


def parse_memory(value: str, field: str) -> MemoryName:
    """Parse ``owners/{o}/memories/{m}``.

    Raises:
        InvalidArgument: not a memory name.
    """
    m = _MEMORY_RE.fullmatch(value)
    if m is None:
        raise InvalidArgument(field, "must be owners/{owner}/memories/{memory}")
    return MemoryName(check_id(m.group(1), field), check_id(m.group(2), field))


def owner_name(owner: str) -> str:
    return f"owners/{owner}"


def parse_owner(value: str, field: str) -> str:
    """Parse ``owners/{owner}`` and return the owner id.

    Raises:
        InvalidArgument: not an owner name.
    """
    m = _OWNER_RE.fullmatch(value)
    if m is None:
        raise InvalidArgument(field, "must be owners/{owner}")
    return check_id(m.group(1), field)


def parse_thread(value: str, field: str) -> ThreadName:
    """Parse ``owners/{o}/threads/{t}``.

    Raises:
        InvalidArgument: not a thread name.
    """
    m = _THREAD_RE.fullmatch(value)
    if m is None:
        raise InvalidArgument(field, "must be owners/{owner}/threads/{thread}")
    return ThreadName(check_id(m.group(1), field), check_id(m.group(2), field))


def parse_turn(value: str, field: str) -> TurnName:
    """Parse ``owners/{o}/threads/{t}/turns/{seq}`` with ``seq`` ≥ 1.

    Raises:
        InvalidArgument: not a turn name, or seq not a positive decimal integer.
    """
    m = _TURN_RE.fullmatch(value)
    if m is None:
        raise InvalidArgument(field, "must be owners/{owner}/threads/{thread}/turns/{seq}")
    seq_text = m.group(3)
    if not _SEQ_RE.fullmatch(seq_text) or int(seq_text) >= MAX_SEQ:
        raise InvalidArgument(field, "seq must be a positive integer")
    return TurnName(check_id(m.group(1), field), check_id(m.group(2), field), int(seq_text))


def parse_any(value: str, field: str) -> str | ThreadName | TurnName | MemoryName:
    """Parse an owner, thread, turn or memory name (what Forget accepts).

    Returns:
        The owner id (str), a ThreadName, a TurnName or a MemoryName.

    Raises:
        InvalidArgument: none of those.
    """
    if _TURN_RE.fullmatch(value):
        return parse_turn(value, field)
    if _THREAD_RE.fullmatch(value):
        return parse_thread(value, field)
    if _OWNER_RE.fullmatch(value):
        return parse_owner(value, field)
    if _MEMORY_RE.fullmatch(value):
        return parse_memory(value, field)
    raise InvalidArgument(field, "must be an owner, thread, turn or memory name")
