"""The audit's ``index_drift``: how far a loaded bundle is from the store.

An index built from LMDB when needed cannot drift; a loaded one is kept in
line by the upkeep (:mod:`server.retrieval._upkeep`), and this count (the
``index_drift`` of ``Lifecycle.Audit``'s report) is the check that it was:
how many entries disagree with the store.

The store's rows are read one at a time into :class:`RowFacts` (what the
check needs of each, in arrays), never held as a list of record metadata:
at 100k turns such a list took about 86 MiB and the check's sets of Python
ints 54 MiB more, in every audit and every snapshot save.
"""

from __future__ import annotations

import array
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from server.retrieval._bundle import Bundle
from server.retrieval._indexed_text import session_key
from server.store import MemMeta, TurnMeta, general_visible, indexable

_I64 = npt.NDArray[np.int64]


class RowFacts:
    """What :func:`index_drift` needs of an owner's stored rows, read one row at a time.

    Feed it every stored turn (:meth:`turn`) and memory (:meth:`memory`) as
    reads see them at ``now`` (a :class:`server.store.RowSink`), in any order,
    then call :meth:`index_drift`. Per row it keeps a few integers (record
    number, flags, a memory's version; a visible turn's thread, ``seq`` and
    session as numbers of interned strings), about 50 bytes.

    Args:
        now: the time (seconds since the epoch) the rows are read as of.
    """

    def __init__(self, now: float) -> None:
        self.now = now
        self._rids = array.array("q")
        self._flags = array.array("b")  # bit 0 visible, 1 indexable, 2 waiting
        self._mem_rids = array.array("q")  # visible memories and their versions
        self._mem_versions = array.array("q")
        self._turn_rids = array.array("q")  # visible turns: thread, seq, session
        self._turn_threads = array.array("q")
        self._turn_seqs = array.array("q")
        self._turn_sessions = array.array("q")
        self._codes: dict[str, int] = {}

    def _code(self, text: str) -> int:
        return self._codes.setdefault(text, len(self._codes))

    def turn(self, meta: TurnMeta) -> None:
        """Take one stored turn (deleted ones included)."""
        visible = general_visible(meta, self.now)
        self._rids.append(meta.rid)
        self._flags.append(visible | (indexable(meta, self.now) << 1))
        if visible:
            self._turn_rids.append(meta.rid)
            self._turn_threads.append(self._code(meta.thread))
            self._turn_seqs.append(meta.seq)
            self._turn_sessions.append(self._code(session_key(meta)))

    def memory(self, meta: MemMeta) -> None:
        """Take one stored memory (deleted ones included)."""
        visible = general_visible(meta, self.now)
        # A memory past its retention leaves the indexes when the sweeper forgets
        # it (no hit of it is returned before: every hit is rechecked).
        waiting = not meta.deleted and bool(meta.expire_time) and self.now >= meta.expire_time
        self._rids.append(meta.rid)
        self._flags.append(visible | (indexable(meta, self.now) << 1) | (waiting << 2))
        if visible:
            self._mem_rids.append(meta.rid)
            self._mem_versions.append(meta.version)

    def index_drift(self, bundle: Bundle | None) -> int:
        """The audit's ``index_drift`` of one owner's loaded bundle against these rows.

        0 when none is loaded: an index built from LMDB when needed cannot drift.

        Counts ids held that should not be, visible records missing from the
        plain leg, memories indexed at another version than their current one,
        contextual texts that quote a turn other than the nearest earlier
        visible one (a forgotten or sealed one must have been re-indexed
        away), and session documents holding a turn that is not visible,
        missing one that is, or holding it under another session; the time
        leg must hold the sessions' members.
        """
        if bundle is None:
            return 0
        rids = np.frombuffer(self._rids, np.int64)
        flags = np.frombuffer(self._flags, np.int8)
        visible = np.unique(rids[(flags & 1) != 0])
        dense = np.unique(rids[(flags & 2) != 0])
        waiting = rids[(flags & 4) != 0]
        held_dense = np.setdiff1d(bundle.dense.ids(), waiting)
        held_plain = np.setdiff1d(bundle.plain.ids(), waiting)
        # Records without text tokens are held but never match; count only ids
        # held that should not be, and visible records missing from the plain leg.
        drift = len(np.setxor1d(held_dense, dense)) + len(np.setxor1d(held_plain, visible))
        mem_rids = np.frombuffer(self._mem_rids, np.int64)
        mem_versions = np.frombuffer(self._mem_versions, np.int64)
        indexed = np.isin(mem_rids, held_plain)
        drift += sum(
            1
            for rid, version in zip(
                mem_rids[indexed].tolist(), mem_versions[indexed].tolist(), strict=True
            )
            if bundle.versions.get(rid) != version
        )
        turns, prev, sessions = self._visible_turns()
        drift += _context_drift(bundle, turns, prev)
        # Sessions: every indexed visible turn is a member of its own session's
        # document and nothing else is (a forgotten, sealed, tainted or expired
        # turn must have left it); the time leg holds the same turns.
        member_rids, member_codes = self._members(bundle)
        want = turns[np.isin(turns, held_plain)]
        drift += len(np.setxor1d(want, member_rids))
        at = np.searchsorted(turns, member_rids)
        inside = at < len(turns)
        inside[inside] = turns[at[inside]] == member_rids[inside]
        wanted = inside.copy()
        wanted[inside] = np.isin(member_rids[inside], want)
        drift += int(np.count_nonzero(sessions[at[wanted]] != member_codes[wanted]))
        drift += len(np.setxor1d(bundle.times.ids(), member_rids))
        return drift

    def _visible_turns(self) -> tuple[_I64, _I64, _I64]:
        """Visible turns by record number: ``(rids, previous visible rid or 0, session code)``."""
        rids = np.frombuffer(self._turn_rids, np.int64)
        threads = np.frombuffer(self._turn_threads, np.int64)
        seqs = np.frombuffer(self._turn_seqs, np.int64)
        order = np.lexsort((seqs, threads))
        prev = np.zeros(len(rids), np.int64)
        if len(rids):
            same = threads[order][1:] == threads[order][:-1]
            prev[order[1:][same]] = rids[order][:-1][same]
        by_rid = np.argsort(rids, kind="stable")
        sessions = np.frombuffer(self._turn_sessions, np.int64)
        return rids[by_rid], prev[by_rid], sessions[by_rid]

    def _members(self, bundle: Bundle) -> tuple[_I64, _I64]:
        """The session leg's members by record number and the codes of their sessions."""
        rids: list[int] = []
        codes: list[int] = []
        for key, members in bundle.sessions.sessions().items():
            code = self._code(key)
            rids.extend(members)
            codes.extend([code] * len(members))
        member_rids = np.asarray(rids, np.int64)
        order = np.argsort(member_rids, kind="stable")
        return member_rids[order], np.asarray(codes, np.int64)[order]


def _context_drift(bundle: Bundle, turns: _I64, prev: _I64) -> int:
    """Contexts quoting a turn other than the nearest earlier visible one of their thread."""
    keys, values = bundle.ctx_prev.arrays()
    at = np.searchsorted(turns, keys)
    inside = at < len(turns)
    inside[inside] = turns[at[inside]] == keys[inside]
    quoted, expected = values[inside], prev[at[inside]]
    return int(np.count_nonzero((quoted != 0) & (quoted != expected)))


def index_drift(
    bundle: Bundle | None, turns: Iterable[TurnMeta], memories: Iterable[MemMeta], now: float
) -> int:
    """:meth:`RowFacts.index_drift` of rows already read (a replay's, which holds them anyway).

    ``turns`` and ``memories`` are every stored record of the owner, as reads
    see them at ``now``.
    """
    facts = RowFacts(now)
    for turn in turns:
        facts.turn(turn)
    for memory in memories:
        facts.memory(memory)
    return facts.index_drift(bundle)
