"""The bundle of in-memory indexes one owner (or one thread's pending turns) has.

Each owner has one bundle over its ``COMMITTED``, live, untainted turns and
its memories, and each thread one bundle over its pending turns:

- ``dense``: :class:`index.VectorIndex` (FAISS inner product) over the turn's
  vector (the server embeds ``speaker: text``, or the client sent one);
- ``plain``: :class:`index.LexicalIndex` (BM25) over ``speaker: text``;
- ``ctx``: BM25 over the *contextual* text ``"{date}. {previous turn} {speaker:
  text}"``, where date is the turn's time as "8 May 2023" (UTC) and the previous
  turn is the nearest earlier live turn of the same thread that is visible in
  the same index (committed for the owner bundle, so pending words never enter
  the general index). That context is derived from another record: when the
  previous turn is forgotten or committed, the next one is re-indexed;
- ``sessions``: :class:`index.SessionIndex` over each *session* — the turns of
  one thread said on one UTC calendar day — as one document (its date and the
  terms of every member turn visible in the bundle); a forget, seal or taint
  removes the turn's terms from its session's document at once;
- ``times``: :class:`index.TimeIndex`, each turn's time and whether its text
  carries a time expression (the time-expression prior and session-date window).

Memories enter the dense and both plain legs only, and ``versions`` records
the version each one is indexed at. A bundle also watches the times at which a
member may stop being visible without any write (a turn's ``expire_time``: the
end of its pending window or of its retention; its ``lineage_expiry``).

Bundles live in memory, in an LRU over owners (:class:`index.IndexCache`),
under the keys :func:`owner_key` and :func:`pending_key`. An owner's bundle is
also kept between processes as an encrypted snapshot
(:mod:`server.retrieval._snapshot`); a pending bundle never leaves memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from index import IdMap, LexicalIndex, SessionIndex, TimeIndex, VectorIndex
from server.retrieval._indexed_text import TermMemo, date_text, session_key
from server.store import TurnMeta

Ranked = list[tuple[int, float]]
"""One leg's or one fusion's result: ``(record number, score)``, best first."""


@dataclass(slots=True)
class Bundle:
    """One owner's committed indexes, or one thread's pending indexes."""

    dense: VectorIndex
    plain: LexicalIndex
    ctx: LexicalIndex
    # rid -> rid of the turn its contextual text quotes (0: none). The context
    # is derived from that record; the audit checks it is still the right one.
    ctx_prev: IdMap = field(default_factory=IdMap)
    sessions: SessionIndex = field(default_factory=SessionIndex)
    times: TimeIndex = field(default_factory=TimeIndex)
    # rid -> when the turn may stop being visible without a write (its pending
    # expiry or its lineage expiry); ``due`` is the earliest (inf: none).
    watch: dict[int, float] = field(default_factory=dict)
    due: float = math.inf
    # memory rid -> the version its text (and vector) is indexed at.
    versions: dict[int, int] = field(default_factory=dict)

    def __len__(self) -> int:
        """Vectors held (``lethe_index_vectors``)."""
        return len(self.dense)

    def nbytes(self) -> int:
        """Estimated bytes held by every leg and the maps.

        16 bytes a context-map entry, ~90 a memory-version entry. The index
        cache bounds this figure (``lethe_index_bytes``).
        """
        legs = self.dense.nbytes() + self.plain.nbytes() + self.ctx.nbytes()
        maps = 16 * len(self.ctx_prev) + 90 * len(self.versions)
        return legs + self.sessions.nbytes() + self.times.nbytes() + maps

    def forget_ids(self, ids: Sequence[int]) -> None:
        """Remove records from every leg and from the bundle's maps (nothing is re-indexed)."""
        held = np.asarray(ids, np.int64)
        for leg in (self.dense, self.plain, self.ctx, self.sessions, self.times):
            leg.remove(held)
        for rid in ids:
            self.ctx_prev.pop(rid, None)
            self.watch.pop(rid, None)
            self.versions.pop(rid, None)


def owner_key(owner: str) -> str:
    """The index cache key of ``owner``'s committed bundle."""
    return f"o/{owner}"


def pending_key(owner: str, thread: str) -> str:
    """The index cache key of the pending bundle of ``owner``'s ``thread``."""
    return f"p/{owner}/{thread}"


def pending_prefix(owner: str) -> str:
    """The prefix of the index cache keys of every pending bundle of ``owner``."""
    return f"p/{owner}/"


def add_time_legs(
    bundle: Bundle, turns: Sequence[TurnMeta], texts: dict[int, str], memo: TermMemo
) -> None:
    """Index turns in the session and time legs, and watch those that may stop being visible.

    Their plain texts are in ``texts``. The turns watched are those that may
    stop being visible without a write.
    """
    held = [m for m in turns if m.rid in texts]
    if not held:
        return
    ids = np.asarray([m.rid for m in held], np.int64)
    bundle.sessions.add_terms(
        ids,
        [session_key(m) for m in held],
        [memo.terms(texts[m.rid]) for m in held],
        [date_text(m.time) for m in held],
    )
    bundle.times.add(ids, [m.time for m in held], [texts[m.rid] for m in held])
    for m in held:
        ends = [t for t in (m.expire_time, m.lineage_expiry) if t]  # pending window or retention
        if ends:
            bundle.watch[m.rid] = min(ends)
            bundle.due = min(bundle.due, bundle.watch[m.rid])
