"""Inner-product search over unit vectors keyed by int64 ids.

Search is exact for small owners, and uses an inverted file calibrated to
recall@10 >= 0.99 for large ones.

:class:`VectorIndex` starts as ``faiss.IndexFlatIP(dim)`` with its own id map. ``IndexFlatIP``
is FAISS's brute-force index: every query is compared with every stored vector, so
results are exact (FAISS wiki, "Faiss indexes": https://github.com/facebookresearch/faiss/wiki/Faiss-indexes).
All vectors pass through :func:`index.normalize`, so the inner-product score is the
cosine similarity, in ``[-1, 1]``. In the exact layout the caller's ids are mapped to
FAISS's sequential positions here (``_ids``: position -> id, ``_pos``: id -> position
as two sorted arrays),
not by ``IndexIDMap2``: its ``remove_ids`` compacts the whole vector array and rebuilds
its reverse map, O(n) for every forget (13.6 ms to remove one vector of 30,000, measured
with FAISS 1.15). Removing a vector here moves the last row into its slot and drops the
tail (``remove_ids`` of a tail ``IDSelectorRange``, which moves no row): O(dim) per
removed vector plus one O(n) pass of range checks. The inverted file keeps the ids itself.

From :data:`IVF_MIN_VECTORS` vectors on, a flat scan costs a memory pass over every
vector per query (100k x 256 float32 is 100 MB: ~10 ms on one core), so the index
chooses its layout again each time it has doubled since the last choice
(:func:`choose_layout`): an ``IVF{nlist},Flat`` (``nlist = 2 sqrt(n)``, k-means
trained in 10 iterations on a sample of 64 vectors per list; FAISS wiki, "Guidelines
to choose an index") with the smallest ``nprobe`` of a ladder whose recall@10 against
exact search reaches :data:`IVF_CALIBRATION_RECALL` on calibration queries, times 3.
The calibration queries are the normalised sums of two random held vectors, which fall
between clusters and are harder than the vectors themselves, yet easier than real
questions: on WordLlama vectors of LoCoMo turns at 100k (nlist 632), 0.999 on them
came at nprobe 48, which gave the LoCoMo questions 0.987; twice that gave them 0.991,
and in the scale benchmark (an IVF461 chosen at 53k, searched at 100k) 0.989, as 2.5
times did (nprobe 120; in-process FAISS of the same layout trained on all the vectors:
0.997). The training draw matters at this margin, so it is 3: 0.992 in the benchmark
(``bench/bench_scale.py`` measures Lethe's recall against exact search per run).
When no ``nprobe`` up to ``nlist / 4`` reaches it (vectors without cluster structure,
such as random ones), the index stays exact. Both layouts remove ids exactly
(``remove_ids``); a search asking for a quarter of the index or more probes every list,
so a caller that grows ``k`` until enough hits survive its recheck ends at exact search.

Threads: any thread may call any method. FAISS CPU indexes are safe for concurrent
searches but not for a search concurrent with ``add``/``remove_ids`` (FAISS wiki,
"Threads and asynchronous calls":
https://github.com/facebookresearch/faiss/wiki/Threads-and-asynchronous-calls), so a
readers-writer lock lets searches, ``len``, ``in`` and :meth:`VectorIndex.ids` share the
index while ``add`` and ``remove`` run alone. Writers are preferred so a stream of
searches cannot starve a commit or a forget.

The index holds plaintext-derived vectors. It refuses pickling and writes no file;
:meth:`VectorIndex.to_state` hands its whole state (the FAISS index as
``faiss.serialize_index`` writes it) to a caller that seals it (Lethe's encrypted
index snapshots) and :meth:`VectorIndex.from_state` makes it again, layout and
``nprobe`` included.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import faiss
import numpy as np
import numpy.typing as npt

from index._embedder import normalize
from index._idmap import IdMap
from index._state import Pieces, State
from index.errors import DimensionMismatchError, IndexChangedError, InvalidVectorError

__all__ = ["IVF_CALIBRATION_RECALL", "IVF_MIN_VECTORS", "VectorIndex", "choose_layout"]

_INT64_MAX = np.iinfo(np.int64).max
_omp = threading.local()

IVF_MIN_VECTORS = 50_000
"""Vectors from which an index considers an inverted file (below it, exact search is a
few milliseconds at most and needs no training)."""

PIECE_BYTES = 4 << 20
"""Bytes of vectors per piece of :meth:`VectorIndex.state_in_pieces` (whole rows)."""

IVF_CALIBRATION_RECALL = 0.999
"""recall@10 an ``nprobe`` must reach on the calibration queries (see the module
docstring) before the margin of 3 is applied."""

_NPROBE_LADDER = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
_SAMPLE_PER_LIST = 64
_CALIBRATION_QUERIES = 200
_NPROBE_MARGIN = 3.0
_KMEANS_ITERATIONS = 10
"""k-means iterations of the IVF training (FAISS's default is 25): the calibration
checks the recall that results, and training runs on the searching thread."""


_MEMBER_BYTES = 16
"""Bytes per id in :attr:`VectorIndex._pos` (its int64 id and int64 position)."""


def _one_omp_thread() -> None:
    """Make FAISS use one OpenMP thread in the calling thread.

    libgomp keeps the thread count per thread (an ICV of the calling thread), so
    ``faiss.omp_set_num_threads(1)`` on the main thread does not reach a gRPC
    worker: there every search forked one OpenMP thread per core and contended
    with the other requests (a 20k search took 27-33 ms instead of 1 ms). Each
    search runs on its RPC's thread; concurrency comes from the RPC pool.
    """
    if not getattr(_omp, "set", False):
        faiss.omp_set_num_threads(1)
        _omp.set = True


class _ReadWriteLock:
    """Many readers or one writer; a waiting writer blocks new readers."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self.writes = 0  # write sections begun: a reader that sees it unchanged saw no write

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
            self.writes += 1
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


def _as_ids(ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Validate ids and return them as a ``(n,) int64`` C-contiguous array.

    Raises:
        ValueError: ``ids`` is not 1-D, not integer, holds ``-1`` (FAISS's "no result"
            marker), or holds a value outside int64.
    """
    raw = np.asarray(ids)
    if raw.ndim != 1:
        raise ValueError(f"ids must be 1-D, got ndim {raw.ndim}")
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    if raw.dtype == np.bool_ or not np.issubdtype(raw.dtype, np.integer):
        raise ValueError(f"ids must be integers, got dtype {raw.dtype}")
    if np.issubdtype(raw.dtype, np.unsignedinteger) and int(raw.max()) > _INT64_MAX:
        raise ValueError("ids must fit in int64")
    out = np.ascontiguousarray(raw, dtype=np.int64)
    if np.any(out == -1):
        raise ValueError("id -1 is reserved (FAISS uses it to pad missing results)")
    return out


def _selector(ids: npt.NDArray[np.int64]) -> faiss.IDSelectorBatch:
    """Wrap ``(n,) int64`` ids in a FAISS batch selector (FAISS copies them into a hash set)."""
    return faiss.IDSelectorBatch(len(ids), faiss.swig_ptr(ids))


def _recall_at_10(found: npt.NDArray[np.float32], exact: npt.NDArray[np.float32]) -> float:
    """Share of the exact top-10 scores ``(q, 10)`` reached by ``found`` ``(q, 10)``.

    Both are float32; ``found`` is padded with ``-inf``. The match is by score, so ties
    between near-duplicates count as found.
    """
    bar = exact[:, -1:] - 1e-6
    return float(np.mean(np.minimum(np.sum(found >= bar, axis=1), 10) / 10))


def _probe(nprobe: int) -> faiss.SearchParametersIVF:
    """Per-search IVF parameters (no shared state: concurrent searches may differ)."""
    params = faiss.SearchParametersIVF()
    params.nprobe = nprobe
    return params


def _lists(index: faiss.Index) -> Any:
    """The inverted lists of an IVF index (FAISS's typing makes them optional)."""
    return faiss.extract_index_ivf(index).invlists


def choose_layout(
    vectors: npt.NDArray[np.float32], ids: npt.NDArray[np.int64], seed: int = 0
) -> tuple[faiss.Index, int] | None:
    """An IVF index holding ``vectors`` under ``ids``, and its calibrated ``nprobe``.

    None when exact search should stay (see the module docstring for the rule).

    Args:
        vectors: ``(n, d) float32`` unit rows, ``n >= 1``.
        ids: ``(n,) int64``.
        seed: Seed of the training sample and the calibration queries.

    Returns:
        ``(index, nprobe)``, the index an ``IVF{nlist},Flat`` with inner-product metric;
        or None.
    """
    n, d = vectors.shape
    nlist = max(1, int(2 * np.sqrt(n)))
    if n < 4 * _SAMPLE_PER_LIST or nlist < 4 * _NPROBE_LADDER[0]:
        return None
    rng = np.random.default_rng(seed)
    sample = vectors[rng.choice(n, min(n, _SAMPLE_PER_LIST * nlist), replace=False)]
    ivf = faiss.index_factory(d, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
    faiss.extract_index_ivf(ivf).cp.niter = _KMEANS_ITERATIONS
    ivf.train(sample)
    del sample
    ivf.add_with_ids(vectors, ids)
    pairs = rng.choice(n, (_CALIBRATION_QUERIES, 2))
    queries = vectors[pairs[:, 0]] + vectors[pairs[:, 1]]
    queries = queries[np.linalg.norm(queries, axis=1) > 1e-3]
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact, _ = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    for nprobe in (p for p in _NPROBE_LADDER if p <= nlist // 4):
        found, _ = ivf.search(queries, 10, params=_probe(nprobe))
        if _recall_at_10(found, exact) >= IVF_CALIBRATION_RECALL:
            return ivf, min(nlist, int(np.ceil(nprobe * _NPROBE_MARGIN)))
    return None


def _ivf_held(
    index: faiss.Index, dim: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Copies of every vector ``(n, dim) float32`` and id ``(n,) int64`` an IVF holds.

    The IVF must store flat codes.
    """
    lists = _lists(index)
    parts, id_parts = [], []
    for i in range(lists.nlist):
        size = lists.list_size(i)
        if size:
            codes = faiss.rev_swig_ptr(lists.get_codes(i), size * dim * 4)
            parts.append(np.frombuffer(codes, dtype=np.float32).reshape(size, dim).copy())
            id_parts.append(faiss.rev_swig_ptr(lists.get_ids(i), size).astype(np.int64))
    if not parts:
        return np.zeros((0, dim), np.float32), np.zeros(0, np.int64)
    return np.concatenate(parts), np.concatenate(id_parts)


def _ivf_held_ids(index: faiss.Index) -> npt.NDArray[np.int64]:
    """Every id an inverted file holds, ``(n,) int64`` in list order."""
    lists = _lists(index)
    parts = [
        faiss.rev_swig_ptr(lists.get_ids(i), n).astype(np.int64)
        for i in range(lists.nlist)
        if (n := lists.list_size(i))
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


class VectorIndex:
    """Cosine search over unit vectors with int64 ids, held only in memory.

    Search is exact, or an inverted file once large (the module docstring gives the rule).

    Args:
        dim: Vector length ``d``; every added or queried vector must have it.
        ivf_min: Vectors from which the layout is chosen again at each doubling
            (:data:`IVF_MIN_VECTORS`; 0 keeps exact search always).

    Raises:
        ValueError: ``dim < 1`` or ``ivf_min < 0``.
    """

    def __init__(self, dim: int, ivf_min: int = IVF_MIN_VECTORS) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if ivf_min < 0:
            raise ValueError(f"ivf_min must be >= 0, got {ivf_min}")
        self._dim = dim
        self._index: Any = faiss.IndexFlatIP(dim)  # or an IVF: FAISS's stubs are partial
        # exact layout: position -> id, and id -> position; with an inverted file
        # FAISS holds the ids and _pos maps each held id to 0 (membership only)
        self._ids: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._pos = IdMap()
        self._lock = _ReadWriteLock()
        self._ivf_min = ivf_min
        self._nprobe = 0  # 0: exact (flat); else the calibrated nprobe of the IVF
        self._nlist = 0
        self._chosen_at = 0  # vectors held when the layout was last chosen

    @property
    def layout(self) -> tuple[str, str]:
        """The layout in use as ``(faiss.index_factory string, ParameterSpace string)``.

        ``("IDMap2,Flat", "")`` or e.g. ``("IVF632,Flat", "nprobe=80")``.
        """
        with self._lock.read():
            if not self._nprobe:
                return "IDMap2,Flat", ""
            return f"IVF{self._nlist},Flat", f"nprobe={self._nprobe}"

    def _relayout(self) -> None:
        """Choose the layout again for what is held; the caller holds the write lock.

        The held vectors are copied out and the old index freed first, so the peak is
        about twice the vectors' bytes.
        """
        vecs, ids = self._held()
        self._index = faiss.IndexFlatIP(self._dim)  # frees the old one
        self._ids, self._pos = np.zeros(0, dtype=np.int64), IdMap()
        self._chosen_at = len(ids)
        chosen = choose_layout(vecs, ids)
        if chosen is None:
            self._index.add(vecs)
            self._ids = ids
            self._pos = IdMap(ids.tolist(), range(len(ids)))
            self._nprobe = self._nlist = 0
        else:
            self._index, self._nprobe = chosen
            self._nlist = faiss.extract_index_ivf(self._index).nlist
            self._pos = IdMap(ids.tolist(), [0] * len(ids))

    def _held(self) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Copies of every held vector ``(n, dim) float32`` and its id ``(n,) int64``."""
        if self._nprobe:
            return _ivf_held(self._index, self._dim)
        size = int(self._index.ntotal)
        rows = faiss.rev_swig_ptr(self._index.get_xb(), size * self._dim)
        return rows.reshape(size, self._dim).copy(), self._ids.copy()

    @property
    def dim(self) -> int:
        """Vector length ``d`` fixed at construction."""
        return self._dim

    def add(self, ids: npt.ArrayLike, vectors: npt.ArrayLike) -> None:
        """Insert vectors, replacing any already held under the same ids.

        Re-adding an id removes its old vector first, so adding the same
        ``(id, vector)`` twice leaves one entry. The batch is validated in full before
        the index changes.

        Args:
            ids: ``(n,)`` integers (stored as int64), distinct, none equal to ``-1``.
            vectors: ``(n, dim)`` real numbers (a ``(dim,)`` vector is allowed when
                ``n == 1``); each row is scaled to unit norm by :func:`index.normalize`.

        Raises:
            ValueError: ``ids`` is invalid (see above), has duplicates, or its length
                differs from the number of vectors.
            DimensionMismatchError: The vectors' length is not :attr:`dim`.
            InvalidVectorError: A vector is non-finite or zero, or ndim not in (1, 2).
        """
        id_arr = _as_ids(ids)
        vecs = normalize(vectors, self._dim)
        if len(id_arr) != len(vecs):
            raise ValueError(f"got {len(id_arr)} ids for {len(vecs)} vectors")
        if len(np.unique(id_arr)) != len(id_arr):
            raise ValueError("ids must be distinct within one add")
        if len(id_arr) == 0:
            return
        new = [int(i) for i in id_arr]
        _one_omp_thread()
        with self._lock.write():
            self._remove_held(new)
            if self._nprobe:
                self._index.add_with_ids(vecs, id_arr)
                self._pos.update(dict.fromkeys(new, 0))
            else:
                start = int(self._index.ntotal)
                self._index.add(vecs)
                self._ids = np.concatenate([self._ids, id_arr])
                self._pos.update(zip(new, range(start, start + len(new)), strict=True))
            size = int(self._index.ntotal)
            if self._ivf_min and size >= self._ivf_min and size >= 2 * self._chosen_at:
                self._relayout()

    def _remove_held(self, ids: list[int]) -> int:
        """Remove the vectors of those ``ids`` that are held; the caller holds the write lock.

        Every removed row is overwritten in FAISS's memory before it goes, so no copy
        stays in the spare capacity behind the arrays. Exact layout: each removed row
        is overwritten by the last row (whose id takes the freed position), then the
        tail is zeroed and dropped. Inverted file: the entries are zeroed in their
        lists (:meth:`_zero_entries`), then ``remove_ids`` moves each list's last
        entry into the gap.

        Returns:
            The number of vectors removed.
        """
        asked = np.fromiter(dict.fromkeys(ids), np.int64)
        present = asked[self._pos.held(asked)].tolist()
        if not present:
            return 0
        if self._nprobe:
            gone = np.asarray(present, dtype=np.int64)
            self._zero_entries(gone)
            removed = int(self._index.remove_ids(_selector(gone)))
            for id_ in present:
                del self._pos[id_]
            return removed
        total = int(self._index.ntotal)
        rows = faiss.rev_swig_ptr(self._index.get_xb(), total * self._dim)
        rows = rows.reshape(total, self._dim)
        end = total  # rows [0, end) are held
        for id_ in present:
            at = self._pos[id_]
            end -= 1
            if at != end:
                moved = int(self._ids[end])
                rows[at] = rows[end]
                self._ids[at] = moved
                self._pos[moved] = at
        for id_ in present:
            del self._pos[id_]
        rows[end:] = 0.0  # the dropped tail (removed rows, copies of moved ones) is zeroed
        self._index.remove_ids(faiss.IDSelectorRange(end, total))
        self._ids = self._ids[:end].copy()
        return total - end

    def _zero_entries(self, ids: npt.NDArray[np.int64]) -> None:
        """Overwrite the inverted-file entries of ``ids`` with zeros (write lock held)."""
        lists = _lists(self._index)
        blank = np.zeros(lists.code_size, dtype=np.uint8)
        for i in range(lists.nlist):
            size = lists.list_size(i)
            if not size:
                continue
            held = faiss.rev_swig_ptr(lists.get_ids(i), size)
            for offset in np.flatnonzero(np.isin(held, ids)):
                lists.update_entry(i, int(offset), int(held[offset]), faiss.swig_ptr(blank))

    def remove(self, ids: npt.ArrayLike) -> int:
        """Delete the vectors held under ``ids``; absent ids are ignored.

        Their rows are overwritten in FAISS's memory first (:meth:`_remove_held`).
        When none of ``ids`` is held, no write section begins: a save streaming
        the state (:meth:`state_in_pieces`) is not abandoned for nothing.

        Args:
            ids: ``(n,)`` integers.

        Returns:
            The number of vectors removed.

        Raises:
            ValueError: ``ids`` is not 1-D integers within int64, or holds ``-1``.
        """
        id_arr = _as_ids(ids)
        if len(id_arr) == 0:
            return 0
        with self._lock.read():  # none held: no write section, so a streaming save goes on
            if not self._pos.held(id_arr).any():
                return 0
        with self._lock.write():
            return self._remove_held([int(i) for i in id_arr])

    def search(
        self, query: npt.ArrayLike, k: int, *, unit: bool = False
    ) -> list[tuple[int, float]]:
        """Find the ``k`` stored vectors with the highest cosine similarity to ``query``.

        Args:
            query: ``(dim,)`` (or ``(1, dim)``) real numbers; normalised here.
            k: Maximum number of results, ``>= 1``; larger than :func:`len` is fine.
            unit: ``query`` is already a row of :func:`index.normalize`'s output
                (``(dim,) float32``, unit norm) and is searched as given: a
                server normalises a client's vector once, when it checks it
                (10 µs a search).

        Returns:
            Up to ``min(k, len(self))`` pairs ``(id, score)``, best first, where
            ``score`` is the cosine similarity in ``[-1, 1]`` (float32 precision):
            the exact top ``k``, or with an inverted file (:attr:`layout`) the best
            of the probed lists (every list when ``4 k >= len(self)``).

        Raises:
            ValueError: ``k < 1``.
            DimensionMismatchError: The query's length is not :attr:`dim`.
            InvalidVectorError: The query is non-finite or zero, or is not one vector.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if unit and isinstance(query, np.ndarray) and query.dtype == np.float32:
            q = np.ascontiguousarray(query.reshape(1, -1))
            if q.shape[1] != self._dim:
                raise DimensionMismatchError(self._dim, q.shape[1])
        else:
            q = normalize(query, self._dim)
        if len(q) != 1:
            raise InvalidVectorError(f"query must be one vector, got {len(q)}")
        _one_omp_thread()
        with self._lock.read():
            size = int(self._index.ntotal)
            if size == 0:
                return []
            k = min(k, size)
            if self._nprobe and 4 * k < size:
                probe = _probe(self._nprobe)
                scores, found = self._index.search(q, k, params=probe)
            elif self._nprobe:  # a quarter of the index or more: every list
                probe = _probe(self._nlist)
                scores, found = self._index.search(q, k, params=probe)
            else:
                scores, found = self._index.search(q, k)
            at = found[0]
            hit = at != -1
            labels = at[hit] if self._nprobe else self._ids[at[hit]]
        return [(int(i), float(s)) for i, s in zip(labels, scores[0][hit], strict=True)]

    def ids(self) -> npt.NDArray[np.int64]:
        """All ids held, for audits of drift between the index and the store.

        Returns:
            ``(len(self),) int64``, ascending.
        """
        with self._lock.read():
            held = _ivf_held_ids(self._index) if self._nprobe else self._ids.copy()
        return np.sort(held.astype(np.int64, copy=False))

    def nbytes(self) -> int:
        """An estimate of the bytes this index holds.

        Per vector ``4 * dim`` (the float32 row) plus 8 (its int64 id) plus
        :data:`_MEMBER_BYTES` (the id and its position in the position map), plus
        an inverted file's centroids.
        """
        with self._lock.read():
            lists = self._nlist * 4 * self._dim  # the IVF's centroids
            return int(self._index.ntotal) * (4 * self._dim + 8 + _MEMBER_BYTES) + lists

    def __len__(self) -> int:
        """Number of vectors held."""
        with self._lock.read():
            return int(self._index.ntotal)

    def __contains__(self, id_: object) -> bool:
        """Whether a vector is held under ``id_`` (an ``int``; anything else is absent)."""
        if not isinstance(id_, (int, np.integer)) or isinstance(id_, bool):
            return False
        with self._lock.read():
            return int(id_) in self._pos

    def _state_meta(self) -> dict[str, Any]:
        """The layout's parameters a state carries; the caller holds the read lock."""
        return {
            "kind": "VectorIndex",
            "dim": self._dim,
            "ivf_min": self._ivf_min,
            "nprobe": self._nprobe,
            "nlist": self._nlist,
            "chosen_at": self._chosen_at,
        }

    def to_state(self) -> State:
        """The whole index as a :data:`index.State` (see :mod:`index._state`).

        The exact layout as its vectors and ids; an inverted file as
        ``faiss.serialize_index`` writes it (its trained centroids and lists,
        which hold the ids). Either way every held vector and no removed one:
        removed rows were overwritten and dropped, and only held rows are
        copied. Plus the layout's parameters (``nprobe``, ``nlist``, the size
        it was chosen at). Copied under the read lock.

        Returns:
            ``(meta, arrays)``: arrays ``vectors`` ``(n, dim) float32`` and
            ``ids`` ``(n,) int64`` (exact layout), or ``faiss`` ``(b,) uint8``
            (inverted file).
        """
        with self._lock.read():
            meta = self._state_meta()
            if self._nprobe:
                return meta, {"faiss": faiss.serialize_index(self._index)}
            vectors, ids = self._held()
        return meta, {"vectors": vectors, "ids": ids}

    def state_in_pieces(
        self, piece_bytes: int = PIECE_BYTES
    ) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any] | Pieces]]:
        """:meth:`to_state`, with the exact layout's vectors handed over in pieces.

        For :func:`index.pack_state_stream`: each piece (``piece_bytes`` of
        rows, at least one row) is copied under the read lock when the stream
        reaches it, so the vectors are never copied whole beside the index
        (an owner's snapshot save held both; 98 MiB at 100k turns of 256-d).
        The ids are copied now. An inverted file is copied whole, as by
        :meth:`to_state`.

        Returns:
            ``(meta, arrays)`` as :meth:`to_state`'s, ``vectors`` a
            :class:`index.StatePieces`.

        Raises:
            IndexChangedError: from the pieces, while streamed: the index was
                written to since this call (the pieces would not be of one
                state; the consumer abandons what it made of them).
        """
        with self._lock.read():
            meta = self._state_meta()
            if self._nprobe:
                return meta, {"faiss": faiss.serialize_index(self._index)}
            size, ids, seen = int(self._index.ntotal), self._ids.copy(), self._lock.writes
        dim = self._dim
        rows = max(1, piece_bytes // (4 * dim))

        def pieces() -> Iterator[npt.NDArray[np.float32]]:
            for start in range(0, size, rows):
                with self._lock.read():
                    if self._lock.writes != seen:
                        raise IndexChangedError("the vector index changed while streamed")
                    flat = faiss.rev_swig_ptr(self._index.get_xb(), size * dim)
                    piece = flat[start * dim : min(size, start + rows) * dim].copy()
                yield piece

        vectors = Pieces(np.dtype("<f4"), (size, dim), pieces)
        return meta, {"vectors": vectors, "ids": ids}

    @classmethod
    def from_state(cls, state: State) -> VectorIndex:
        """The index :meth:`to_state` described, searching as it did.

        Args:
            state: ``(meta, arrays)`` from :meth:`to_state` (arrays may be views
                of a buffer: FAISS copies what it keeps).

        Returns:
            A new index with the same layout, ``nprobe``, vectors and ids.

        Raises:
            ValueError: The state is not a :meth:`to_state` of this version, or
                its parts disagree (dimension, layout, id count).
        """
        meta, arrays = state
        try:
            if meta["kind"] != "VectorIndex":
                raise ValueError(f"not a VectorIndex state: {meta['kind']!r}")
            dim, ivf_min = int(meta["dim"]), int(meta["ivf_min"])
            nprobe, nlist, chosen_at = (
                int(meta["nprobe"]),
                int(meta["nlist"]),
                int(meta["chosen_at"]),
            )
            out = cls(dim, ivf_min)
            if nprobe:
                out._load_ivf(arrays["faiss"], nprobe, nlist)
            else:
                out._load_exact(arrays["vectors"], arrays["ids"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed VectorIndex state: {exc!r}") from None
        out._chosen_at = chosen_at
        return out

    def _load_ivf(self, blob: npt.NDArray[Any], nprobe: int, nlist: int) -> None:
        """Take an inverted file's ``faiss.serialize_index`` bytes (a new index only)."""
        try:
            index = faiss.deserialize_index(np.ascontiguousarray(blob, dtype=np.uint8))
        except RuntimeError:
            raise ValueError("the VectorIndex state's FAISS index does not read") from None
        if index.d != self._dim or index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise ValueError("the VectorIndex state's FAISS index has another dimension or metric")
        if not isinstance(index, faiss.IndexIVFFlat) or index.nlist != nlist:
            raise ValueError("the VectorIndex state's inverted file is not IVF{nlist},Flat")
        self._index, self._nprobe, self._nlist = index, nprobe, nlist
        try:
            held = _ivf_held_ids(index).tolist()
            self._pos = IdMap(held, [0] * len(held))
        except ValueError:
            raise ValueError("the VectorIndex state holds an id twice") from None

    def _load_exact(self, vectors: npt.NDArray[Any], ids: npt.NDArray[Any]) -> None:
        """Take the exact layout's vectors and ids (a new index only).

        The vectors were held, so they are unit rows already: FAISS copies them
        as they are (one copy, no normalisation pass).
        """
        if vectors.ndim != 2 or vectors.shape != (len(ids), self._dim):
            raise ValueError("the VectorIndex state's vectors and ids disagree")
        if vectors.dtype != np.float32 or not np.all(np.isfinite(vectors)):
            raise ValueError("the VectorIndex state's vectors are not finite float32")
        self._ids = np.array(ids, dtype=np.int64)
        try:
            self._pos = IdMap(self._ids.tolist(), range(len(self._ids)))
        except ValueError:
            raise ValueError("the VectorIndex state holds an id twice") from None
        if len(ids) and int(self._ids.min()) == -1:
            raise ValueError("the VectorIndex state holds id -1")
        if len(ids):
            self._index.add(np.ascontiguousarray(vectors))

    def __repr__(self) -> str:
        return f"VectorIndex(dim={self._dim}, size={len(self)})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("VectorIndex holds plaintext-derived vectors and cannot be pickled")
