"""Exact inner-product search over unit vectors keyed by int64 ids.

:class:`VectorIndex` wraps ``faiss.IndexFlatIP(dim)``, FAISS's brute-force index:
every query is compared with every stored vector, so results are exact (FAISS wiki,
"Faiss indexes": https://github.com/facebookresearch/faiss/wiki/Faiss-indexes). All
vectors pass through :func:`index.normalize`, so the inner-product score is the
cosine similarity, in ``[-1, 1]``.

The caller's ids are mapped to FAISS's sequential positions here (``_ids``: position
-> id, ``_pos``: id -> position), not by ``IndexIDMap2``: its ``remove_ids`` compacts
the whole vector array and rebuilds its reverse map, O(n) for every forget (13.6 ms
to remove one vector of 30,000, measured with FAISS 1.15). Removing a vector here
moves the last row into its slot and drops the tail (``remove_ids`` of a tail
``IDSelectorRange``, which moves no row): O(dim) per removed vector plus one
O(n) pass of range checks.

Threads: any thread may call any method. FAISS CPU indexes are safe for concurrent
searches but not for a search concurrent with ``add``/``remove_ids`` (FAISS wiki,
"Threads and asynchronous calls":
https://github.com/facebookresearch/faiss/wiki/Threads-and-asynchronous-calls), so a
readers-writer lock lets searches, ``len``, ``in`` and :meth:`VectorIndex.ids` share the
index while ``add`` and ``remove`` run alone. Writers are preferred so a stream of
searches cannot starve a commit or a forget.

The index holds plaintext-derived vectors and is never written to disk; it refuses
pickling.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import faiss
import numpy as np
import numpy.typing as npt

from index._embedder import normalize
from index.errors import InvalidVectorError

__all__ = ["VectorIndex"]

_INT64_MAX = np.iinfo(np.int64).max
_omp = threading.local()


_MEMBER_BYTES = 60
"""Estimated bytes per id in :attr:`VectorIndex._pos` (int objects and dict slot)."""


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


class VectorIndex:
    """Exact cosine search over unit vectors with int64 ids, held only in memory.

    Args:
        dim: Vector length ``d``; every added or queried vector must have it.

    Raises:
        ValueError: ``dim < 1``.
    """

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self._dim = dim
        self._index = faiss.IndexFlatIP(dim)
        self._ids: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)  # position -> id
        self._pos: dict[int, int] = {}  # id -> position
        self._lock = _ReadWriteLock()

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
            start = int(self._index.ntotal)
            self._index.add(vecs)
            self._ids = np.concatenate([self._ids, id_arr])
            self._pos.update(zip(new, range(start, start + len(new)), strict=True))

    def remove(self, ids: npt.ArrayLike) -> int:
        """Delete the vectors held under ``ids``; absent ids are ignored.

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
        with self._lock.write():
            return self._remove_held([int(i) for i in id_arr])

    def _remove_held(self, ids: list[int]) -> int:
        """Remove the vectors of those ``ids`` that are held; the caller holds the
        write lock. Each removed row is overwritten by the last row (whose id
        takes the freed position), then the tail is dropped.

        Returns:
            The number of vectors removed.
        """
        present = [i for i in dict.fromkeys(ids) if i in self._pos]
        if not present:
            return 0
        total = int(self._index.ntotal)
        rows = faiss.rev_swig_ptr(self._index.get_xb(), total * self._dim)
        rows = rows.reshape(total, self._dim)
        end = total  # rows [0, end) are held
        for id_ in present:
            at = self._pos.pop(id_)
            end -= 1
            if at != end:
                moved = int(self._ids[end])
                rows[at] = rows[end]
                self._ids[at] = moved
                self._pos[moved] = at
        rows[end:] = 0.0  # the dropped tail (removed rows, copies of moved ones) is zeroed
        self._index.remove_ids(faiss.IDSelectorRange(end, total))
        self._ids = self._ids[:end].copy()
        return total - end

    def search(self, query: npt.ArrayLike, k: int) -> list[tuple[int, float]]:
        """Find the ``k`` stored vectors with the highest cosine similarity to ``query``.

        Args:
            query: ``(dim,)`` (or ``(1, dim)``) real numbers; normalised here.
            k: Maximum number of results, ``>= 1``; larger than :func:`len` is fine.

        Returns:
            Up to ``min(k, len(self))`` pairs ``(id, score)``, best first, where
            ``score`` is the cosine similarity in ``[-1, 1]`` (float32 precision).

        Raises:
            ValueError: ``k < 1``.
            DimensionMismatchError: The query's length is not :attr:`dim`.
            InvalidVectorError: The query is non-finite or zero, or is not one vector.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        q = normalize(query, self._dim)
        if len(q) != 1:
            raise InvalidVectorError(f"query must be one vector, got {len(q)}")
        _one_omp_thread()
        with self._lock.read():
            size = int(self._index.ntotal)
            if size == 0:
                return []
            scores, found = self._index.search(q, min(k, size))
            at = found[0]
            hit = at != -1
            labels = self._ids[at[hit]]
        return [(int(i), float(s)) for i, s in zip(labels, scores[0][hit], strict=True)]

    def ids(self) -> npt.NDArray[np.int64]:
        """All ids held, for audits of drift between the index and the store.

        Returns:
            ``(len(self),) int64``, ascending.
        """
        with self._lock.read():
            held = self._ids.copy()
        return np.sort(held)

    def nbytes(self) -> int:
        """An estimate of the bytes this index holds: per vector ``4 * dim`` (the
        float32 row) plus 8 (its int64 id in the position array) plus
        :data:`_MEMBER_BYTES` (the id in the position map, CPython ints and a dict slot)."""
        with self._lock.read():
            return int(self._index.ntotal) * (4 * self._dim + 8 + _MEMBER_BYTES)

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

    def __repr__(self) -> str:
        return f"VectorIndex(dim={self._dim}, size={len(self)})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("VectorIndex holds plaintext-derived vectors and cannot be pickled")
