r"""In-memory BM25 over int64 ids and texts: the lexical leg of retrieval.

:class:`LexicalIndex` holds one owner's texts as analysed terms and ranks them with
Okapi BM25 (Robertson and Zaragoza, "The Probabilistic Relevance Framework: BM25 and
Beyond", Foundations and Trends in IR 3(4), 2009), scored as ``bm25s`` scores
(Lù, "BM25S: Orders of magnitude faster lexical search via eager sparse scoring",
arXiv:2407.03618, https://github.com/xhluca/bm25s, MIT): a sparse matrix of each
term's precomputed contribution to each document, built here by :func:`bm25_matrix`
(bm25s's own build, bit for bit, without its per-document loop, which starves the
server's other threads of the interpreter lock).

BM25 variant and parameters: the Lucene variant as classified by Kamphuis, de Vries,
Boytsov and Lin, "Which BM25 Do You Mean? A Large-Scale Reproducibility Study of
Scoring Variants", ECIR 2020 - idf ``ln(1 + (N - df + 0.5) / (df + 0.5))`` (never
negative) times ``tf / (tf + k1 (1 - b + b |d| / avgdl))`` (Lucene 8+ drops the
rank-neutral ``(k1 + 1)`` factor) - with ``k1 = 0.9`` and ``b = 0.4``, the defaults of
Anserini (Yang, Fang and Lin, "Anserini: Enabling the Use of Lucene for Information
Retrieval Research", SIGIR 2017). On LoCoMo conversations 1-5 (``bench/eval_retrieval.py``)
they beat Lucene's 1.2/0.75 on plain turns: recall@1 0.351 vs 0.328, recall@10 0.629 vs
0.617 (low ``b``: turns are short and their lengths say little about relevance).

Analyzer (:func:`analyze`), applied to indexed texts and queries alike:

1. lower-case (``str.lower``);
2. split into tokens of two or more Unicode word characters (regex ``\b\w\w+\b``,
   the default ``token_pattern`` of ``bm25s`` and scikit-learn);
3. drop English stopwords: NLTK's 179-word English list as shipped by bm25s
   (``bm25s.stopwords.STOPWORDS_EN_PLUS``). Questions are mostly function words
   ("what", "did", "when", "how"); against the 33-word Lucene set this list raised
   recall@1/@10 on conversations 1-5 from 0.291/0.569 to 0.328/0.617 (k1 1.2, b 0.75);
4. stem with the Snowball English ("Porter2") stemmer from PyStemmer
   (https://snowballstem.org/algorithms/english/stemmer.html), so "running" and "runs"
   both become "run".

Why bm25s and not tantivy (0.27, in-RAM index): measured by
``bench/eval_retrieval.py --compare-libraries`` on LoCoMo (categories 1-4, 1,536
questions, ~590 turns per owner), same analyzer (tantivy: ``TextAnalyzerBuilder`` with
the same regex, lower-case, the same stopwords, its Snowball English stemmer) and
k1 1.2, b 0.75 (tantivy's Python binding cannot change them, so the Anserini parameters
above are out of its reach): recall@1/5/10/20 0.308/0.534/0.611/0.667 (bm25s) vs
0.309/0.533/0.612/0.669 (tantivy), i.e. equal; query p50 50 us vs 101-156 us; one update
(tantivy: delete by term + add + commit + searcher reload) p50 24-66 ms, max ~128 ms on a
419-turn owner, vs a bm25s rebuild after any batch of changes of p50 10 ms at 700
documents and 144 ms at 10,000 (20 ms and 256 ms in a noisier run; the machines are
shared). tantivy also runs writer and merge threads and reserves a 15 MB writer arena
per index, per warm owner.

Updates (segments, as Lucene does): bm25s has no incremental updates, so the index
keeps a *main* segment — the scorer bm25s built over the documents held at some
moment — and a small *delta* of documents added since, plus a mask of main rows
removed or replaced since. A search scores the main segment (masked) with the
contributions precomputed at its build, and the delta directly from its postings
with the current collection statistics (N, document frequencies, mean length), and
merges the two. When the delta and the masked rows together exceed
:data:`REBUILD_FRACTION` of the main segment (and at least :data:`MIN_REBUILD`
documents), the change that crosses the line rebuilds the main segment, so the
cost of rebuilds is amortised over the changes (geometric growth) and a search
right after a write costs about what any search costs. Main-segment scores use
the statistics of their build; between rebuilds they drift by at most the
threshold's share of documents. Each document's terms are analysed once, at
:meth:`LexicalIndex.add`, and interned as term ids, so a rebuild only recounts
frequencies. A term leaves the vocabulary as soon as the last document holding it
is removed.

Threads: any thread may call any method. Updates and rebuilds hold one mutex; a
search takes the current built scorer (immutable once built) without locking, so
searches run concurrently with each other. A search that starts after ``remove``
returns never sees the removed ids.

The index holds plaintext terms. It refuses pickling and writes no file;
:meth:`LexicalIndex.to_state` hands its whole state to a caller that seals it
(Lethe's encrypted index snapshots) and :meth:`LexicalIndex.from_state` makes it
again. A state never holds a removed document: before it is taken, a main segment
with masked rows is rebuilt (masked rows, their vocabulary and the statistics they
entered would otherwise travel with it), and the vocabulary slots of freed term
ids are written empty.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt
import Stemmer
from bm25s.stopwords import STOPWORDS_EN_PLUS

from index._cache import release_free_heap
from index._state import State, strings_from_arrays, strings_to_arrays

__all__ = ["LexicalIndex", "analyze", "bm25_matrix"]

REBUILD_FRACTION = 0.10
"""Delta plus masked rows, as a fraction of the main segment, that trigger a rebuild."""
MIN_REBUILD = 512
"""Documents a delta may hold before any rebuild is considered."""
TRIM_AFTER_BUILD = 5000
"""Documents in a main segment from which its build ends with :func:`index.release_free_heap`.

