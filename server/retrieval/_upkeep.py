"""Keeping loaded indexes in line with the store after writes and forgets.

A write hands what it changed to :meth:`IndexUpkeep.on_write` and a forget to
:meth:`IndexUpkeep.on_forget` (step 2 of a deletion). Bundles that are not
loaded are left alone: they are built from LMDB when first needed. Whatever is
indexed beside a record is a derivative of another record (a turn's contextual
text quotes the previous turn), so the turn after one that entered or left an
index is re-indexed with its new context.

Thread rules: any thread; every change of one owner's bundles holds the
owner's lock (:class:`server.retrieval._build.IndexBuilds`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from index import VectorIndex
from server.retrieval._build import IndexBuilds
from server.retrieval._bundle import Bundle, add_time_legs, owner_key, pending_key, pending_prefix
from server.retrieval._drift import RowFacts
from server.retrieval._indexed_text import TermMemo
from server.store import MemMeta, RecordMeta, TurnMeta, general_visible, indexable


class IndexUpkeep(IndexBuilds):
    """Index upkeep on write and forget, over :class:`IndexBuilds`."""

    def on_write(
        self,
        owner: str,
        records: Sequence[RecordMeta],
        written: Mapping[int, tuple[str, npt.NDArray[np.float32] | None]] | None = None,
        removals: int | None = None,
    ) -> None:
        """Bring loaded bundles in line after records were appended, committed or updated.

        ``written`` holds what the caller has just sealed for some of the turns
        (rid -> (indexed text, ``(d,) float32`` vector or None)), so an append
        does not read back and decrypt what it wrote. A turn forgotten (sealed,
        tainted) between its write and this call must not be indexed: every such
        change commits before its :meth:`on_forget`, which counts in
        :meth:`removals` under the owner's index lock, so when ``removals`` (read
        before the write) still equals the count here nothing can have changed
        and the written turns are indexed as they are; otherwise (or when it is
        None) their rows are read again first.

        A memory leaves every leg and, if it is visible to general search, is
        indexed again at its current version (so the vector follows the text).

        Committed turns join the owner's bundle (and the turn after each gets a
        new context) and leave their thread's pending bundle; pending turns
        join their thread's pending bundle. Bundles not loaded are left alone:
        they are built from LMDB when first needed.
        """
        unique = list({m.rid: m for m in records}.values())
        metas = [m for m in unique if isinstance(m, TurnMeta)]
        mems = [m for m in unique if isinstance(m, MemMeta)]
        now = time.time()
        if mems:
            with self._lock(owner):
                bundle = self.cache.get(owner_key(owner))
                if bundle is not None:
                    self._touch(owner)
                    bundle.forget_ids([m.rid for m in mems])
                    self._fill_memories(bundle, [m for m in mems if general_visible(m, now)])
        if not metas:
            return
        with self._lock(owner):
            owner_b = self.cache.get(owner_key(owner))
            committed = [m for m in metas if general_visible(m, now)]
            if owner_b is not None and committed:
                self._touch(owner)
                if written and (removals is None or removals != self._removals.get(owner, 0)):
                    # something left the indexes since: rows as reads see them now
                    committed = [m for m in self.store.metas([m.rid for m in committed])]
                    committed = [m for m in committed if general_visible(m, now)]
                rids, vecs = self._vectors([m for m in committed if indexable(m, now)], written)
                if rids and owner_b.dense.dim != vecs.shape[1] and len(owner_b.dense):
                    self.cache.evict(owner_key(owner))  # rebuilt from LMDB on next use
                else:
                    texts = {r: w[0] for r, w in (written or {}).items()}
                    self._add_turns(owner, owner_b, committed, rids, vecs, texts)
                    self.cache.trim()  # the owner's bundle grew in place
            for thread in {m.thread for m in metas}:
                key = pending_key(owner, thread)
                if self.cache.get(key) is not None:
                    self.cache.evict(key)  # small: rebuilt from LMDB on next use

    def _add_turns(
        self,
        owner: str,
        bundle: Bundle,
        turns: Sequence[TurnMeta],
        rids: Sequence[int],
        vecs: npt.NDArray[np.float32],
        known: Mapping[int, str],
    ) -> None:
        """Index newly visible turns in every leg, with their contexts and their successors'.

        They are now the predecessors of the turns after them. ``known`` holds
        plain texts already in hand (rid -> text); the others are decrypted.
        """
        texts = {m.rid: known[m.rid] for m in turns if m.rid in known}
        texts.update(self._texts([m for m in turns if m.rid not in known]))
        memo = TermMemo()
        plain_ids = [m.rid for m in turns if m.rid in texts]
        if plain_ids:
            terms = [memo.terms(texts[r]) for r in plain_ids]
            bundle.plain.add_terms(np.asarray(plain_ids, np.int64), terms)
        add_time_legs(bundle, turns, texts, memo)
        if rids:
            if bundle.dense.dim != vecs.shape[1]:
                bundle.dense = VectorIndex(vecs.shape[1])
            bundle.dense.add(np.asarray(rids, np.int64), vecs)
        by_thread: dict[str, list[TurnMeta]] = {}
        for meta in turns:
            by_thread.setdefault(meta.thread, []).append(meta)
        for thread, added in by_thread.items():
            # Added turns are visible: within a run of consecutive seqs each one's
            # neighbours are the run's own turns, so LMDB is asked only about the
            # ends of runs (an append of n turns reads O(1) rows, not O(n)).
            by_seq = {t.seq: t for t in added}
            ends = [s for s in by_seq if s - 1 not in by_seq or s + 1 not in by_seq]
            around = self.store.visible_neighbours(owner, thread, ends, general_visible)
            prevs = {s: by_seq.get(s - 1) or around[s][0] for s in by_seq}
            fresh = {t.rid for t in added}
            after = {
                n.rid: n
                for s in ends
                if s + 1 not in by_seq and (n := around[s][1]) is not None and n.rid not in fresh
            }
            targets = [*added, *after.values()]
            self._set_contexts(owner, bundle, thread, targets, texts, prevs, memo=memo)

    def on_forget(
        self,
        owner: str,
        rids: Sequence[int],
        threads: Sequence[str],
        whole_owner: bool,
        touched_threads: Sequence[str] = (),
        positions: Mapping[int, tuple[str, int]] | None = None,
    ) -> None:
        """Remove forgotten records from every loaded bundle (step 2 of a forget).

        Args:
            owner: the owner whose records are forgotten.
            rids: record numbers leaving the indexes.
            threads: thread ids forgotten whole.
            whole_owner: the owner is forgotten (its bundles are dropped).
            touched_threads: threads that lost single turns (their pending
                bundles are dropped). In every thread but those forgotten whole,
                the turn after each removed one is re-indexed with its new context.
            positions: ``rid -> (thread, seq)`` of every turn among ``rids``,
                when the caller has them (the forget's plan); None reads them.
        """
        with self._lock(owner):
            # Counted whether or not the bundle is loaded: a snapshot being saved
            # from a bundle evicted meanwhile must not be put in place after this.
            self._touch(owner)
            self._removals[owner] = self._removals.get(owner, 0) + 1
            if whole_owner:
                self.cache.evict(owner_key(owner))
                self.cache.evict_prefix(pending_prefix(owner))
                return
            for thread in {*threads, *touched_threads}:
                self.cache.evict(pending_key(owner, thread))
            if not rids:
                return
            bundle = self.cache.get(owner_key(owner))
            if bundle is None:
                return
            bundle.forget_ids(list(rids))  # a session's document loses the turn's terms
            # The turn after each removed one gets a new context: in the threads
            # that lost single turns, and in those of responses tainted by this
            # forget (which ``touched_threads`` does not name).
            whole = set(threads)
            if positions is None:
                positions = {m.rid: (m.thread, m.seq) for m in self.store.metas(list(rids))}
            seqs: dict[str, list[int]] = {}
            for thread, seq in positions.values():
                if thread not in whole:
                    seqs.setdefault(thread, []).append(seq)
            # The forgotten turns are tombstoned: the neighbour walks skip them unread.
            gone = frozenset(rids)
            for thread, lost in seqs.items():
                self._recontext(owner, bundle, thread, lost, gone)

    def index_drift(self, owner: str) -> int:
        """The audit's ``index_drift`` for ``owner`` (see :func:`index_drift`)."""
        with self._lock(owner):
            bundle = self.cache.get(owner_key(owner))
            if bundle is None:
                return 0
            if bundle.due <= time.time():
                self._expire(owner, bundle)  # as every use of the bundle does first
        facts = RowFacts(time.time())
        self.store.scan_rows(owner, facts)
        return facts.index_drift(bundle)
