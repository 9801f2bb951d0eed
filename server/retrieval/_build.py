"""Building the indexes of an owner (or a thread's pending turns) from the store.

Bundles (:mod:`server.retrieval._bundle`) are built from LMDB — decrypting
vectors and texts — when first needed, not at start: an owner's first search
waits for its build, and a build of :data:`SLOW_BUILD_SECONDS` or more is
logged. Vectors are decrypted and added :data:`BUILD_CHUNK` at a time, so a
build's peak stays near the index's own size; a large build hands its freed
heap back to the OS (:data:`TRIM_AFTER_BUILD`).

Each use of the owner's bundle first rechecks the turns whose watch time
passed (a pending source of their lineage expired): those no longer visible
leave every leg and the contexts that quoted them are re-indexed, so an
expired turn never contributes to a session's document or a context, even
before the sweeper forgets it. A pending bundle is small and rebuilt instead.

Vectors: before an owner's vectors are used or written,
:meth:`IndexBuilds.ensure_vectors` re-embeds them if another embedder made them
(:mod:`server.retrieval._reembed`), so an owner's dense index never mixes two
models' vectors.

:class:`IndexBuilds` is the declared base of the retriever: the state every
part uses (the store, the embedder, the bundle cache, the per-owner locks) and
the builds. :mod:`server.retrieval._upkeep` and :mod:`server.retrieval._query`
extend it.

Thread rules: every public method may be called from any thread. Builds and
updates of one owner's bundles are serialised by a per-owner lock, so a bundle
built from a snapshot older than a write can never miss that write's update.
Each change of an owner's committed bundle (a build or load, an update, a
removal, an eviction) counts one in :meth:`IndexBuilds.changes` under that lock,
before it touches the bundle: a reader that sees the same count before and after
reading the legs (each under its own lock) read one consistent state
(:mod:`server.retrieval._snapshot` saves snapshots so).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, MutableMapping, Sequence

import numpy as np
import numpy.typing as npt

from index import Embedder, IndexCache, LexicalIndex, VectorIndex, analyze, release_free_heap
from server import _steps
from server._logs import LIMITED
from server.retrieval._bundle import (
    Bundle,
    add_time_legs,
    owner_key,
    pending_key,
    pending_prefix,
)
from server.retrieval._indexed_text import TermMemo, indexed_text
from server.retrieval._reembed import reembed_owner
from server.store import (
    PENDING,
    MemMeta,
    RecordMeta,
    Store,
    TurnMeta,
    general_visible,
    indexable,
    pending_indexable,
    pending_visible,
)

SLOW_BUILD_SECONDS = 1.0
"""An owner index build taking this long or longer is logged (seconds)."""
TRIM_AFTER_BUILD = 5000
"""Texts in a built owner index from which the build ends with
:func:`index.release_free_heap` (2-3 ms at 20k turns)."""
BUILD_CHUNK = 4096
"""Turns whose texts and vectors are decrypted and indexed at a time when an owner's
index is built."""


OWNER_LOCK_BRIEF = 0.005
"""Seconds a call waits for an owner's lock before it lends its slot (:class:`OwnerLock`)."""