The build's transient arrays were freed into the building thread's C heap,
which kept them: a 100k-turn owner's first search (both BM25 legs built)
left about 70 MiB there for good."""

K1 = 0.9
"""BM25 term-frequency saturation (Anserini's default; Lucene's is 1.2)."""
B = 0.4
"""BM25 document-length normalisation (Anserini's default; Lucene's is 0.75)."""

_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")
_STOPWORDS = frozenset(STOPWORDS_EN_PLUS)
_DOC_BYTES = 112
"""Estimated bytes per held document besides 4 per term occurrence (its dict entry, its
id, the bytes object of its packed term ids)."""
_TERM_BYTES = 135
"""Estimated bytes per vocabulary term, counted once per vocabulary that holds it."""
_POSTING_BYTES = 70
"""Estimated bytes per delta posting (an id -> tf entry)."""
_INT64_MIN = int(np.iinfo(np.int64).min)
_INT64_MAX = int(np.iinfo(np.int64).max)

_stemmer_local = threading.local()


def _stemmer() -> Any:
    """One PyStemmer instance per thread (a ``Stemmer`` object is not thread-safe)."""
    stemmer = getattr(_stemmer_local, "stemmer", None)
    if stemmer is None:
        stemmer = Stemmer.Stemmer("english")
        _stemmer_local.stemmer = stemmer
    return stemmer


def analyze(text: str) -> list[str]:
    """Turn text into BM25 terms: lower-case, word tokens, stopwords out, Snowball stems.

    Args:
        text: Any string.

    Returns:
        Terms in text order, repeats kept (they are term frequencies).
    """
    tokens = [t for t in _TOKEN_RE.findall(text.lower()) if t not in _STOPWORDS]
    stems: list[str] = _stemmer().stemWords(tokens)
    return stems


def _as_id_list(ids: Iterable[Any] | npt.ArrayLike) -> list[int]:
    """Validate ids as distinct-or-not int64 values.

    Raises:
        ValueError: ``ids`` is not 1-D, holds a non-integer (``bool`` included), or
            holds a value outside int64.
    """
    raw = np.asarray(ids)
    if raw.ndim != 1:
        raise ValueError(f"ids must be 1-D, got ndim {raw.ndim}")
    if raw.size == 0:
        return []
    if raw.dtype == np.bool_ or not np.issubdtype(raw.dtype, np.integer):
        raise ValueError(f"ids must be integers, got dtype {raw.dtype}")
    out = [int(i) for i in raw.tolist()]
    if min(out) < _INT64_MIN or max(out) > _INT64_MAX:
        raise ValueError("ids must fit in int64")
    return out


_CHUNK_TERMS = 1 << 17
"""Term occurrences counted per step of :func:`bm25_matrix` (and copied per step of
``_flat``): each NumPy call then works on at most a few MiB, so no single
call holds the interpreter lock for long (see :func:`bm25_matrix`), and a
step's temporaries (~80 bytes an occurrence: int64 keys, their sort, float64
contributions) stay small beside the result. At 1 << 20, with the whole
matrix counted, concatenated and sorted at once, a 100k-turn owner's contextual
leg (2.8 M non-zeros) peaked 91 MiB above the index (``tracemalloc``) in 0.8 s;
at 1 << 17, placing each run into its columns, 36 MiB in 0.5 s."""


def _chunks(lengths: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """``(start, end, terms)`` runs of documents of about :data:`_CHUNK_TERMS` terms.

    Each run holds at least one document; together they cover ``lengths`` in order.
    """
    start = 0
    while start < len(lengths):
        end, size = start, 0
        while end < len(lengths) and (size == 0 or size + lengths[end] <= _CHUNK_TERMS):
            size += lengths[end]
            end += 1
        yield start, end, size
        start = end


def _pack(term_ids: Sequence[int]) -> bytes:
    """A document's term ids as :attr:`LexicalIndex._docs` holds them: native ``int32`` bytes."""
    return np.asarray(term_ids, dtype=np.int32).tobytes()


