"""Dense retrieval over the encrypted store: index upkeep and the search hot path.

One :class:`index.VectorIndex` per owner holds the owner's ``COMMITTED``, live,
untainted turns (FAISS ids are the internal record numbers); one small index
per thread holds that thread's pending turns. Both are built from the
encrypted vectors in LMDB when first needed, kept in an LRU
(:class:`index.IndexCache`), and never written to disk.

The hot path (ARCHITECTURE.md, "Retrieval"): search the owner's index with
over-fetch → recheck every hit in one read transaction through
:func:`server._visibility.searchable` → decrypt the survivors.

Thread rules: every public method may be called from any thread. Builds and
updates of one owner's indexes are serialised by a per-owner lock, so an index
built from a snapshot older than a write can never miss that write's update.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from index import Embedder, IndexCache, VectorIndex, normalize
from server._records import PAYLOAD_CONTENT, TurnMeta
from server._store import Store, TurnView
from server._visibility import indexable, pending_indexable, searchable
from server.errors import InvalidArgument, RecordDeleted

# First fetch: top_k + OVERFETCH candidates; most hits survive the recheck, and
# every candidate costs a metadata decode, so the margin is small and the
# fetch grows 4x per round when the recheck drops too many.
OVERFETCH = 8


@dataclass(slots=True)
class SearchHit:
    view: TurnView
    score: float


def _owner_key(owner: str) -> str:
    return f"o/{owner}"


def _pending_key(owner: str, thread: str) -> str:
    return f"p/{owner}/{thread}"


class Retriever:
    """Index upkeep and dense search for every owner of one store.

    Args:
        store: The record store.
        embedder: The server-side embedder, or None (clients send vectors).
        capacity: Most indexes (owner plus pending-thread) kept in memory.
    """

    def __init__(self, store: Store, embedder: Embedder | None, *, capacity: int = 256) -> None:
        self.store = store
        self.embedder = embedder
        self.cache = IndexCache(capacity)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock(self, owner: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(owner, threading.Lock())

    # ------------------------------------------------------------------ embedding

    def embed_texts(self, texts: Sequence[str]) -> list[npt.NDArray[np.float32] | None]:
        """Server-side embeddings of ``texts``: ``(d,) float32`` unit rows, or None
        for a text with no tokens (it has no direction to index) or without embedder."""
        if self.embedder is None or not texts:
            return [None] * len(texts)
        rows = self.embedder.embed(list(texts))
        return [row if float(np.dot(row, row)) > 0.0 else None for row in rows]

    def query_vector(
        self, owner: str, query_text: str, query_embedding: Sequence[float]
    ) -> npt.NDArray[np.float32] | None:
        """The ``(d,) float32`` unit query, or None when nothing can be compared.

        Raises:
            InvalidArgument: the client vector is non-finite or zero
                (``query_embedding``), or its dimension differs from the owner's
                (reason ``DIMENSION_MISMATCH``); no vector and no embedder.
        """
        dim = self.store.owner_dim(owner) or (self.embedder.dim if self.embedder else None)
        if query_embedding:
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
                    reason="DIMENSION_MISMATCH",
                )
            return vec
        if self.embedder is None:
            raise InvalidArgument(
                "query_embedding", "required: this server has no embedder (--embedder none)"
            )
        if not query_text:
            raise InvalidArgument("query_text", "required when query_embedding is empty")
        row = self.embed_texts([query_text])[0]
        if row is None or (dim is not None and row.shape[0] != dim):
            return None
        return np.asarray(row, dtype=np.float32)

    # ------------------------------------------------------------------ index upkeep

    def _build_owner(self, owner: str) -> VectorIndex:
        now = time.time()
        metas = [m for m in self.store.owner_turns(owner) if indexable(m, now)]
        return self._build(owner, metas)

    def _build_pending(self, owner: str, thread: str) -> VectorIndex:
        now = time.time()
        metas = [m for m in self.store.thread_turns(owner, thread) if pending_indexable(m, now)]
        return self._build(owner, metas)

    def _build(self, owner: str, metas: list[TurnMeta]) -> VectorIndex:
        dim = self.store.owner_dim(owner) or (self.embedder.dim if self.embedder else 1)
        idx = VectorIndex(dim)
        rids, vecs = self.store.embeddings(metas)
        if rids:
            idx.add(np.asarray(rids, dtype=np.int64), vecs)
        return idx

    def owner_index(self, owner: str) -> VectorIndex:
        """The owner's committed index, built on first use."""
        with self._lock(owner):
            return self.cache.get_or_build(_owner_key(owner), lambda: self._build_owner(owner))

    def pending_index(self, owner: str, thread: str) -> VectorIndex:
        """A thread's pending index, built on first use."""
        with self._lock(owner):
            return self.cache.get_or_build(
                _pending_key(owner, thread), lambda: self._build_pending(owner, thread)
            )

    def on_write(self, owner: str, metas: Sequence[TurnMeta]) -> None:
        """Bring loaded indexes in line after turns were appended or committed.

        Committed turns join the owner's index and leave their thread's pending
        index; pending turns join their thread's pending index. Indexes not
        loaded are left alone: they are built from LMDB when first needed.
        """
        if not metas:
            return
        now = time.time()
        with self._lock(owner):
            owner_idx = self.cache.get(_owner_key(owner))
            committed = [m for m in metas if indexable(m, now)]
            pending = [m for m in metas if pending_indexable(m, now)]
            need = (committed if owner_idx is not None else []) + [
                m for m in pending if self.cache.get(_pending_key(owner, m.thread)) is not None
            ]
            rids, vecs = self.store.embeddings(need) if need else ([], None)
            vec_of = dict(zip(rids, vecs, strict=True)) if vecs is not None else {}
            if owner_idx is not None:
                add = [m.rid for m in committed if m.rid in vec_of]
                if add and owner_idx.dim != vec_of[add[0]].shape[0]:
                    # Built before the owner had a dimension: rebuild from LMDB on next use.
                    self.cache.evict(_owner_key(owner))
                elif add:
                    owner_idx.add(np.asarray(add, np.int64), np.vstack([vec_of[r] for r in add]))
            for meta in metas:
                key = _pending_key(owner, meta.thread)
                pidx = self.cache.get(key)
                if pidx is None:
                    continue
                if meta.rid in vec_of and pidx.dim != vec_of[meta.rid].shape[0]:
                    self.cache.evict(key)
                elif meta in pending and meta.rid in vec_of:
                    pidx.add(np.asarray([meta.rid], np.int64), vec_of[meta.rid][None, :])
                else:
                    pidx.remove(np.asarray([meta.rid], np.int64))

    def on_forget(
        self, owner: str, rids: Sequence[int], threads: Sequence[str], whole_owner: bool
    ) -> None:
        """Remove forgotten records from every loaded index (step 2 of a forget)."""
        with self._lock(owner):
            if whole_owner:
                self.cache.evict(_owner_key(owner))
                self.cache.evict_prefix(f"p/{owner}/")
                return
            for thread in threads:
                self.cache.evict(_pending_key(owner, thread))
            if not rids:
                return
            ids = np.asarray(rids, dtype=np.int64)
            pending_keys = [k for k in self.cache.keys() if k.startswith(f"p/{owner}/")]  # noqa: SIM118
            for key in [_owner_key(owner), *pending_keys]:
                idx = self.cache.get(key)
                if idx is not None:
                    idx.remove(ids)

    # ------------------------------------------------------------------ search

    def search(
        self, owner: str, query: npt.NDArray[np.float32], top_k: int, pending_thread: str | None
    ) -> list[SearchHit]:
        """Dense search with recheck.

        Args:
            query: ``(d,) float32`` unit vector.
            top_k: hits wanted, 1..1000.
            pending_thread: a thread id whose pending turns also count.

        Returns:
            Up to ``top_k`` visible hits, best first (score = inner product).
        """
        indexes = [self.owner_index(owner)]
        if pending_thread is not None:
            indexes.append(self.pending_index(owner, pending_thread))
        best: dict[int, tuple[float, TurnMeta, dict[str, bytes]]] = {}
        for idx in indexes:
            if len(idx) == 0 or idx.dim != query.shape[0]:
                continue
            for rid, score, meta, cts in self._visible_hits(
                idx, owner, query, top_k, pending_thread
            ):
                if rid not in best or score > best[rid][0]:
                    best[rid] = (score, meta, cts)
        hits: list[SearchHit] = []
        for score, meta, cts in sorted(best.values(), key=lambda item: -item[0]):
            try:
                view = self.store.turn_view(meta, cts, with_embedding=False)
            except RecordDeleted:  # its key was destroyed after the recheck
                continue
            hits.append(SearchHit(view, score))
            if len(hits) == top_k:
                break
        return hits

    def _visible_hits(
        self,
        idx: VectorIndex,
        owner: str,
        query: npt.NDArray[np.float32],
        top_k: int,
        pending_thread: str | None,
    ) -> list[tuple[int, float, TurnMeta, dict[str, bytes]]]:
        """Search ``idx`` with over-fetch and keep what the recheck lets through.

        Each round rechecks every hit in one read transaction; the fetch grows
        4x until ``top_k`` survive or the index is exhausted.
        """
        k = min(len(idx), top_k + OVERFETCH)
        while True:
            raw = idx.search(query, k)
            rows = self.store.fetch([rid for rid, _ in raw], (PAYLOAD_CONTENT,))
            now = time.time()
            good = []
            for rid, score in raw:
                row = rows.get(rid)
                if row is not None and searchable(row[0], now, owner, pending_thread):
                    good.append((rid, score, row[0], row[1]))
            if len(good) >= top_k or k >= len(idx):
                return good
            k = min(len(idx), k * 4)
