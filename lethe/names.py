"""Resource names of the Lethe API (API.md, "Resource names"): the one grammar.

Every name the API accepts or returns is parsed here, by clients and by the
server alike (the server wraps :class:`InvalidName` into ``INVALID_ARGUMENT``
with the request field that held the name). No other module spells a name's
pattern.

==================  ================================================
resource            name
==================  ================================================
owner               ``owners/{owner}``
thread              ``owners/{owner}/threads/{thread}``
turn                ``owners/{owner}/threads/{thread}/turns/{seq}``
memory              ``owners/{owner}/memories/{memory}``
context manifest    ``owners/{owner}/manifests/{manifest}``
deletion receipt    ``owners/{owner}/deletions/{deletion}``
==================  ================================================

Routing: every call of the typed client carries the owner of its resource
names in the :data:`OWNER_HEADER` metadata (``x-lethe-owner: {owner}``), the
header a sharding proxy routes on (README, "Across machines"); the server
refuses a call whose header names another owner (``INVALID_ARGUMENT`` /
``OWNER_HEADER_MISMATCH``). :func:`owner_of` reads the owner of any name.

Ids match ``[a-z0-9][a-z0-9-]{0,62}`` (ASCII only); ``seq`` is a decimal
integer ≥ 1 below 2**62, without leading zeros. Ids are not secret and are
not encrypted: never put content in them.

This module imports nothing but the standard library.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

__all__ = [
    "ID_PATTERN",
    "ID_RE",
    "MAX_SEQ",
    "OWNER_HEADER",
    "DeletionName",
    "InvalidName",
    "ManifestName",
    "MemoryName",
    "OwnerName",
    "ThreadName",
    "TurnName",
    "check_id",
    "new_id",
    "owner_of",
    "parse_deletion",
    "parse_manifest",
    "parse_memory",
    "parse_owner",
    "parse_record",
    "parse_target",
    "parse_thread",
    "parse_turn",
]

ID_PATTERN = r"[a-z0-9][a-z0-9-]{0,62}"
ID_RE = re.compile(ID_PATTERN)
MAX_SEQ = 2**62
"""Exclusive upper bound of a turn's ``seq``."""

OWNER_HEADER = "x-lethe-owner"
"""The call metadata key that carries the owner of the request's resource names
(lowercase, as gRPC metadata keys are): what a sharding proxy routes on."""

_OWNER_PREFIX_RE = re.compile(rf"owners/({ID_PATTERN})(?:/|$)")
_SEQ_RE = re.compile(r"[1-9][0-9]{0,18}")  # ASCII only: str.isdigit() admits "²" and "٣"
_SEGMENT = r"([^/]+)"
_SHAPES = {
    "owner": re.compile(rf"owners/{_SEGMENT}"),
    "thread": re.compile(rf"owners/{_SEGMENT}/threads/{_SEGMENT}"),
    "turn": re.compile(rf"owners/{_SEGMENT}/threads/{_SEGMENT}/turns/{_SEGMENT}"),
    "memory": re.compile(rf"owners/{_SEGMENT}/memories/{_SEGMENT}"),
    "manifest": re.compile(rf"owners/{_SEGMENT}/manifests/{_SEGMENT}"),
    "deletion": re.compile(rf"owners/{_SEGMENT}/deletions/{_SEGMENT}"),
}
_EXPECTED = {
    "owner": "owners/{owner}",
    "thread": "owners/{owner}/threads/{thread}",
    "turn": "owners/{owner}/threads/{thread}/turns/{seq}",
    "memory": "owners/{owner}/memories/{memory}",
    "manifest": "owners/{owner}/manifests/{manifest}",
    "deletion": "owners/{owner}/deletions/{deletion}",
}


class InvalidName(ValueError):
    """A string is not the resource name (or id) that was expected.

    Attributes:
        description: what was expected, e.g. ``must be owners/{owner}``; fit
            for a ``BadRequest`` field violation (it never quotes the input).
    """

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


@dataclass(frozen=True, slots=True)
class OwnerName:
    """A parsed ``owners/{owner}``."""

    owner: str

    def __str__(self) -> str:
        return f"owners/{self.owner}"


@dataclass(frozen=True, slots=True)
class ThreadName:
    """A parsed ``owners/{owner}/threads/{thread}``."""

    owner: str
    thread: str

    def __str__(self) -> str:
        return f"owners/{self.owner}/threads/{self.thread}"


@dataclass(frozen=True, slots=True)
class TurnName:
    """A parsed ``owners/{owner}/threads/{thread}/turns/{seq}`` (``seq`` ≥ 1)."""

    owner: str
    thread: str
    seq: int

    def __str__(self) -> str:
        return f"owners/{self.owner}/threads/{self.thread}/turns/{self.seq}"

    @property
    def thread_name(self) -> ThreadName:
        """The name of the turn's thread."""
        return ThreadName(self.owner, self.thread)