class OwnerLock:
    """One owner's lock (:meth:`IndexBuilds._lock`); a call waiting for it lends its running slot.

    Behind it may be a build of the owner's indexes (seconds at 100k turns):
    a call of the worker pool waiting here runs nothing meanwhile
    (:func:`server._steps.blocking`). It waits :data:`OWNER_LOCK_BRIEF` first
    with its slot: most holders (a search's bundle lookup, an update) are
    done by then, and lending the slot for those costs more than it frees.
    Not re-entrant, as ``threading.Lock``.
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        if not self._lock.acquire(timeout=OWNER_LOCK_BRIEF):
            with _steps.blocking():
                self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _thread_groups(
    by_thread: dict[str, list[TurnMeta]], size: int
) -> Iterator[tuple[list[TurnMeta], dict[str, list[TurnMeta]]]]:
    """Turns to index, about ``size`` at a time, each with the threads they are in, in order.

    Whole threads go together; a thread longer than ``size`` is cut into runs of
    ``size`` turns, each given with the whole thread (a turn's context quotes
    its predecessor, which may lie in the run before). Threads are taken out of
    ``by_thread`` as they are reached, so the caller's turns are freed group by
    group.
    """
    group: dict[str, list[TurnMeta]] = {}
    held = 0
    while by_thread:
        thread = next(iter(by_thread))
        ordered = by_thread.pop(thread)
        if group and held + len(ordered) > size:
            yield [m for run in group.values() for m in run], group
            group, held = {}, 0
        if len(ordered) > size:
            for start in range(0, len(ordered), size):
                yield ordered[start : start + size], {thread: ordered}
            continue
        group[thread] = ordered
        held += len(ordered)
    if group:
        yield [m for run in group.values() for m in run], group


class IndexBuilds:
    """The indexes of every owner of one store: their state and their builds.

    Args:
        store: The record store.
        embedder: The server-side embedder, or None (clients send vectors).
        capacity: Most bundles (owner plus pending-thread) kept in memory.
        max_bytes: Most bytes of bundles kept in memory (``nbytes`` estimates;
            the most recently used bundle is kept even when it alone is larger),
            or None for no byte bound. ``lethe serve --index-cache-size``.
    """

    def __init__(
        self,
        store: Store,
        embedder: Embedder | None,
        *,
        capacity: int = 256,
        max_bytes: int | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.cache: IndexCache[Bundle] = IndexCache(capacity, max_bytes)
        self._locks: dict[str, OwnerLock] = {}
        self._locks_guard = threading.Lock()
        self._current: set[str] = set()  # owners whose vectors are the embedder's
        # owner -> removals from its indexes so far (forgets, drops): see on_write
        self._removals: dict[str, int] = {}
        # owner -> changes of its committed bundle so far, and when the last one
        # began (time.monotonic()): see the module docstring and changes()
        self._changes: dict[str, int] = {}
        self._changed_at: dict[str, float] = {}

    def _lock(self, owner: str) -> OwnerLock:
        with self._locks_guard:
            lock = self._locks.get(owner)
            if lock is None:
                lock = self._locks[owner] = OwnerLock()
            return lock

    def _touch(self, owner: str) -> None:
        """Count a change of the owner's committed bundle; the caller holds the owner's lock.

        Called before the change touches any leg.
        """
        self._changes[owner] = self._changes.get(owner, 0) + 1
        self._changed_at[owner] = time.monotonic()

    def changes(self, owner: str) -> tuple[int, float]:
        """``(changes so far, time.monotonic() of the last)`` of the owner's committed bundle.

        ``(0, 0.0)`` before any. Read under the owner's lock, so no change is
        half done.
        """
        with self._lock(owner):
            return self._changes.get(owner, 0), self._changed_at.get(owner, 0.0)

    # ------------------------------------------------------------------ embedding

    def ensure_vectors(self, owner: str) -> None:
        """Make sure ``owner``'s stored vectors are this server's embedder's.

        On the owner's first use since start, re-embed them all if another
        embedder made them (:func:`server.retrieval._reembed.reembed_owner`;
        one transaction swaps them) and drop its loaded bundles. Callers: every
        path that reads or writes the owner's vectors, before it does. Other
        calls for the owner wait for the re-embed (they need its lock).

        Raises:
            Aborted, StoreFull, Unavailable: the swap could not be written
                (nothing changed; the owner's next use tries again).
        """
        embedder = self.embedder
        if embedder is None or owner in self._current:
            return
        with self._lock(owner):
            if owner in self._current:
                return
            if self.store.owner_embedder(owner) != embedder.name:
                self._touch(owner)
                reembed_owner(self.store, embedder, owner, indexed_text)
                self.cache.evict(owner_key(owner))
                self.cache.evict_prefix(pending_prefix(owner))
            self._current.add(owner)

    def drop_owner(self, owner: str) -> None:
        """Forget what is held in memory for ``owner``: its next use rebuilds from the store.

        What is dropped: its loaded indexes and whether its vectors are current.
        Another process changed the owner's data (an owner move imported or
        removed it).
        """
        with self._lock(owner):
            self._touch(owner)
            self._removals[owner] = self._removals.get(owner, 0) + 1
            self.cache.evict(owner_key(owner))
            self.cache.evict_prefix(pending_prefix(owner))
            self._current.discard(owner)

    def removals(self, owner: str) -> int:
        """How many times records left ``owner``'s indexes so far.

        Each :meth:`on_forget` and :meth:`drop_owner` counts one. A writer
        reads it before its write and hands it to :meth:`on_write`.
        """
        with self._lock(owner):
            return self._removals.get(owner, 0)

    def embed_texts(
        self, texts: Sequence[str], *, owner: str
    ) -> list[npt.NDArray[np.float32] | None]:
        """Server-side embeddings of ``texts`` for records of ``owner``: ``(d,) float32`` unit rows.

        The owner's vectors are made current first (:meth:`ensure_vectors`). A
        text with no tokens (it has no direction to index) gets None; without
        embedder every text does.
        """
        self.ensure_vectors(owner)
        if self.embedder is None or not texts:
            return [None] * len(texts)
        rows = self.embedder.embed(list(texts))
        return [row if float(np.dot(row, row)) > 0.0 else None for row in rows]

    # ------------------------------------------------------------------ bundle builds

    def _texts(self, metas: Sequence[RecordMeta]) -> dict[int, str]:
        """What the plain legs index for each record whose content can be opened.

        ``speaker: text`` of a turn; a memory's text (a graph edge's
        ``subject predicate object`` when it has no text).
        """
        turns = [m for m in metas if isinstance(m, TurnMeta)]
        rows = [
            *self.store.contents(turns),
            *self.store.fetch([m.rid for m in metas if not isinstance(m, TurnMeta)]).values(),
        ]
        opened = self.store.open_each(
            rows, lambda m, cts: (m.rid, indexed_text(self.store.view_of(m, cts)))
        )
        return dict(opened)

    def _vectors(
        self,
        metas: Sequence[TurnMeta],
        written: Mapping[int, tuple[str, npt.NDArray[np.float32] | None]] | None,
    ) -> tuple[list[int], npt.NDArray[np.float32]]:
        """The vectors of ``metas``: from ``written`` where the caller holds them, else from LMDB.

        ``written`` is what :meth:`on_write` was handed; the others are
        decrypted from LMDB.

        Returns:
            (rids, ``(n, d) float32``), as ``Store.embeddings``.
        """
        held = {
            m.rid: v for m in metas if (v := (written or {}).get(m.rid, ("", None))[1]) is not None
        }
        rids, vecs = self.store.embeddings([m for m in metas if m.rid not in held])
        if not held:
            return rids, vecs
        dims = {v.shape[0] for v in held.values()} | ({vecs.shape[1]} if rids else set())
        if len(dims) > 1:  # two dimensions in one owner: as Store.embeddings
            raise ValueError("embedding payloads of different dimensions")
        mine = np.stack([np.asarray(v, np.float32) for v in held.values()])
        if not rids:
            return list(held), mine
        return [*rids, *held], np.concatenate([vecs, mine])

    def _fill_memories(self, bundle: Bundle, mems: Sequence[MemMeta]) -> None:
        """Index memories' current versions in every leg (context = their own text).

        ``bundle.versions`` records the version whose text was indexed.
        """
        if not mems:
            return
        opened = self.store.open_each(
            self.store.fetch([m.rid for m in mems]).values(),
            lambda m, cts: (m.rid, m.version, indexed_text(self.store.view_of(m, cts))),
        )
        texts = {rid: text for rid, _, text in opened}
        ids = [m.rid for m in mems if m.rid in texts]
        if ids:
            terms = [analyze(texts[r]) for r in ids]
            bundle.plain.add_terms(np.asarray(ids, np.int64), terms)
            bundle.ctx.add_terms(np.asarray(ids, np.int64), terms)
            bundle.versions.update({rid: version for rid, version, _ in opened if rid in texts})
        rids, vecs = self.store.memory_embeddings([m for m in mems if m.has_embedding])
        if rids:
            if bundle.dense.dim != vecs.shape[1]:
                if len(bundle.dense):
                    return
                bundle.dense = VectorIndex(vecs.shape[1])
            bundle.dense.add(np.asarray(rids, np.int64), vecs)

    def _contexts(
        self,
        ordered: Sequence[TurnMeta],
        targets: Iterable[int],
        texts: dict[int, str],
        prev_of: MutableMapping[int, int],
        memo: TermMemo,
    ) -> dict[int, list[str]]:
        """Terms of the contextual texts of ``targets`` (rids) within ``ordered``.

        ``ordered`` is one thread's visible turns in seq order; ``texts`` must
        hold each target and its predecessor. Records in ``prev_of`` which turn
        each text quotes.
        """
        position = {m.rid: i for i, m in enumerate(ordered)}
        out: dict[int, list[str]] = {}
        for rid in targets:
            i = position.get(rid)
            if i is None or rid not in texts:
                continue
            meta = ordered[i]
            prev = texts.get(ordered[i - 1].rid, "") if i > 0 else ""
            prev_of[rid] = ordered[i - 1].rid if i > 0 and prev else 0
            out[rid] = memo.contextual(meta.time, prev, texts[rid])
        return out

    def _fill(
        self,
        bundle: Bundle,
        metas: Sequence[TurnMeta],
        with_dense: Sequence[TurnMeta],
        ordered_by_thread: dict[str, list[TurnMeta]],
    ) -> None:
        """Add ``metas`` to every leg of ``bundle`` (contexts from ``ordered_by_thread``)."""
        if not metas:
            return
        need: dict[int, TurnMeta] = {m.rid: m for m in metas}
        for ordered in ordered_by_thread.values():
            for i in range(1, len(ordered)):
                if ordered[i].rid in need:
                    need.setdefault(ordered[i - 1].rid, ordered[i - 1])
        texts = self._texts(list(need.values()))
        memo = TermMemo()
        plain_ids = [m.rid for m in metas if m.rid in texts]
        if plain_ids:
            terms = [memo.terms(texts[r]) for r in plain_ids]
            bundle.plain.add_terms(np.asarray(plain_ids, np.int64), terms)
        add_time_legs(bundle, metas, texts, memo)
        ctx: dict[int, list[str]] = {}
        by_thread: dict[str, list[int]] = {}
        for meta in metas:
            by_thread.setdefault(meta.thread, []).append(meta.rid)
        for thread, ordered in ordered_by_thread.items():
            targets = by_thread.get(thread, [])
            ctx.update(self._contexts(ordered, targets, texts, bundle.ctx_prev, memo))
        if ctx:
            bundle.ctx.add_terms(np.asarray(list(ctx), np.int64), list(ctx.values()))
        del texts, memo, ctx  # the legs hold their own terms: free these before FAISS
        # In chunks: the ciphertexts, plaintexts and rows of one chunk at a time
        # beside FAISS's own copy, so a build's peak stays near the index's size.
        dense = list(with_dense)
        for start in range(0, len(dense), BUILD_CHUNK):
            rids, vecs = self.store.embeddings(dense[start : start + BUILD_CHUNK])
            if not rids:
                continue
            if bundle.dense.dim != vecs.shape[1]:
                if len(bundle.dense):
                    continue  # a second dimension in one owner: the first one stays
                bundle.dense = VectorIndex(vecs.shape[1])
            bundle.dense.add(np.asarray(rids, np.int64), vecs)

    def _new_bundle(self, owner: str) -> Bundle:
        dim = self.store.owner_dim(owner) or (self.embedder.dim if self.embedder else 1)
        return Bundle(VectorIndex(dim), LexicalIndex(), LexicalIndex())

    def _build_owner(self, owner: str) -> Bundle:
        """Build the owner's committed bundle from the store, whole threads at a time.

        Each group of threads of about :data:`BUILD_CHUNK` turns has its texts
        decrypted, analysed and indexed before the next one's: the plaintexts
        and their terms as Python strings (about 1 KiB a turn) are held for one
        group, not for the owner (at 100k turns the build's peak was 8x the raw
        vectors with them all held at once).
        """
        now = time.time()
        by_thread: dict[str, list[TurnMeta]] = {}
        for meta in sorted(self.store.owner_turns(owner), key=lambda m: (m.thread, m.seq)):
            if general_visible(meta, now):
                by_thread.setdefault(meta.thread, []).append(meta)
        bundle = self._new_bundle(owner)
        # Content and vector share a record key: one unwrap (its cache held per group).
        for metas, threads in _thread_groups(by_thread, BUILD_CHUNK):
            with self.store.key_batch():
                self._fill(bundle, metas, [m for m in metas if indexable(m, now)], threads)
        with self.store.key_batch():
            mems = [m for m in self.store.owner_memories(owner) if general_visible(m, now)]
            self._fill_memories(bundle, mems)
        return bundle

    def _pending_order(self, owner: str, thread: str, now: float) -> list[TurnMeta]:
        return [m for m in self.store.thread_turns(owner, thread) if pending_visible(m, now)]

    def _build_pending(self, owner: str, thread: str) -> Bundle:
        now = time.time()
        ordered = self._pending_order(owner, thread, now)
        pending = [m for m in ordered if m.state == PENDING]
        bundle = self._new_bundle(owner)
        self._fill(
            bundle, pending, [m for m in pending if pending_indexable(m, now)], {thread: ordered}
        )
        return bundle

    def owner_bundle(self, owner: str) -> Bundle:
        """The owner's committed bundle, built on first use.

        A build of :data:`SLOW_BUILD_SECONDS` or more is logged, rate-limited.
        The turns whose lineage expiry passed are rechecked first (see the
        module docstring).
        """
        self.ensure_vectors(owner)
        with self._lock(owner):
            bundle = self.cache.get_or_build(owner_key(owner), lambda: self._first_use(owner))
            if bundle.due <= time.time():
                self._expire(owner, bundle)
            return bundle

    def _first_use(self, owner: str) -> Bundle:
        """The owner's bundle on its first use: built from the store (the caller holds its lock).

        :class:`server.retrieval._snapshot.IndexSnapshots` loads a snapshot first.
        """
        self._touch(owner)
        return self._timed_build(owner)

    def _timed_build(self, owner: str) -> Bundle:
        start = time.perf_counter()
        bundle = self._build_owner(owner)
        if len(bundle.plain) >= TRIM_AFTER_BUILD:
            release_free_heap()  # the build's transient memory, back to the OS
        took = time.perf_counter() - start
        if took >= SLOW_BUILD_SECONDS:
            LIMITED.log(
                logging.INFO,
                "index_build",
                "built the search index of owners/%s on its first search: %d texts in %.1f s",
                owner,
                len(bundle.plain),
                took,
            )
        return bundle

    def pending_bundle(self, owner: str, thread: str) -> Bundle:
        """A thread's pending bundle, built on first use and again once a turn may have expired.

        It is small, so a rebuild is cheap.
        """
        key = pending_key(owner, thread)
        self.ensure_vectors(owner)
        with self._lock(owner):
            bundle = self.cache.get_or_build(key, lambda: self._build_pending(owner, thread))
            if bundle.due <= time.time():
                self.cache.evict(key)
                bundle = self.cache.get_or_build(key, lambda: self._build_pending(owner, thread))
            return bundle

    def _expire(self, owner: str, bundle: Bundle) -> None:
        """Recheck the owner bundle's turns whose watch time passed.

        Removes from every leg those no longer visible (a pending source of
        their lineage expired) and re-indexes the contexts that quoted them.
        The caller holds the owner's lock.
        """
        now = time.time()
        due = [rid for rid, when in bundle.watch.items() if when <= now]
        for rid in due:
            del bundle.watch[rid]
        bundle.due = min(bundle.watch.values(), default=math.inf)
        seen = {m.rid: m for m in self.store.metas(due)}
        gone = [rid for rid in due if rid not in seen or not general_visible(seen[rid], now)]
        if not gone:
            return
        self._touch(owner)
        bundle.forget_ids(gone)
        seqs: dict[str, list[int]] = {}
        for rid in gone:
            if rid in seen:
                seqs.setdefault(seen[rid].thread, []).append(seen[rid].seq)
        for thread, lost in seqs.items():
            self._recontext(owner, bundle, thread, lost)

    # ------------------------------------------------------------------ contexts

    def _recontext(
        self,
        owner: str,
        bundle: Bundle,
        thread: str,
        seqs: Iterable[int],
        gone: Collection[int] = frozenset(),
    ) -> None:
        """Give the turn after each of ``seqs`` a new contextual text: its predecessor came or went.

        The turn after is the nearest later turn visible in the general index.
        ``gone``: record numbers known to be invisible (a forget's own turns),
        stepped over unread.
        Reads a few rows per seq, never the whole thread.
        """
        found = self.store.visible_neighbours(
            owner, thread, seqs, general_visible, gone=gone, earlier=False
        )
        nexts = {n.rid: n for _, n in found.values() if n is not None}
        self._set_contexts(owner, bundle, thread, list(nexts.values()), gone=gone)

    def _set_contexts(
        self,
        owner: str,
        bundle: Bundle,
        thread: str,
        targets: Sequence[TurnMeta],
        known: dict[int, str] | None = None,
        prevs: Mapping[int, TurnMeta | None] | None = None,
        gone: Collection[int] = frozenset(),
        memo: TermMemo | None = None,
    ) -> None:
        """(Re)index the contextual text of ``targets`` (visible turns of one thread).

        ``known`` holds texts already decrypted (rid -> plain text), ``prevs``
        the nearest earlier visible turn of some targets (seq -> turn or None;
        the others are read from LMDB), ``gone`` record numbers known to be
        invisible (stepped over unread), ``memo`` the update's analysed texts.
        """
        if not targets:
            return
        memo = memo or TermMemo()
        given = prevs or {}
        asked = [t.seq for t in targets if t.seq not in given]
        found = self.store.visible_neighbours(
            owner, thread, asked, general_visible, gone=gone, later=False
        )
        prevs = {**{s: pair[0] for s, pair in found.items()}, **given}
        known = known or {}
        need = {t.rid: t for t in targets if t.rid not in known}
        for before in prevs.values():
            if before is not None and before.rid not in known:
                need.setdefault(before.rid, before)
        texts = {**known, **self._texts(list(need.values()))}
        ids: list[int] = []
        out: list[list[str]] = []
        for turn in targets:
            if turn.rid not in texts:
                continue
            before = prevs[turn.seq]
            prev = texts.get(before.rid, "") if before is not None else ""
            bundle.ctx_prev[turn.rid] = before.rid if before is not None and prev else 0
            ids.append(turn.rid)
            out.append(memo.contextual(turn.time, prev, texts[turn.rid]))
        if ids:
            bundle.ctx.add_terms(np.asarray(ids, np.int64), out)