def _unpack(doc: bytes) -> list[int]:
    """The term ids :func:`_pack` packed, in order."""
    return memoryview(doc).cast("i").tolist()


def _joined(docs: Sequence[bytes]) -> npt.NDArray[np.int32]:
    """Packed documents laid end to end in one step, ``(total,) int32`` (read-only).

    For a run of :func:`_chunks`, already bounded by :data:`_CHUNK_TERMS`.
    """
    return np.frombuffer(b"".join(docs), dtype=np.int32)


def _flat(docs: Sequence[bytes]) -> npt.NDArray[np.int32]:
    """Packed documents laid end to end, ``(total,) int32``, joined by :data:`_CHUNK_TERMS`."""
    lengths = [len(d) >> 2 for d in docs]
    out = np.empty(sum(lengths), dtype=np.int32)
    at = 0
    for start, end, size in _chunks(lengths):
        out[at : at + size] = _joined(docs[start:end])
        at += size
    return out


def bm25_matrix(
    docs: Sequence[npt.NDArray[np.int32]], n_terms: int, k1: float, b: float
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """The BM25 (Lucene variant) contribution of every term to every document, in CSC form.

    The same matrix, bit for bit, as ``bm25s.BM25(k1=k1, b=b, method="lucene")
    .build_index_from_ids(range(n_terms), docs)`` (Lù, arXiv:2407.03618; the
    formula from Kamphuis et al., ECIR 2020: ``idf = ln(1 + (N - df + 0.5) /
    (df + 0.5))``, ``tfc = tf / (tf + k1 * (1 - b + b * dl / avgdl))``, each
    contribution computed in float64 and stored as float32), which
    ``tests/index/test_index_lexical.py`` checks. Built with a few NumPy calls
    over :data:`_CHUNK_TERMS` term occurrences at a time instead of bm25s's
    per-document Python loop, during which no other thread got the
    interpreter lock: a 12-million-term rebuild kept a thread that sleeps
    1 ms at a time waiting 0.38-0.44 s; here 17-19 ms.

    Args:
        docs: ``n`` arrays of term ids (``int32`` in ``[0, n_terms)``), in text order.
        n_terms: The number of columns (term ids), ``>= 1``.
        k1: BM25 term-frequency saturation, ``> 0``.
        b: BM25 length normalisation in ``[0, 1]``.

    Returns:
        ``(data, indices, indptr)``: ``(nnz,) float32`` contributions, ``(nnz,) int32``
        document rows (ascending within a column), ``(n_terms + 1,) int64`` column starts.
    """
    lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
    return _bm25_columns(
        lengths, lambda start, end: np.concatenate(docs[start:end]), n_terms, k1, b
    )


def _bm25_columns(
    lengths: npt.NDArray[np.int64],
    terms_of: Callable[[int, int], npt.NDArray[np.int32]],
    n_terms: int,
    k1: float,
    b: float,
    df: npt.NDArray[np.int64] | None = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """:func:`bm25_matrix` of documents given by their lengths and their terms.

    ``terms_of(start, end)`` gives the term ids (``int32``) of documents
    ``start`` to ``end - 1`` laid end to end (per run of :func:`_chunks`).
    ``df``: each term's document frequency ``(n_terms,)``, if the caller
    keeps it (:class:`LexicalIndex` does: its reference counts); else counted
    in a first pass over the documents.

    Runs of about :data:`_CHUNK_TERMS` term occurrences at a time: with the
    document frequencies known, each run's contributions are computed and
    placed straight into their columns (a run's rows are after the runs before it, so each
    column stays in ascending rows). Beside the result (8 bytes a non-zero)
    only one run's temporaries are held: the contextual leg of a 100k-turn
    owner, 2.8 M non-zeros, held ~24 bytes a non-zero more when the whole
    matrix was counted, concatenated and sorted at once (~45 MiB at the peak
    of the first search after a start without a snapshot).
    """
    n = len(lengths)
    runs = [(start, end) for start, end, size in _chunks(lengths.tolist()) if size]

    def counted(
        start: int, end: int
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """``(rows, terms, tfs)`` of one run, ordered by row and then term."""
        flat = terms_of(start, end).astype(np.int64)
        rows = np.repeat(np.arange(start, end, dtype=np.int64), lengths[start:end])
        keys, tf = np.unique(rows * n_terms + flat, return_counts=True)
        del flat, rows
        return (
            (keys // n_terms).astype(np.int32),
            (keys % n_terms).astype(np.int32),
            tf.astype(np.int32),
        )

    if df is None:
        df = np.zeros(n_terms, dtype=np.int64)
        for start, end in runs:
            df += np.bincount(counted(start, end)[1], minlength=n_terms)
    idf = np.zeros(n_terms, dtype=np.float32)
    held = df > 0
    if held.any():
        # math.log per distinct document frequency, as bm25s computes it (np.log
        # may differ from libm in the last place).
        distinct = np.unique(df[held])
        logs = [math.log(1 + (n - d + 0.5) / (d + 0.5)) for d in distinct.tolist()]
        idf[held] = np.asarray(logs, dtype=np.float32)[np.searchsorted(distinct, df[held])]
    avgdl = lengths.mean() if n else np.float64(1.0)
    norm = k1 * ((1 - b) + (b * lengths.astype(np.float64)) / avgdl)
    indptr = np.zeros(n_terms + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    data = np.empty(int(indptr[-1]), dtype=np.float32)
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    fill = indptr[:-1].copy()  # each column's next free slot
    for start, end in runs:
        row, term, tf = counted(start, end)
        t = tf.astype(np.float64)
        contrib = (idf[term].astype(np.float64) * (t / (norm[row] + t))).astype(np.float32)
        order = np.argsort(term, kind="stable")  # by term, rows ascending within each
        by_term = term[order]
        first = np.flatnonzero(np.r_[True, by_term[1:] != by_term[:-1]])
        counts = np.diff(np.r_[first, len(by_term)])
        at = fill[by_term] + (np.arange(len(by_term)) - np.repeat(first, counts))
        data[at] = contrib[order]
        indices[at] = row[order]
        fill[by_term[first]] += counts
    return data, indices, indptr


def _frozen(
    ids: npt.NDArray[np.int64],
    data: npt.NDArray[np.float32],
    indices: npt.NDArray[np.int32],
    indptr: npt.NDArray[np.int64],
) -> tuple[
    npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int32], npt.NDArray[np.int64]
]:
    """A main segment's arrays made read-only, so a state may hand them over uncopied."""
    for array in (ids, data, indices, indptr):
        array.flags.writeable = False
    return ids, data, indices, indptr


@dataclass(frozen=True)
class _Built:
    """A scorer over the documents held at its build: the main segment."""

    vocab: dict[str, int]  # term -> column; empty when no document holds a term
    ids: npt.NDArray[np.int64]  # (n,) id of each document row
    data: npt.NDArray[np.float32]  # (nnz,) BM25 contributions, CSC by term
    indices: npt.NDArray[np.int32]  # (nnz,) document row of each contribution
    indptr: npt.NDArray[np.int64]  # (n_terms + 1,) column starts into data/indices
    order: npt.NDArray[np.int64]  # (n,) rows by ascending id (``np.argsort(ids)``)
    alive: npt.NDArray[np.bool_]  # (n,) False once a row's document is removed or replaced

    def row_of(self, id_: int) -> int | None:
        """The row of document ``id_``, or None if this segment does not hold it.

        A binary search of ``ids`` through ``order`` (16 bytes a row, where a
        dict of ids to rows took about 110).
        """
        at = int(np.searchsorted(self.ids, id_, sorter=self.order))
        if at == len(self.ids):
            return None
        row = int(self.order[at])
        return row if int(self.ids[row]) == id_ else None

    def search(self, terms: Sequence[str], k: int) -> list[tuple[int, float]]:
        term_ids = [self.vocab[t] for t in terms if t in self.vocab]
        if not term_ids:
            return []
        # bm25s's eager score matrix in CSC form: column t holds the BM25 contribution
        # of term t to every document containing it. The query's columns, laid end to
        # end, are summed per document by one ``bincount`` (in float64, in query-term
        # order: the same sums as adding column by column). Same scores as
        # ``BM25.get_scores_from_ids`` without its per-term ``np.add.at``.
        data, indices, indptr = self.data, self.indices, self.indptr
        if len(term_ids) == 1:
            start, end = indptr[term_ids[0]], indptr[term_ids[0] + 1]
            rows, contrib = indices[start:end], data[start:end]
        else:
            spans = [(indptr[t], indptr[t + 1]) for t in term_ids]
            rows = np.concatenate([indices[a:b] for a, b in spans])
            contrib = np.concatenate([data[a:b] for a, b in spans])
        scores = np.bincount(rows, weights=contrib, minlength=len(self.ids))
        scores *= self.alive
        hits = np.flatnonzero(scores > 0.0)
        if len(hits) > k:
            hits = hits[np.argpartition(-scores[hits], k - 1)[:k]]
        ids, found = self.ids[hits], scores[hits]
        # Best first; equal scores by ascending id, so results are deterministic.
        order = np.lexsort((ids, -found))
        return list(zip(ids[order].tolist(), found[order].tolist(), strict=True))


class LexicalIndex:
    """BM25 search over texts keyed by int64 ids, held only in memory.

    Args:
        k1: BM25 term-frequency saturation, ``> 0``; default :data:`K1`.
        b: BM25 length normalisation in ``[0, 1]``; default :data:`B`.

    Raises:
        ValueError: ``k1 <= 0`` or ``b`` outside ``[0, 1]``.
    """

    def __init__(self, k1: float = K1, b: float = B) -> None:
        if not k1 > 0.0:
            raise ValueError(f"k1 must be > 0, got {k1}")
        if not 0.0 <= b <= 1.0:
            raise ValueError(f"b must be in [0, 1], got {b}")
        self._k1 = k1
        self._b = b
        self._lock = threading.Lock()
        # id -> term ids in text order, packed as native int32 (``_pack``): a bytes
        # object is one allocation of 33 bytes plus the ids, an array three of ~200.
        self._docs: dict[int, bytes] = {}
        self._vocab: dict[str, int] = {}  # term -> term id, only terms some doc holds
        self._refs: list[int] = []  # term id -> number of held docs containing it
        self._terms: list[str] = []  # term id -> term (valid while its refs > 0)
        self._free: list[int] = []  # term ids free for reuse
        self._length = 0  # total terms of the held documents (for the mean length)
        self._built: _Built | None = None
        self._masked = 0  # main rows masked since the build
        self._delta: set[int] = set()  # ids added or replaced since the build
        self._post: dict[int, dict[int, int]] = {}  # delta postings: term id -> {id: tf}
        self._rebuilds = 0

    def add(self, ids: npt.ArrayLike, texts: Sequence[str]) -> None:
        """Index texts, replacing any already held under the same ids.

        Texts are analysed here (outside the lock); the scorer is rebuilt by the next
        search. A text without terms (e.g. only stopwords) is held but never matches.
        The batch is validated in full before the index changes.

        Args:
            ids: ``(n,)`` integers within int64, distinct.
            texts: ``n`` strings.

        Raises:
            ValueError: ``ids`` is invalid, has duplicates, or its length differs from
                ``len(texts)``.
            TypeError: An element of ``texts`` is not a ``str``.
        """
        items = list(texts)
        if not all(isinstance(t, str) for t in items):
            raise TypeError("texts must be strings")
        self.add_terms(ids, [analyze(t) for t in items])

    def add_terms(self, ids: npt.ArrayLike, terms: Sequence[Sequence[str]]) -> None:
        """Add texts already analysed, as :meth:`add` adds texts.

        ``terms[i]`` is ``analyze(text)`` of the i-th text, so a caller that indexes
        one text in several legs (or inside a longer text: the analysis of texts
        joined by whitespace is the concatenation of their analyses) analyses it once.

        Args:
            ids: ``(n,)`` integers within int64, distinct.
            terms: ``n`` sequences of terms, in text order.

        Raises:
            ValueError: ``ids`` is invalid, has duplicates, or its length differs from
                ``len(terms)``.
        """
        id_list = _as_id_list(ids)
        analysed = terms if isinstance(terms, list) else list(terms)
        if len(id_list) != len(analysed):
            raise ValueError(f"got {len(id_list)} ids for {len(analysed)} texts")
        if len(set(id_list)) != len(id_list):
            raise ValueError("ids must be distinct within one add")
        if not id_list:
            return
        with self._lock:
            for id_, doc in zip(id_list, analysed, strict=True):
                self._drop(id_)
                held = self._intern(doc)
                self._docs[id_] = _pack(held)
                self._length += len(held)
                if self._built is not None:
                    self._delta.add(id_)
                    for tid in held:
                        post = self._post.setdefault(tid, {})
                        post[id_] = post.get(id_, 0) + 1
            self._maybe_rebuild()

    def remove(self, ids: npt.ArrayLike) -> int:
        """Delete the texts held under ``ids``; absent ids are ignored.

        Args:
            ids: ``(n,)`` integers within int64.

        Returns:
            The number of texts removed.

        Raises:
            ValueError: ``ids`` is not 1-D integers within int64.
        """
        id_list = _as_id_list(ids)
        removed = 0
        with self._lock:
            for i in set(id_list):
                removed += self._drop(i)
            if removed:
                self._maybe_rebuild()
        return removed

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Rank held texts by BM25 against ``query``.

        Rebuilds the scorer first if the index changed since the last search
        (see the module docstring for the cost).

        Args:
            query: Free text, analysed like indexed texts.
            k: Maximum number of results, ``>= 1``.

        Returns:
            Up to ``k`` pairs ``(id, score)`` with ``score > 0`` (BM25, unbounded above),
            best first; ties by ascending id. Empty when no query term is held.

        Raises:
            ValueError: ``k < 1``.
            TypeError: ``query`` is not a ``str``.
        """
        if not isinstance(query, str):
            raise TypeError("query must be a string")
        return self.search_terms(analyze(query), k)

    def search_terms(self, terms: Sequence[str], k: int) -> list[tuple[int, float]]:
        """Search with a query already analysed (``analyze(query)``), as :meth:`search`.

        Several indexes searched with one query then analyse it once.

        Args:
            terms: The query's terms, as :func:`analyze` gives them.
            k: Maximum number of results, ``>= 1``.

        Returns:
            As :meth:`search`.

        Raises:
            ValueError: ``k < 1``.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        with self._lock:
            if self._built is None:
                self._built = self._build()
            built = self._built
            delta = self._delta_search(terms) if self._delta else []
        main = built.search(terms, k)
        if not delta:
            return main
        # Best first; equal scores by ascending id, so results are deterministic.
        return sorted([*main, *delta], key=lambda hit: (-hit[1], hit[0]))[:k]

    def _delta_search(self, terms: Sequence[str]) -> list[tuple[int, float]]:
        """BM25 (Lucene variant) of the delta documents with the current collection statistics.

        The caller holds the lock.
        """
        n = len(self._docs)
        avgdl = self._length / n if n else 1.0
        scores: dict[int, float] = {}
        for term in terms:
            tid = self._vocab.get(term, -1)
            post = self._post.get(tid)
            if not post:
                continue
            df = self._refs[tid]
            idf = float(np.log(1.0 + (n - df + 0.5) / (df + 0.5)))
            for id_, tf in post.items():
                norm = self._k1 * (1.0 - self._b + self._b * (len(self._docs[id_]) >> 2) / avgdl)
                scores[id_] = scores.get(id_, 0.0) + idf * tf / (tf + norm)
        return [(i, s) for i, s in scores.items() if s > 0.0]

    def _maybe_rebuild(self) -> None:
        """Rebuild the main segment once the delta and the masked rows outgrow it.

        The module docstring gives the threshold. The caller holds the lock.
        """
        built = self._built
        if built is None:
            return
        changed = len(self._delta) + self._masked
        if changed > max(MIN_REBUILD, REBUILD_FRACTION * len(built.ids)):
            self._built = self._build()

    def _intern(self, terms: list[str]) -> list[int]:
        """Map terms to term ids, counting one reference per distinct term; holds the lock."""
        out = []
        for term in terms:
            tid = self._vocab.get(term)
            if tid is None:
                tid = self._free.pop() if self._free else len(self._refs)
                if tid == len(self._refs):
                    self._refs.append(0)
                    self._terms.append(term)
                else:
                    self._terms[tid] = term
                self._vocab[term] = tid
            out.append(tid)
        for tid in set(out):
            self._refs[tid] += 1
        return out

    def _drop(self, id_: int) -> int:
        """Forget one document and any term no other document holds; holds the lock.

        Returns:
            1 if the document was held, else 0.
        """
        doc = self._docs.pop(id_, None)
        if doc is None:
            return 0
        self._length -= len(doc) >> 2
        held = set(_unpack(doc))
        built = self._built
        if id_ in self._delta:
            self._delta.discard(id_)
            for tid in held:
                post = self._post.get(tid)
                if post is not None:
                    post.pop(id_, None)
                    if not post:
                        del self._post[tid]
        elif built is not None:
            row = built.row_of(id_)
            if row is not None and built.alive[row]:
                built.alive[row] = False
                self._masked += 1
        for tid in held:
            self._refs[tid] -= 1
            if self._refs[tid] == 0:  # the last document holding the term
                self._free.append(tid)
                del self._vocab[self._terms[tid]]
        return 1

    def _build(self) -> _Built:
        """Build a scorer over the held documents; the caller holds ``self._lock``.

        Term ids freed by removals stay as empty columns (document frequency 0, idf 0)
        until reused; they match no query because only held terms are in the vocabulary.
        """
        self._rebuilds += 1
        self._delta.clear()
        self._post.clear()
        self._masked = 0
        ids = np.fromiter(self._docs.keys(), dtype=np.int64, count=len(self._docs))
        order = np.argsort(ids, kind="stable")
        alive = np.ones(len(ids), dtype=np.bool_)
        if not self._vocab:
            empty = np.zeros(0, dtype=np.float32)
            no_terms = np.zeros(0, np.int32)
            return _Built({}, ids, empty, no_terms, np.zeros(1, np.int64), order, alive)
        docs = list(self._docs.values())
        lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs)) >> 2
        data, indices, indptr = _bm25_columns(
            lengths,
            lambda start, end: _joined(docs[start:end]),
            len(self._refs),
            self._k1,
            self._b,
            np.asarray(self._refs, dtype=np.int64),  # documents holding each term: its df
        )
        if len(ids) >= TRIM_AFTER_BUILD:
            release_free_heap()  # the build's transients: ~32 bytes a posting (bm25_matrix)
        return _Built(dict(self._vocab), *_frozen(ids, data, indices, indptr), order, alive)

    def nbytes(self) -> int:
        """An estimate of the bytes this index holds (for the index cache's bound).

        The main segment's arrays exactly (``data``, ``indices``, ``indptr``,
        ``ids``, ``order``, ``alive``), plus CPython object sizes for the rest: per
        held document :data:`_DOC_BYTES` (its dict entry, its id, its packed term
        ids' bytes object) and 4 bytes per term occurrence; per vocabulary term
        :data:`_TERM_BYTES`; per delta posting :data:`_POSTING_BYTES`. The
        constants were measured with ``tracemalloc`` on CPython 3.11
        (``tests/index/test_index_lexical.py`` checks the estimate against it).
        O(1) plus the number of delta terms.
        """
        with self._lock:
            held = len(self._docs) * _DOC_BYTES + 4 * self._length
            held += len(self._vocab) * _TERM_BYTES
            held += sum(len(p) for p in self._post.values()) * _POSTING_BYTES
            built = self._built
            if built is not None:
                arrays = (built.data, built.indices, built.indptr, built.ids, built.order)
                held += sum(a.nbytes for a in (*arrays, built.alive))
                held += len(built.vocab) * _TERM_BYTES
            return held

    @property
    def parameters(self) -> tuple[float, float]:
        """``(k1, b)``, the BM25 parameters this index ranks with."""
        return self._k1, self._b

    @property
    def rebuilds(self) -> int:
        """How many times the main segment has been built (for benchmarks and tests)."""
        return self._rebuilds

    def ids(self) -> npt.NDArray[np.int64]:
        """All ids held, for audits of drift between the index and the store.

        Returns:
            ``(len(self),) int64``, ascending.
        """
        with self._lock:
            held = np.fromiter(self._docs.keys(), dtype=np.int64, count=len(self._docs))
        return np.sort(held)

    def terms_of(self, ids: Iterable[int] | None = None) -> dict[int, list[str]]:
        """The analysed terms of held texts, in text order (what :meth:`add` made of them).

        Lets a caller compare texts already indexed (word shingles, say) without
        the texts themselves.

        Args:
            ids: the ids wanted (absent ones are left out); None for every held text.

        Returns:
            ``{id: terms}``, each list a new one the caller may keep.
        """
        with self._lock:
            terms = self._terms
            wanted = self._docs.keys() if ids is None else ids
            return {
                int(i): [terms[t] for t in _unpack(doc)]
                for i in wanted
                if (doc := self._docs.get(int(i))) is not None
            }

    def __len__(self) -> int:
        """Number of texts held."""
        with self._lock:
            return len(self._docs)

    def __contains__(self, id_: object) -> bool:
        """Whether a text is held under ``id_`` (an ``int``; anything else is absent)."""
        if not isinstance(id_, (int, np.integer)) or isinstance(id_, bool):
            return False
        with self._lock:
            return int(id_) in self._docs

    def to_state(self) -> State:
        """The whole index as a :data:`index.State` (see :mod:`index._state`).

        Under the mutex: first the main segment is rebuilt if it has masked
        rows or was never built (so the state holds no removed document, and a
        restored index searches without a rebuild), then the documents (term
        ids, in insertion order), the vocabulary by term id (freed ids empty),
        the free list and the delta's ids are copied out; the main segment's
        arrays, read-only, are handed over as they are (a rebuild replaces
        them, never writes them). The delta's postings are not kept: they
        follow from its documents.

        Returns:
            ``(meta, arrays)``; see the source for the array names.
        """
        with self._lock:
            if self._built is None or self._masked:
                self._built = self._build()
            built = self._built
            docs = self._docs
            lengths = np.fromiter(map(len, docs.values()), np.int64, count=len(docs)) >> 2
            doc_ptr = np.zeros(len(docs) + 1, np.int64)
            np.cumsum(lengths, out=doc_ptr[1:])
            flat = _flat(list(docs.values()))
            terms = [t if r > 0 else "" for t, r in zip(self._terms, self._refs, strict=True)]
            blob, term_ptr = strings_to_arrays(terms)
            meta: dict[str, Any] = {
                "kind": "LexicalIndex",
                "k1": self._k1,
                "b": self._b,
                "length": self._length,
                "rebuilds": self._rebuilds,
            }
            arrays: dict[str, npt.NDArray[Any]] = {
                "doc_ids": np.fromiter(docs.keys(), np.int64, count=len(docs)),
                "doc_ptr": doc_ptr,
                "doc_terms": flat,
                "term_blob": blob,
                "term_ptr": term_ptr,
                "refs": np.asarray(self._refs, np.int64),
                "free": np.asarray(self._free, np.int64),
                "delta": np.fromiter(self._delta, np.int64, count=len(self._delta)),
                "built_vocab": np.fromiter(built.vocab.values(), np.int64, count=len(built.vocab)),
                # read-only (``_frozen``): handed over, not copied
                "built_ids": built.ids,
                "built_data": built.data,
                "built_indices": built.indices,
                "built_indptr": built.indptr,
            }
        return meta, arrays

    @classmethod
    def from_state(cls, state: State) -> LexicalIndex:
        """The index :meth:`to_state` described, ranking as it did.

        Args:
            state: ``(meta, arrays)`` from :meth:`to_state` (arrays may be views
                of a buffer: what is kept is copied).

        Returns:
            A new index with the same documents, vocabulary, main segment and delta.

        Raises:
            ValueError: The state is not a :meth:`to_state` of this version, or
                its parts disagree.
        """
        meta, arrays = state
        try:
            if meta["kind"] != "LexicalIndex":
                raise ValueError(f"not a LexicalIndex state: {meta['kind']!r}")
            out = cls(float(meta["k1"]), float(meta["b"]))
            length, rebuilds = int(meta["length"]), int(meta["rebuilds"])
            doc_ids, doc_ptr = arrays["doc_ids"].tolist(), arrays["doc_ptr"].tolist()
            flat_array = np.asarray(arrays["doc_terms"], dtype=np.int32)
            flat_bytes = flat_array.astype("=i4").tobytes()
            terms = strings_from_arrays(arrays["term_blob"], arrays["term_ptr"])
            refs, free = arrays["refs"].tolist(), arrays["free"].tolist()
            delta = arrays["delta"].tolist()
            built_vocab = arrays["built_vocab"].tolist()
            ids = np.array(arrays["built_ids"], dtype=np.int64)
            data = np.array(arrays["built_data"], dtype=np.float32)
            indices = np.array(arrays["built_indices"], dtype=np.int32)
            indptr = np.array(arrays["built_indptr"], dtype=np.int64)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed LexicalIndex state: {exc!r}") from None
        vocab_size = len(terms)
        if (
            len(refs) != vocab_size
            or len(doc_ptr) != len(doc_ids) + 1
            or doc_ptr[-1] != len(flat_array)
        ):
            raise ValueError("the LexicalIndex state's parts disagree")
        if len(flat_array) and (int(flat_array.min()) < 0 or int(flat_array.max()) >= vocab_size):
            raise ValueError("the LexicalIndex state's documents name unknown terms")
        if len(indptr) > vocab_size + 1 or any(t < 0 or t >= len(indptr) - 1 for t in built_vocab):
            raise ValueError("the LexicalIndex state's main segment names unknown terms")
        if len(indices) != len(data) or (len(indices) and int(indices.max()) >= len(ids)):
            raise ValueError("the LexicalIndex state's main segment is malformed")
        docs = {
            i: flat_bytes[4 * a : 4 * b]
            for i, (a, b) in zip(doc_ids, itertools.pairwise(doc_ptr), strict=True)
        }
        if len(docs) != len(doc_ids) or not set(delta) <= docs.keys():
            raise ValueError("the LexicalIndex state's documents are malformed")
        order = np.argsort(ids, kind="stable")
        if len(ids) and (
            bool((ids[order][1:] == ids[order][:-1]).any()) or not set(ids.tolist()) <= docs.keys()
        ):
            raise ValueError("the LexicalIndex state's main segment holds unknown documents")
        out._docs = docs
        out._terms = terms
        out._refs = refs
        out._free = free
        out._vocab = {terms[t]: t for t in range(vocab_size) if refs[t] > 0}
        out._length = length
        out._rebuilds = rebuilds
        built = _Built(
            {terms[t]: t for t in built_vocab},
            *_frozen(ids, data, indices, indptr),
            order,
            np.ones(len(ids), dtype=np.bool_),
        )
        out._built = built
        out._delta = set(delta)
        for id_ in delta:
            for tid in _unpack(docs[id_]):
                post = out._post.setdefault(tid, {})
                post[id_] = post.get(id_, 0) + 1
        return out

    def __repr__(self) -> str:
        return f"LexicalIndex(k1={self._k1}, b={self._b}, size={len(self)})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("LexicalIndex holds plaintext terms and cannot be pickled")
