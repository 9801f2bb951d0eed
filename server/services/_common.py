"""Request limits and the validation helpers every handler uses.

A handler raises domain errors (:mod:`server.errors`); the call pipeline
(:mod:`server.edge._edge`) is the one boundary where an exception becomes a
``google.rpc.Status`` (STYLE.md, "Exceptions inside, status at the edge").
Limits (API.md, "Views and sizes"): at most 1000 turns per append and 1000
names per call, texts at most 64 KiB of UTF-8, page size default 100 and at
most 1000, ``top_k`` 1..1000 (0 means 10).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import Message

from lethe.v1 import common_pb2, memories_pb2
from server._names import parse_owner, parse_target
from server.edge import authorize
from server.errors import InvalidArgument
from server.services._convert import STATE_NAMES
from server.services._pages import PageTokens
from server.store import COMMITTED, PENDING

STEP_TURNS = 32
"""Turns embedded (and tagged) between two step boundaries of an append
(:mod:`server._steps`): some 10-30 ms of work for 16 KiB turns on this
project's machine."""

MAX_TEXT_BYTES = 64 * 1024
MAX_SPEAKER_BYTES = 1024
MAX_TITLE_BYTES = 4096
MAX_BATCH = 1000
MAX_DIM = 4096
MAX_TTL_SECONDS = 366 * 24 * 3600.0
MAX_RETENTION_SECONDS = 100 * 365.25 * 24 * 3600.0
"""The longest retention a request may give (100 years)."""
MAX_REASON_BYTES = 256
DEFAULT_PAGE = 100
MAX_PAGE = 1000
DEFAULT_TOP_K = 10
MAX_REPLY_BYTES = 3 * 1024 * 1024 + 512 * 1024
"""A reply page is cut below this many bytes (3.5 MiB), so a client with gRPC's
default 4 MiB receive limit can read every page (API.md, "Views and sizes")."""
MAX_TOP_K = 1000
MAX_LINEAGE_DEPTH = 100
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")

M = TypeVar("M", bound=Message)
K = TypeVar("K", str, int)


# ---------------------------------------------------------------------- validation helpers


