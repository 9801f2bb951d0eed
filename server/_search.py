"""Retrieval over the encrypted store: index upkeep and the search hot path.

Each owner has one bundle of in-memory indexes over its ``COMMITTED``, live,
untainted turns, and each thread one bundle over its pending turns:

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

Memories enter the dense and both plain legs only. A bundle also watches the
times at which a member may stop being visible without any write (a pending
turn's ``expire_time``, a turn's ``lineage_expiry``): when one passes, a pending
bundle is rebuilt and the owner bundle rechecks those turns and removes the
ones no longer visible from every leg, so an expired turn never contributes to
a session's document or a context, even before the sweeper forgets it.

Bundles are built from LMDB (decrypting vectors and texts) when first needed,
not at start (an owner's first search waits for its build; a slow one is
logged), kept in an LRU (:class:`index.IndexCache`) and never written to disk.

Search modes (API.md): ``DENSE`` searches the dense leg only; ``LEXICAL`` fuses
every leg but the dense one (the two BM25 legs, the session leg and the two time
legs); ``HYBRID`` (the default) fuses all six with :func:`index.convex_fusion`
and :data:`index.HYBRID_WEIGHTS` (tuned on LoCoMo conversations 1-5 by
``bench/eval_retrieval.py``). The time legs are English-only heuristics that add
an empty leg (never a filter) to a question they do not apply to. Every candidate is then
rechecked through :func:`server.store.searchable` in one read
transaction and only the survivors are decrypted.

Vectors: before an owner's vectors are used or written, :meth:`Retriever.ensure_vectors`
re-embeds them if another embedder made them (:mod:`server._reembed`), so an
owner's dense index never mixes two models' vectors.

Thread rules: every public method may be called from any thread. Builds and
updates of one owner's bundles are serialised by a per-owner lock, so a bundle
built from a snapshot older than a write can never miss that write's update.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from index import (
    HYBRID_LOWER_BOUNDS,
    HYBRID_SESSIONS,
    HYBRID_WEIGHTS,
    WINDOW_DEPTH,
    Embedder,
    IndexCache,
    LexicalIndex,
    SessionIndex,
    TimeIndex,
    VectorIndex,
    analyze,
    convex_fusion,
    normalize,
    release_free_heap,
)
from server._indexed_text import TermMemo, date_text, indexed_text, session_key
from server._logs import LIMITED
from server._reembed import reembed_owner
from server.errors import DataLoss, InvalidArgument, Reason, RecordDeleted
from server.store import (
    PENDING,
    MemMeta,
    MemoryView,
    RecordMeta,
    Store,
    TurnMeta,
    TurnView,
    general_visible,
    indexable,
    pending_indexable,
    pending_visible,
    searchable,
)

SLOW_BUILD_SECONDS = 1.0
"""An owner index build taking this long or longer is logged (seconds)."""
TRIM_AFTER_BUILD = 5000
"""Texts in a built owner index from which the build ends with
:func:`index.release_free_heap` (2-3 ms at 20k turns)."""
# A dense search asks FAISS for top_k + OVERFETCH candidates; most survive the
# recheck, which reads the rows of the first top_k and of more only when it drops
# some (every row read costs a metadata decode), and the FAISS fetch grows 4x per
# round when the recheck drops too many.
OVERFETCH = 8
# Each leg is cut at this depth before fusion (the depth HYBRID_WEIGHTS was tuned at).
LEG_DEPTH = 30
MODE_DENSE = "DENSE"
MODE_LEXICAL = "LEXICAL"
MODE_HYBRID = "HYBRID"
_LEXICAL_WEIGHTS = HYBRID_WEIGHTS[1:]
_LEXICAL_BOUNDS = HYBRID_LOWER_BOUNDS[1:]
# Vectors decrypted and added at a time when an index is built.
BUILD_CHUNK = 4096

Ranked = list[tuple[int, float]]


@dataclass(slots=True)
class SearchHit:
    view: TurnView | MemoryView
    score: float


@dataclass(slots=True)
class _Bundle:
    """One owner's committed indexes, or one thread's pending indexes."""

    dense: VectorIndex
    plain: LexicalIndex
    ctx: LexicalIndex
    # rid -> rid of the turn its contextual text quotes (0: none). The context
    # is derived from that record; the audit checks it is still the right one.
    ctx_prev: dict[int, int] = field(default_factory=dict)
    sessions: SessionIndex = field(default_factory=SessionIndex)
    times: TimeIndex = field(default_factory=TimeIndex)
    # rid -> when the turn may stop being visible without a write (its pending
    # expiry or its lineage expiry); ``due`` is the earliest (inf: none).
    watch: dict[int, float] = field(default_factory=dict)
    due: float = math.inf

    def __len__(self) -> int:
        """Vectors held (``lethe_index_vectors``)."""
        return len(self.dense)

    def nbytes(self) -> int:
        """Estimated bytes held by every leg and the context map (the index cache's
        byte bound, ``lethe_index_bytes``); ~90 bytes per map entry."""
        legs = self.dense.nbytes() + self.plain.nbytes() + self.ctx.nbytes()
        return legs + self.sessions.nbytes() + self.times.nbytes() + 90 * len(self.ctx_prev)


def _owner_key(owner: str) -> str:
    return f"o/{owner}"


def _pending_key(owner: str, thread: str) -> str:
    return f"p/{owner}/{thread}"


def _add_time_legs(
    bundle: _Bundle, turns: Sequence[TurnMeta], texts: dict[int, str], memo: TermMemo
) -> None:
    """Index turns (whose plain texts are in ``texts``) in the session and time legs,
    and watch the ones that may stop being visible without a write."""
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
        ends = [t for t in (m.expire_time if m.state == PENDING else 0.0, m.lineage_expiry) if t]
        if ends:
            bundle.watch[m.rid] = min(ends)
            bundle.due = min(bundle.due, bundle.watch[m.rid])


class Retriever:
    """Index upkeep and search for every owner of one store.

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
        self.cache: IndexCache[_Bundle] = IndexCache(capacity, max_bytes)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._current: set[str] = set()  # owners whose vectors are the embedder's
        # owner -> removals from its indexes so far (forgets, drops): see on_write
        self._removals: dict[str, int] = {}

    def _lock(self, owner: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(owner, threading.Lock())

    # ------------------------------------------------------------------ embedding

    def ensure_vectors(self, owner: str) -> None:
        """Make sure ``owner``'s stored vectors are this server's embedder's: on the
        owner's first use since start, re-embed them all if another embedder made
        them (:func:`server._reembed.reembed_owner`; one transaction swaps them) and
        drop its loaded bundles. Callers: every path that reads or writes the
        owner's vectors, before it does. Other calls for the owner wait for the
        re-embed (they need its lock).

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
                reembed_owner(self.store, embedder, owner, indexed_text)
                self.cache.evict(_owner_key(owner))
                self.cache.evict_prefix(f"p/{owner}/")
            self._current.add(owner)

    def drop_owner(self, owner: str) -> None:
        """Forget everything held in memory for ``owner`` (its loaded indexes and
        whether its vectors are current): another process changed the owner's
        data (an owner move imported or removed it), so the next use rebuilds
        from the store."""
        with self._lock(owner):
            self._removals[owner] = self._removals.get(owner, 0) + 1
            self.cache.evict(_owner_key(owner))
            self.cache.evict_prefix(f"p/{owner}/")
            self._current.discard(owner)

    def removals(self, owner: str) -> int:
        """How many times records left ``owner``'s indexes so far (each
        :meth:`on_forget` and :meth:`drop_owner` counts one). A writer reads it
        before its write and hands it to :meth:`on_write`."""
        with self._lock(owner):
            return self._removals.get(owner, 0)

    def embed_texts(
        self, texts: Sequence[str], *, owner: str
    ) -> list[npt.NDArray[np.float32] | None]:
        """Server-side embeddings of ``texts`` for records of ``owner`` (whose vectors
        are made current first, :meth:`ensure_vectors`): ``(d,) float32`` unit rows,
        or None for a text with no tokens (it has no direction to index) or without
        embedder."""
        self.ensure_vectors(owner)
        if self.embedder is None or not texts:
            return [None] * len(texts)
        rows = self.embedder.embed(list(texts))
        return [row if float(np.dot(row, row)) > 0.0 else None for row in rows]

    def query_vector(
        self,
        owner: str,
        query_text: str,
        query_embedding: npt.NDArray[np.float32] | Sequence[float] | None,
    ) -> npt.NDArray[np.float32] | None:
        """The ``(d,) float32`` unit query vector, or None when none can be made
        (no embedder and no client vector, or a text without tokens).

        ``query_embedding`` is the client's vector (``(d,)``, as an array from
        ``check_vector`` or a sequence of floats), or None / empty for none.

        Raises:
            InvalidArgument: the client vector is non-finite or zero, or its
                dimension differs from the owner's (reason ``DIMENSION_MISMATCH``).
        """
        self.ensure_vectors(owner)
        dim = self.store.owner_dim(owner) or (self.embedder.dim if self.embedder else None)
        if query_embedding is not None and len(query_embedding):
            try:
                vec: npt.NDArray[np.float32] = normalize(
                    np.asarray(query_embedding, dtype=np.float32)
                )[0]
            except Exception:
                raise InvalidArgument("query_embedding", "must be finite and non-zero") from None
            if dim is not None and vec.shape[0] != dim:
                raise InvalidArgument(
                    "query_embedding",
                    f"dimension {vec.shape[0]} differs from the owner's {dim}",
                    reason=Reason.DIMENSION_MISMATCH,
                )
            return vec
        if self.embedder is None or not query_text:
            return None
        row = self.embedder.embed_queries([query_text])[0]
        if float(np.dot(row, row)) == 0.0 or (dim is not None and row.shape[0] != dim):
            return None
        return np.asarray(row, dtype=np.float32)

    # ------------------------------------------------------------------ bundle builds

    def _texts(self, metas: Sequence[RecordMeta]) -> dict[int, str]:
        """What the plain legs index for each record whose content can be opened:
        ``speaker: text`` of a turn; a memory's text (a graph edge's
        ``subject predicate object`` when it has no text)."""
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
        """The vectors of ``metas``: from ``written`` where the caller holds them
        (see :meth:`on_write`), the others decrypted from LMDB.

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

    def _fill_memories(self, bundle: _Bundle, mems: Sequence[MemMeta]) -> None:
        """Index memories' current versions in every leg (context = their own text)."""
        if not mems:
            return
        texts = self._texts(mems)
        ids = [m.rid for m in mems if m.rid in texts]
        if ids:
            terms = [analyze(texts[r]) for r in ids]
            bundle.plain.add_terms(np.asarray(ids, np.int64), terms)
            bundle.ctx.add_terms(np.asarray(ids, np.int64), terms)
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
        prev_of: dict[int, int],
        memo: TermMemo,
    ) -> dict[int, list[str]]:
        """Terms of the contextual texts of ``targets`` (rids) within ``ordered``
        (one thread's visible turns in seq order); ``texts`` must hold each target
        and its predecessor. Records in ``prev_of`` which turn each text quotes."""
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
        bundle: _Bundle,
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
        _add_time_legs(bundle, metas, texts, memo)
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

    def _new_bundle(self, owner: str) -> _Bundle:
        dim = self.store.owner_dim(owner) or (self.embedder.dim if self.embedder else 1)
        return _Bundle(VectorIndex(dim), LexicalIndex(), LexicalIndex())

    def _build_owner(self, owner: str) -> _Bundle:
        now = time.time()
        by_thread: dict[str, list[TurnMeta]] = {}
        for meta in sorted(self.store.owner_turns(owner), key=lambda m: (m.thread, m.seq)):
            if general_visible(meta, now):
                by_thread.setdefault(meta.thread, []).append(meta)
        metas = [m for ordered in by_thread.values() for m in ordered]
        bundle = self._new_bundle(owner)
        with self.store.key_batch():  # content and vector share a record key: one unwrap
            self._fill(bundle, metas, [m for m in metas if indexable(m, now)], by_thread)
            mems = [m for m in self.store.owner_memories(owner) if general_visible(m, now)]
            self._fill_memories(bundle, mems)
        return bundle

    def _pending_order(self, owner: str, thread: str, now: float) -> list[TurnMeta]:
        return [m for m in self.store.thread_turns(owner, thread) if pending_visible(m, now)]

    def _build_pending(self, owner: str, thread: str) -> _Bundle:
        now = time.time()
        ordered = self._pending_order(owner, thread, now)
        pending = [m for m in ordered if m.state == PENDING]
        bundle = self._new_bundle(owner)
        self._fill(
            bundle, pending, [m for m in pending if pending_indexable(m, now)], {thread: ordered}
        )
        return bundle

    def owner_bundle(self, owner: str) -> _Bundle:
        """The owner's committed bundle, built on first use (a build of
        :data:`SLOW_BUILD_SECONDS` or more is logged, rate-limited); the turns
        whose lineage expiry passed are rechecked first (see the module docstring)."""
        self.ensure_vectors(owner)
        with self._lock(owner):
            bundle = self.cache.get_or_build(_owner_key(owner), lambda: self._timed_build(owner))
            if bundle.due <= time.time():
                self._expire(owner, bundle)
            return bundle

    def _timed_build(self, owner: str) -> _Bundle:
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

    def pending_bundle(self, owner: str, thread: str) -> _Bundle:
        """A thread's pending bundle, built on first use, and again once one of its
        turns may have expired (it is small)."""
        key = _pending_key(owner, thread)
        self.ensure_vectors(owner)
        with self._lock(owner):
            bundle = self.cache.get_or_build(key, lambda: self._build_pending(owner, thread))
            if bundle.due <= time.time():
                self.cache.evict(key)
                bundle = self.cache.get_or_build(key, lambda: self._build_pending(owner, thread))
            return bundle

    def _expire(self, owner: str, bundle: _Bundle) -> None:
        """Recheck the owner bundle's turns whose watch time passed; remove from every
        leg those no longer visible (a pending source of their lineage expired) and
        re-index the contexts that quoted them. The caller holds the owner's lock."""
        now = time.time()
        due = [rid for rid, when in bundle.watch.items() if when <= now]
        for rid in due:
            del bundle.watch[rid]
        bundle.due = min(bundle.watch.values(), default=math.inf)
        seen = {m.rid: m for m in self.store.metas(due)}
        gone = [rid for rid in due if rid not in seen or not general_visible(seen[rid], now)]
        if not gone:
            return
        ids = np.asarray(gone, np.int64)
        for leg in (bundle.dense, bundle.plain, bundle.ctx, bundle.sessions, bundle.times):
            leg.remove(ids)
        seqs: dict[str, list[int]] = {}
        for rid in gone:
            bundle.ctx_prev.pop(rid, None)
            if rid in seen:
                seqs.setdefault(seen[rid].thread, []).append(seen[rid].seq)
        for thread, lost in seqs.items():
            self._recontext(owner, bundle, thread, lost)

    # ------------------------------------------------------------------ upkeep

    def _recontext(
        self,
        owner: str,
        bundle: _Bundle,
        thread: str,
        seqs: Iterable[int],
        gone: Collection[int] = frozenset(),
    ) -> None:
        """Give the turn after each of ``seqs`` (the nearest later turn visible in
        the general index) a new contextual text: its predecessor entered or
        left the index. ``gone``: record numbers known to be invisible (a
        forget's own turns), stepped over unread. Reads a few rows per seq,
        never the whole thread."""
        found = self.store.visible_neighbours(
            owner, thread, seqs, general_visible, gone=gone, earlier=False
        )
        nexts = {n.rid: n for _, n in found.values() if n is not None}
        self._set_contexts(owner, bundle, thread, list(nexts.values()), gone=gone)

    def _set_contexts(
        self,
        owner: str,
        bundle: _Bundle,
        thread: str,
        targets: Sequence[TurnMeta],
        known: dict[int, str] | None = None,
        prevs: Mapping[int, TurnMeta | None] | None = None,
        gone: Collection[int] = frozenset(),
        memo: TermMemo | None = None,
    ) -> None:
        """(Re)index the contextual text of ``targets`` (visible turns of one
        thread); ``known`` holds texts already decrypted (rid -> plain text),
        ``prevs`` the nearest earlier visible turn of some targets (seq -> turn
        or None; the others are read from LMDB), ``gone`` record numbers known
        to be invisible (stepped over unread), ``memo`` the update's analysed texts."""
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
                bundle = self.cache.get(_owner_key(owner))
                if bundle is not None:
                    ids = np.asarray([m.rid for m in mems], np.int64)
                    bundle.dense.remove(ids)
                    bundle.plain.remove(ids)
                    bundle.ctx.remove(ids)
                    self._fill_memories(bundle, [m for m in mems if general_visible(m, now)])
        if not metas:
            return
        with self._lock(owner):
            owner_b = self.cache.get(_owner_key(owner))
            committed = [m for m in metas if general_visible(m, now)]
            if owner_b is not None and committed:
                if written and (removals is None or removals != self._removals.get(owner, 0)):
                    # something left the indexes since: rows as reads see them now
                    committed = [m for m in self.store.metas([m.rid for m in committed])]
                    committed = [m for m in committed if general_visible(m, now)]
                rids, vecs = self._vectors([m for m in committed if indexable(m, now)], written)
                if rids and owner_b.dense.dim != vecs.shape[1] and len(owner_b.dense):
                    self.cache.evict(_owner_key(owner))  # rebuilt from LMDB on next use
                else:
                    texts = {r: w[0] for r, w in (written or {}).items()}
                    self._add_turns(owner, owner_b, committed, rids, vecs, texts)
                    self.cache.trim()  # the owner's bundle grew in place
            for thread in {m.thread for m in metas}:
                key = _pending_key(owner, thread)
                if self.cache.get(key) is not None:
                    self.cache.evict(key)  # small: rebuilt from LMDB on next use

    def _add_turns(
        self,
        owner: str,
        bundle: _Bundle,
        turns: Sequence[TurnMeta],
        rids: Sequence[int],
        vecs: npt.NDArray[np.float32],
        known: Mapping[int, str],
    ) -> None:
        """Index newly visible turns in every leg: their texts, their contexts and
        the contexts of the turns after them (whose predecessor they now are).
        ``known`` holds plain texts already in hand (rid -> text); the others are
        decrypted."""
        texts = {m.rid: known[m.rid] for m in turns if m.rid in known}
        texts.update(self._texts([m for m in turns if m.rid not in known]))
        memo = TermMemo()
        plain_ids = [m.rid for m in turns if m.rid in texts]
        if plain_ids:
            terms = [memo.terms(texts[r]) for r in plain_ids]
            bundle.plain.add_terms(np.asarray(plain_ids, np.int64), terms)
        _add_time_legs(bundle, turns, texts, memo)
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
            self._removals[owner] = self._removals.get(owner, 0) + 1
            if whole_owner:
                self.cache.evict(_owner_key(owner))
                self.cache.evict_prefix(f"p/{owner}/")
                return
            for thread in {*threads, *touched_threads}:
                self.cache.evict(_pending_key(owner, thread))
            if not rids:
                return
            ids = np.asarray(rids, dtype=np.int64)
            bundle = self.cache.get(_owner_key(owner))
            if bundle is None:
                return
            bundle.dense.remove(ids)
            bundle.plain.remove(ids)
            bundle.ctx.remove(ids)
            bundle.sessions.remove(ids)  # its session's document loses its terms
            bundle.times.remove(ids)
            for rid in rids:
                bundle.ctx_prev.pop(rid, None)
                bundle.watch.pop(rid, None)
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
        bundle = self.cache.get(_owner_key(owner))
        if bundle is None:
            return 0
        now = time.time()
        return index_drift(
            bundle, self.store.owner_turns(owner), self.store.owner_memories(owner), now
        )

    # ------------------------------------------------------------------ search

    def search(
        self,
        owner: str,
        query_text: str,
        query: npt.NDArray[np.float32] | None,
        top_k: int,
        pending_thread: str | None,
        mode: str = MODE_HYBRID,
        kinds: frozenset[str] = frozenset(),
        include_turns: bool = True,
    ) -> list[SearchHit]:
        """Search with recheck.

        Args:
            query_text: the query for the lexical legs ("" = none).
            query: ``(d,) float32`` unit vector for the dense leg, or None.
            top_k: hits wanted, 1..1000.
            pending_thread: a thread id whose pending turns also count.
            mode: ``HYBRID``, ``DENSE`` or ``LEXICAL``.
            kinds: memory kinds to return (empty: every kind).
            include_turns: whether turns are returned.

        Returns:
            Up to ``top_k`` visible hits, best first. Scores: inner product for
            DENSE; the fused score in ``[0, 1]`` for LEXICAL and HYBRID. HYBRID
            with only a vector (no text) is DENSE; with only text and no vector
            (no embedder, or a text without tokens) it is LEXICAL.
        """
        bundles = [self.owner_bundle(owner)]
        if pending_thread is not None:
            bundles.append(self.pending_bundle(owner, pending_thread))
        if mode == MODE_HYBRID and not query_text.strip():
            mode = MODE_DENSE  # only a vector: the dense leg alone, with its own scores
        if mode == MODE_HYBRID and query is None:
            mode = MODE_LEXICAL  # no vector could be made: the lexical legs alone
        if mode == MODE_DENSE:
            if query is None:
                return []
            return self._dense_search(
                bundles, owner, query, top_k, pending_thread, kinds, include_turns
            )
        depth = max(LEG_DEPTH, top_k + OVERFETCH)
        terms = analyze(query_text)  # once for the two BM25 legs and the session leg
        plain = _merge([b.plain.search_terms(terms, depth) for b in bundles if len(b.plain)])
        ctx = _merge([b.ctx.search_terms(terms, depth) for b in bundles if len(b.ctx)])
        dense: Ranked = []
        if mode != MODE_LEXICAL:
            dense = _merge(
                [
                    b.dense.search(query, depth)
                    for b in bundles
                    if query is not None and len(b.dense) and b.dense.dim == query.shape[0]
                ]
            )
        sessions, prior, window = _time_legs(bundles, query_text, terms, [dense, plain, ctx])
        if mode == MODE_LEXICAL:
            legs = [plain, ctx, sessions, prior, window]
            fused = convex_fusion(legs, _LEXICAL_WEIGHTS, _LEXICAL_BOUNDS)
        else:
            legs = [dense, plain, ctx, sessions, prior, window]
            fused = convex_fusion(legs, HYBRID_WEIGHTS, HYBRID_LOWER_BOUNDS)
        return self._materialise(fused, owner, top_k, pending_thread, kinds, include_turns)

    def _dense_search(
        self,
        bundles: list[_Bundle],
        owner: str,
        query: npt.NDArray[np.float32],
        top_k: int,
        pending_thread: str | None,
        kinds: frozenset[str],
        include_turns: bool,
    ) -> list[SearchHit]:
        """Dense leg only. The recheck happens once, in :meth:`_materialise`; only
        when it drops so many candidates that fewer than ``top_k`` survive does
        the fetch from FAISS grow (4x per round) and the recheck run again."""
        indexes = [b.dense for b in bundles if len(b.dense) and b.dense.dim == query.shape[0]]
        k = top_k + OVERFETCH
        while True:
            legs = [idx.search(query, min(len(idx), k)) for idx in indexes]
            hits = self._materialise(
                _merge(legs), owner, top_k, pending_thread, kinds, include_turns
            )
            if len(hits) >= top_k or all(k >= len(idx) for idx in indexes):
                return hits
            k *= 4

    def _materialise(
        self,
        ranked: Ranked,
        owner: str,
        top_k: int,
        pending_thread: str | None,
        kinds: frozenset[str] = frozenset(),
        include_turns: bool = True,
    ) -> list[SearchHit]:
        """Recheck candidates in rank order (one read transaction per chunk) and
        decrypt the survivors until ``top_k`` are found (one keystore snapshot
        for them all: ``Store.key_batch``).

        The first chunk is the ``top_k`` best candidates: usually every one
        survives and no other candidate's row is read or decoded. Once the
        recheck has dropped one, each further chunk is the number still
        missing plus :data:`OVERFETCH`.
        """
        hits: list[SearchHit] = []
        if not ranked:
            return hits
        start = 0
        chunk = top_k
        with self.store.key_batch():
            while start < len(ranked):
                part = ranked[start : start + chunk]
                start += len(part)
                rows = self.store.fetch([rid for rid, _ in part])
                now = time.time()
                for rid, score in part:
                    row = rows.get(rid)
                    if row is None or not searchable(row[0], now, owner, pending_thread):
                        continue
                    if not self._kind_ok(row[0], kinds, include_turns):
                        continue
                    try:
                        view = self.store.view_of(row[0], row[1])
                    except RecordDeleted:  # its key was destroyed after the recheck
                        continue
                    except DataLoss:  # one bad record never fails a whole search
                        self.store.note_unreadable(row[0])
                        continue
                    hits.append(SearchHit(view, score))
                    if len(hits) == top_k:
                        return hits
                chunk = top_k - len(hits) + OVERFETCH
        return hits

    @staticmethod
    def _kind_ok(meta: RecordMeta, kinds: frozenset[str], include_turns: bool) -> bool:
        if isinstance(meta, MemMeta):
            return not kinds or meta.kind in kinds
        return include_turns