@dataclass(frozen=True, slots=True)
class MemoryName:
    """A parsed ``owners/{owner}/memories/{memory}``."""

    owner: str
    memory: str

    def __str__(self) -> str:
        return f"owners/{self.owner}/memories/{self.memory}"


@dataclass(frozen=True, slots=True)
class ManifestName:
    """A parsed ``owners/{owner}/manifests/{manifest}``."""

    owner: str
    manifest: str

    def __str__(self) -> str:
        return f"owners/{self.owner}/manifests/{self.manifest}"


@dataclass(frozen=True, slots=True)
class DeletionName:
    """A parsed ``owners/{owner}/deletions/{deletion}`` (a deletion receipt)."""

    owner: str
    deletion: str

    def __str__(self) -> str:
        return f"owners/{self.owner}/deletions/{self.deletion}"


def new_id() -> str:
    """A fresh server-generated id: 16 lowercase hex characters (64 random bits)."""
    return secrets.token_hex(8)


def check_id(value: str) -> str:
    """Return ``value`` if it is a valid id.

    Raises:
        InvalidName: ``value`` does not match ``[a-z0-9][a-z0-9-]{0,62}``.
    """
    if not ID_RE.fullmatch(value):
        raise InvalidName(f"must match {ID_PATTERN}")
    return value


def owner_of(name: str) -> str | None:
    """The owner id at the head of a resource name of any kind, or None.

    ``name`` is ``owners/{owner}`` or ``owners/{owner}/...``; None when it does
    not start with one.

    Only the head is checked: a name that is malformed further on still has an
    owner to route on (the server then refuses it with ``BAD_FIELD``).
    """
    match = _OWNER_PREFIX_RE.match(name)
    return None if match is None else match.group(1)


def _groups(kind: str, value: str) -> tuple[str, ...]:
    m = _SHAPES[kind].fullmatch(value)
    if m is None:
        raise InvalidName(f"must be {_EXPECTED[kind]}")
    return m.groups()


def _seq(text: str) -> int:
    if not _SEQ_RE.fullmatch(text) or int(text) >= MAX_SEQ:
        raise InvalidName("seq must be a positive integer")
    return int(text)


def parse_owner(value: str) -> OwnerName:
    """Parse ``owners/{owner}``.

    Raises:
        InvalidName: not an owner name.
    """
    (owner,) = _groups("owner", value)
    return OwnerName(check_id(owner))


def parse_thread(value: str) -> ThreadName:
    """Parse ``owners/{owner}/threads/{thread}``.

    Raises:
        InvalidName: not a thread name.
    """
    owner, thread = _groups("thread", value)
    return ThreadName(check_id(owner), check_id(thread))


def parse_turn(value: str) -> TurnName:
    """Parse ``owners/{owner}/threads/{thread}/turns/{seq}`` with ``seq`` ≥ 1.

    Raises:
        InvalidName: not a turn name, or ``seq`` not a positive decimal integer.
    """
    owner, thread, seq = _groups("turn", value)
    return TurnName(check_id(owner), check_id(thread), _seq(seq))


def parse_memory(value: str) -> MemoryName:
    """Parse ``owners/{owner}/memories/{memory}``.

    Raises:
        InvalidName: not a memory name.
    """
    owner, memory = _groups("memory", value)
    return MemoryName(check_id(owner), check_id(memory))


def parse_manifest(value: str) -> ManifestName:
    """Parse ``owners/{owner}/manifests/{manifest}``.

    Raises:
        InvalidName: not a manifest name.
    """
    owner, manifest = _groups("manifest", value)
    return ManifestName(check_id(owner), check_id(manifest))


def parse_deletion(value: str) -> DeletionName:
    """Parse ``owners/{owner}/deletions/{deletion}``.

    Raises:
        InvalidName: not a deletion receipt name.
    """
    owner, deletion = _groups("deletion", value)
    return DeletionName(check_id(owner), check_id(deletion))


def parse_record(value: str) -> TurnName | MemoryName:
    """Parse a turn or a memory name (a source reference, a record to commit).

    Raises:
        InvalidName: neither.
    """
    if _SHAPES["turn"].fullmatch(value):
        return parse_turn(value)
    if _SHAPES["memory"].fullmatch(value):
        return parse_memory(value)
    raise InvalidName("must be a turn or memory name")


def parse_target(value: str) -> OwnerName | ThreadName | TurnName | MemoryName:
    """Parse an owner, thread, turn or memory name (what ``Forget`` accepts).

    Raises:
        InvalidName: none of those.
    """
    if _SHAPES["turn"].fullmatch(value):
        return parse_turn(value)
    if _SHAPES["thread"].fullmatch(value):
        return parse_thread(value)
    if _SHAPES["owner"].fullmatch(value):
        return parse_owner(value)
    if _SHAPES["memory"].fullmatch(value):
        return parse_memory(value)
    raise InvalidName("must be an owner, thread, turn or memory name")