def _utf8_len(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def check_text(value: str, field: str, *, limit: int, required: bool) -> str:
    """Raises InvalidArgument when empty (if required) or over ``limit`` bytes."""
    if required and not value.strip():
        raise InvalidArgument(field, "must not be empty")
    if _utf8_len(value) > limit:
        raise InvalidArgument(field, f"must be at most {limit} bytes of UTF-8")
    return value


def check_vector(values: Any, field: str) -> np.ndarray[Any, np.dtype[np.float32]] | None:
    """A finite, non-zero ``(d,) float32`` vector with 1 ≤ d ≤ 4096, or None if empty."""
    if len(values) == 0:
        return None
    if len(values) > MAX_DIM:
        raise InvalidArgument(field, f"at most {MAX_DIM} dimensions")
    vec = np.asarray(values, dtype=np.float32)
    if not np.isfinite(vec).all():
        raise InvalidArgument(field, "must be finite (no NaN or infinity)")
    if not vec.any():  # as a float64 dot > 0 (no float32 square underflows there), cheaper
        raise InvalidArgument(field, "must not be the zero vector")
    return vec


def seconds(ts: timestamp_pb2.Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def duration(d: duration_pb2.Duration, field: str, default: float) -> float:
    if d.seconds == 0 and d.nanos == 0:
        return default
    value = d.seconds + d.nanos / 1e9
    if not 0 < value <= MAX_TTL_SECONDS or d.nanos < 0 or d.nanos >= 1_000_000_000:
        raise InvalidArgument(field, f"must be positive and at most {MAX_TTL_SECONDS:.0f} s")
    return value


def retention(d: duration_pb2.Duration, field: str) -> float:
    """A retention in seconds: positive, at most :data:`MAX_RETENTION_SECONDS`.

    Raises:
        InvalidArgument: zero, negative, malformed or too long.
    """
    value = d.seconds + d.nanos / 1e9
    if not 0 < value <= MAX_RETENTION_SECONDS or not 0 <= d.nanos < 1_000_000_000:
        raise InvalidArgument(field, "must be positive and at most 100 years")
    return value


def page_size(value: int) -> int:
    if value < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return min(value or DEFAULT_PAGE, MAX_PAGE)


PAGE_POLICY = f"{DEFAULT_PAGE}/{MAX_PAGE}"
"""The page-size policy bound into every page token (default size / cap)."""


def page_tokens() -> PageTokens:
    """A new :class:`~server.services._pages.PageTokens` under :data:`PAGE_POLICY`.

    One per servicer, made when the server starts.
    """
    return PageTokens(PAGE_POLICY)


def owner_page(request: Any, tokens: PageTokens) -> tuple[str, int, str]:
    """The authorised owner of a list request's ``parent``, its page size and its resume position.

    The position is the one its ``page_token`` resumes after. The shared head
    of every List method.

    Raises:
        InvalidArgument: a malformed ``parent``, a negative page size, or a page
            token this server process did not issue for the request.
        PermissionDenied: the caller may not act for the owner (or another
            error of :func:`server.edge.authorize`).

    Raises:
        InvalidArgument: bad parent, page size or token. PermissionDenied: owner.
    """
    owner = parse_owner(request.parent, "parent")
    authorize(owner)
    return owner, page_size(request.page_size), tokens.resume(request)


def states(values: Any) -> set[str]:
    if not values:
        return {PENDING, COMMITTED}
    out = set()
    for i, value in enumerate(values):
        if value not in STATE_NAMES:
            raise InvalidArgument(f"states[{i}]", "unknown state")
        out.add(STATE_NAMES[value])
    return out


def kind_names(values: Any, field: str) -> list[str]:
    out = []
    for i, value in enumerate(values):
        if value not in memories_pb2.Memory.Kind.values() or value == 0:
            raise InvalidArgument(f"{field}[{i}]", "unknown kind")
        out.append(memories_pb2.Memory.Kind.Name(value))
    return out


def view_full(value: int) -> bool:
    if value not in (common_pb2.VIEW_UNSPECIFIED, common_pb2.BASIC, common_pb2.FULL):
        raise InvalidArgument("view", "unknown view")
    return value == common_pb2.FULL


def source_refs(refs: Any, owner: str, field: str) -> list[tuple[str, int]]:
    out = []
    for i, ref in enumerate(refs):
        name = ref.name
        target = parse_target(name, f"{field}[{i}].name")
        if target.owner != owner:
            raise InvalidArgument(f"{field}[{i}].name", "must name a record of the same owner")
        if ref.version < 0:
            raise InvalidArgument(f"{field}[{i}].version", "must not be negative")
        out.append((name, int(ref.version)))
    return out


def enum_name(enum: Any, value: int, field: str) -> str:
    """The value name of a proto enum field, "" for its zero value.

    Raises:
        InvalidArgument: ``value`` is not a value of ``enum``.
    """
    if value == 0:
        return ""
    if value not in enum.values():
        raise InvalidArgument(field, "unknown value")
    return str(enum.Name(value))


def fit(messages: Sequence[M], nxt: K, key: Callable[[M], K]) -> tuple[list[M], K]:
    """Cut a page of reply ``messages`` to :data:`MAX_REPLY_BYTES`.

    Args:
        messages: the page, in order.
        nxt: where the full page would resume (falsy at the end).
        key: the resume position of a message (what a page token carries).

    Returns:
        (the messages that fit — at least one —, where to resume: ``nxt`` when
        all fit, else the key of the last message kept).
    """
    total = 0
    for i, message in enumerate(messages):
        total += message.ByteSize() + 8  # field tag and length
        if total > MAX_REPLY_BYTES and i > 0:
            return list(messages[:i]), key(messages[i - 1])
    return list(messages), nxt
