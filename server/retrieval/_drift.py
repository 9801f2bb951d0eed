"""The audit's ``index_drift``: how far a loaded bundle is from the store.

An index built from LMDB when needed cannot drift; a loaded one is kept in
line by the upkeep (:mod:`server.retrieval._upkeep`), and this count (the
``index_drift`` of ``Lifecycle.Audit``'s report) is the check that it was:
how many entries disagree with the store.
"""

from __future__ import annotations

from collections.abc import Sequence

from server.retrieval._bundle import Bundle
from server.retrieval._indexed_text import session_key
from server.store import MemMeta, RecordMeta, TurnMeta, general_visible, indexable


def index_drift(
    bundle: Bundle | None, turns: Sequence[TurnMeta], memories: Sequence[MemMeta], now: float
) -> int:
    """The audit's ``index_drift`` of one owner's loaded bundle.

    0 when none is loaded: an index built from LMDB when needed cannot drift.

    Counts ids held that should not be, visible records missing from the
    plain leg, memories indexed at another version than their current one,
    contextual texts that quote a turn other than the nearest earlier visible
    one (a forgotten or sealed one must have been re-indexed away), and
    session documents holding a turn that is not visible, missing one that
    is, or holding it under another session. ``turns`` and ``memories`` are
    every stored record of the owner.
    """
    if bundle is None:
        return 0
    records: list[RecordMeta] = [*turns, *memories]
    visible = {m.rid for m in records if general_visible(m, now)}
    dense = {m.rid for m in records if indexable(m, now)}
    # A memory past its retention leaves the indexes when the sweeper forgets
    # it (no hit of it is returned before: every hit is rechecked).
    waiting = {m.rid for m in memories if not m.deleted and m.expire_time and now >= m.expire_time}
    held_dense = {int(i) for i in bundle.dense.ids()} - waiting
    held_plain = {int(i) for i in bundle.plain.ids()} - waiting
    # Records without text tokens are held but never match; count only ids held
    # that should not be, and visible records missing from the plain leg.
    drift = len(held_dense ^ dense) + len(held_plain - visible) + len(visible - held_plain)
    drift += sum(
        1
        for m in memories
        if m.rid in held_plain and m.rid in visible and bundle.versions.get(m.rid) != m.version
    )
    expected_prev: dict[int, int] = {}
    by_thread: dict[str, list[TurnMeta]] = {}
    for turn in turns:
        if general_visible(turn, now):
            by_thread.setdefault(turn.thread, []).append(turn)
    for ordered in by_thread.values():
        ordered.sort(key=lambda t: t.seq)
        for i, turn in enumerate(ordered):
            expected_prev[turn.rid] = ordered[i - 1].rid if i > 0 else 0
    for rid, prev in bundle.ctx_prev.items():
        if rid in expected_prev and prev not in (0, expected_prev[rid]):
            drift += 1
    # Sessions: every indexed visible turn is a member of its own session's
    # document and nothing else is (a forgotten, sealed, tainted or expired turn
    # must have left it); the time leg holds the same turns.
    by_rid = {t.rid: t for t in turns}
    members = {rid: key for key, rids in bundle.sessions.sessions().items() for rid in rids}
    want = held_plain & {t.rid for t in turns if general_visible(t, now)}
    drift += len(want ^ set(members))
    drift += sum(
        1 for rid, key in members.items() if rid in want and session_key(by_rid[rid]) != key
    )
    drift += len({int(i) for i in bundle.times.ids()} ^ set(members))
    return drift
