"""The one place that decides whether a record may be read, listed or found.

Every read path (get, list, search, index build) calls these functions with
the record's metadata and the current time; no other module re-implements a
state, tombstone or expiry check (STYLE.md, "What to avoid"). Expiry is
checked here on every read, so a late or stopped sweeper can never make an
expired record readable: a pending one past its pending window, a committed
one past its retention, a thread past its retention.
"""

from __future__ import annotations

from collections.abc import Collection

from server.errors import FailedPrecondition, Reason, RecordDeleted
from server.store._records import (
    COMMITTED,
    PENDING,
    SEALED,
    MemMeta,
    RecordMeta,
    ThreadMeta,
    TurnMeta,
)


def effective_state(meta: RecordMeta, now: float) -> str | None:
    """The state a reader sees, or None when the record is gone.

    Gone means tombstoned (``deleted``), or pending or committed past its
    ``expire_time`` (seconds since the epoch; a record expires at exactly that
    instant): the end of a pending window or of a retention. A sealed record
    never expires (its repair's conclusion decides it).
    """
    if meta.deleted:
        return None
    if meta.state != SEALED and meta.expire_time and now >= meta.expire_time:
        return None
    return meta.state


def thread_gone(meta: ThreadMeta, now: float) -> bool:
    """Whether a thread is gone for readers: tombstoned, or past its retention."""
    return meta.deleted or bool(meta.expire_time and now >= meta.expire_time)


def check_readable(meta: RecordMeta, now: float) -> None:
    """Allow a direct read (GetTurn) or refuse it.

    Raises:
        RecordDeleted: deleted or expired.
        FailedPrecondition: sealed (reason ``SEALED``); no content is returned.
    """
    state = effective_state(meta, now)
    if state is None:
        raise RecordDeleted(f"{meta.name} was deleted")
    if state == SEALED:
        raise FailedPrecondition(f"{meta.name} is sealed", reason=Reason.SEALED, subject=meta.name)


def source_alive(meta: RecordMeta, now: float) -> bool:
    """Whether a record still counts as a source: live (not deleted or expired) and not tainted.

    A sealed source is alive here; publication refuses it separately
    (``SOURCE_SEALED``).
    """
    return not meta.tainted and effective_state(meta, now) is not None


def listable(meta: TurnMeta, now: float, states: Collection[str], include_tainted: bool) -> bool:
    """Whether ListTurns returns the record (sealed never; ``states`` filter)."""
    state = effective_state(meta, now)
    if state is None or state == SEALED or state not in states:
        return False
    return include_tainted or not meta.tainted


def searchable(meta: RecordMeta, now: float, owner: str, pending_thread: str | None) -> bool:
    """Whether a search hit may be returned.

    General search sees only the owner's ``COMMITTED``, live, untainted
    records (for a memory: its current version, never ``SUPERSEDED``);
    ``pending_thread`` (a thread id, from ``thread`` + ``include_pending``)
    adds that thread's pending turns. Pending memories (candidates) are never
    found by search.
    """
    if meta.owner != owner or meta.tainted:
        return False
    state = effective_state(meta, now)
    if isinstance(meta, MemMeta):
        return state == COMMITTED and meta.status != "SUPERSEDED"
    if state == COMMITTED:
        return True
    return state == PENDING and pending_thread is not None and meta.thread == pending_thread


def general_visible(meta: RecordMeta, now: float) -> bool:
    """Whether the record belongs in its owner's general (committed) lexical indexes."""
    if isinstance(meta, MemMeta) and meta.status == "SUPERSEDED":
        return False
    return not meta.tainted and effective_state(meta, now) == COMMITTED


def pending_visible(meta: TurnMeta, now: float) -> bool:
    """Whether the record may serve its own thread's immediate context.

    That is pending or committed, live and untainted: what a pending turn's
    contextual text may quote.
    """
    return not meta.tainted and effective_state(meta, now) in (PENDING, COMMITTED)


def indexable(meta: RecordMeta, now: float) -> bool:
    """Whether the record's vector belongs in its owner's general (committed) index."""
    return meta.has_embedding and general_visible(meta, now)


def pending_indexable(meta: TurnMeta, now: float) -> bool:
    """Whether the record's vector belongs in its thread's in-memory pending index."""
    return meta.has_embedding and not meta.tainted and effective_state(meta, now) == PENDING