def index_drift(
    bundle: _Bundle | None, turns: Sequence[TurnMeta], memories: Sequence[MemMeta], now: float
) -> int:
    """The audit's ``index_drift`` of one owner's loaded bundle (0 when none is
    loaded: an index built from LMDB when needed cannot drift).

    Counts ids held that should not be, visible records missing from the
    plain leg, contextual texts that quote a turn other than the nearest
    earlier visible one (a forgotten or sealed one must have been re-indexed
    away), and session documents holding a turn that is not visible, missing
    one that is, or holding it under another session. ``turns`` and
    ``memories`` are every stored record of the owner.
    """
    if bundle is None:
        return 0
    records: list[RecordMeta] = [*turns, *memories]
    visible = {m.rid for m in records if general_visible(m, now)}
    dense = {m.rid for m in records if indexable(m, now)}
    held_dense = {int(i) for i in bundle.dense.ids()}
    held_plain = {int(i) for i in bundle.plain.ids()}
    # Records without text tokens are held but never match; count only ids held
    # that should not be, and visible records missing from the plain leg.
    drift = len(held_dense ^ dense) + len(held_plain - visible) + len(visible - held_plain)
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


def _time_legs(
    bundles: Sequence[_Bundle], query_text: str, terms: Sequence[str], found: Sequence[Ranked]
) -> tuple[Ranked, Ranked, Ranked]:
    """The session leg (of ``terms``, the analysed ``query_text``), the
    time-expression prior (over the ids ``found`` by the other legs) and the
    session-date window of ``query_text``; a heuristic that does not apply gives
    ``[]``."""
    sessions = _merge(
        [b.sessions.search_terms(terms, HYBRID_SESSIONS) for b in bundles if len(b.sessions)]
    )
    timed = [b for b in bundles if len(b.times)]
    candidates = {rid for leg in found for rid, _ in leg}
    prior = _merge([b.times.prior(query_text, candidates) for b in timed])
    window = _merge([b.times.window(b.times.periods(query_text), WINDOW_DEPTH) for b in timed])
    return sessions, prior, window


def _merge(legs: Sequence[Ranked]) -> Ranked:
    """One ranked list from several (owner and pending) of the same leg: best score per id."""
    if not legs:
        return []
    if len(legs) == 1:
        return legs[0]
    best: dict[int, float] = {}
    for leg in legs:
        for rid, score in leg:
            if rid not in best or score > best[rid]:
                best[rid] = score
    return sorted(best.items(), key=lambda item: (-item[1], item[0]))
