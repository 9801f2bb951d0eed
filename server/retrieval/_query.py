"""The search hot path: query vectors, the legs, fusion and the recheck.

Search modes (API.md): ``DENSE`` searches the dense leg only; ``LEXICAL`` fuses
every leg but the dense one (the two BM25 legs, the session leg and the two time
legs); ``HYBRID`` (the default) fuses all six with :func:`index.convex_fusion`
and :data:`index.HYBRID_WEIGHTS` (tuned on LoCoMo conversations 1-5 by
``bench/eval_retrieval.py``). The time legs are English-only heuristics that add
an empty leg (never a filter) to a question they do not apply to. Every candidate is then
rechecked through :func:`server.store.searchable` in one read
transaction and only the survivors are decrypted.

Thread rules: any thread (see :class:`server.retrieval._build.IndexBuilds`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from index import (
    HYBRID_LOWER_BOUNDS,
    HYBRID_SESSIONS,
    HYBRID_WEIGHTS,
    WINDOW_DEPTH,
    analyze,
    convex_fusion,
    normalize,
)
from server.errors import DataLoss, InvalidArgument, Reason, RecordDeleted
from server.retrieval._bundle import Bundle, Ranked
from server.retrieval._follow import IndexFollow
from server.store import MemMeta, MemoryView, RecordMeta, TurnView, searchable

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


@dataclass(slots=True)
class SearchHit:
    view: TurnView | MemoryView
    score: float


class Retriever(IndexFollow):
    """Index upkeep, snapshots and search for every owner of one store.

    Args:
        store: The record store.
        embedder: The server-side embedder, or None (clients send vectors).
        capacity: Most bundles (owner plus pending-thread) kept in memory.
        max_bytes: Most bytes of bundles kept in memory (``nbytes`` estimates;
            the most recently used bundle is kept even when it alone is larger),
            or None for no byte bound. ``lethe serve --index-cache-size``.
    """

    def query_vector(
        self,
        owner: str,
        query_text: str,
        query_embedding: npt.NDArray[np.float32] | Sequence[float] | None,
    ) -> npt.NDArray[np.float32] | None:
        """The ``(d,) float32`` unit query vector (a row of :func:`index.normalize`), or None.

        None when there is no embedder and no client vector, or for a text
        without tokens.

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
        unit: npt.NDArray[np.float32] = normalize(row)[0]
        return unit

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
            owner: the owner whose records are searched.
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
                    b.dense.search(query, depth, unit=True)
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
        bundles: list[Bundle],
        owner: str,
        query: npt.NDArray[np.float32],
        top_k: int,
        pending_thread: str | None,
        kinds: frozenset[str],
        include_turns: bool,
    ) -> list[SearchHit]:
        """Dense leg only: one recheck; the FAISS fetch grows only when too few candidates survive.

        The recheck happens once, in :meth:`_materialise`; only when it drops
        so many candidates that fewer than ``top_k`` survive does the fetch
        from FAISS grow (4x per round) and the recheck run again.
        """
        indexes = [b.dense for b in bundles if len(b.dense) and b.dense.dim == query.shape[0]]
        k = top_k + OVERFETCH
        while True:
            legs = [idx.search(query, min(len(idx), k), unit=True) for idx in indexes]
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
        """Recheck candidates in rank order and decrypt the survivors until ``top_k`` are found.

        One read transaction per chunk; one keystore snapshot for them all
        (``Store.key_batch``).

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


def _time_legs(
    bundles: Sequence[Bundle], query_text: str, terms: Sequence[str], found: Sequence[Ranked]
) -> tuple[Ranked, Ranked, Ranked]:
    """The session leg, the time-expression prior and the session-date window of ``query_text``.

    The session leg is of ``terms`` (the analysed ``query_text``); the
    time-expression prior is over the ids ``found`` by the other legs. A
    heuristic that does not apply gives ``[]``.
    """
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
