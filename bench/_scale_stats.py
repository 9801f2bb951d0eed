"""Statistics and peers of the scale benchmark.

Latency summaries, recall@k, in-process FAISS, Chroma, and thread-driven load for
in-process peers.

Latency summaries quote the median (p50) and p99 of every call measured
(numpy's linear-interpolation percentile); ratios between systems are taken
per round and their median quoted, so that a noisy round moves one sample,
not the figure.

recall@k (Manning et al., *Introduction to Information Retrieval*, ch. 8,
restricted to the exact top k): the share of the exact top k that a system
returns. A returned id counts when its exact score is at least the k-th exact
score minus 1e-5, so ties at the boundary (repeated texts) are not misses.

Chroma is optional (``pip install -e '.[bench]'``): :func:`chroma_available`
says whether it imports. It runs in process, on a ``PersistentClient`` in a
temporary directory: Chroma 1.x reads ``hnsw.ef_search`` when it loads a
collection's index, so :meth:`ChromaPeer.set_ef` modifies the configuration and
reopens the client (a ``modify`` alone leaves the loaded index as it was; its
recall does not move).

Threads: :func:`run_threads` starts its own; nothing else here is thread-safe
unless its docstring says so.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt
from _scale_procs import RunResult

__all__ = [
    "ChromaPeer",
    "chroma_available",
    "exact_top",
    "median_ratio",
    "qps_of",
    "recall_at",
    "run_threads",
    "summary",
]

Vectors = npt.NDArray[np.float32]


def summary(latencies: Sequence[float]) -> dict[str, float]:
    """p50, p99 and mean of latencies.

    Args:
        latencies: Seconds per call, non-empty.

    Returns:
        ``n`` (count), ``p50_ms``, ``p99_ms`` and ``mean_ms``, in milliseconds.
    """
    a = np.asarray(latencies, dtype=np.float64) * 1e3
    return {
        "n": len(a),
        "p50_ms": round(float(np.percentile(a, 50)), 4),
        "p99_ms": round(float(np.percentile(a, 99)), 4),
        "mean_ms": round(float(a.mean()), 4),
    }


def median_ratio(
    num: Sequence[Sequence[float]], den: Sequence[Sequence[float]]
) -> dict[str, float]:
    """Median over rounds of ``p50(num round) / p50(den round)``.

    Args:
        num: Latencies per round of the numerator system.
        den: Latencies per round of the denominator system (same rounds).

    Returns:
        ``median``, ``q25`` and ``q75`` of the per-round ratio (the spread says how
        noisy the machine was), and ``rounds``.
    """
    ratios = [
        float(np.median(a)) / float(np.median(b))
        for a, b in zip(num, den, strict=True)
        if a and b and float(np.median(b)) > 0
    ]
    if not ratios:
        return {"median": 0.0, "q25": 0.0, "q75": 0.0, "rounds": 0}
    r = np.asarray(ratios)
    return {
        "median": round(float(np.median(r)), 3),
        "q25": round(float(np.percentile(r, 25)), 3),
        "q75": round(float(np.percentile(r, 75)), 3),
        "rounds": len(ratios),
    }


def qps_of(runs: Sequence[RunResult]) -> float:
    """Calls per second of clients that ran together.

    Args:
        runs: One result per client of one run.

    Returns:
        Calls of all clients over the span from the first start to the last end.
    """
    span = max(r.end for r in runs) - min(r.start for r in runs)
    return sum(len(r.latencies) for r in runs) / span if span > 0 else 0.0


def exact_top(x: Vectors, queries: Vectors, k: int) -> tuple[npt.NDArray[np.int64], Vectors]:
    """Exact inner-product top ``k`` (FAISS ``IndexFlatIP``, every core).

    Leaves the calling thread at one OpenMP thread.

    Args:
        x: ``(n, d) float32`` stored vectors.
        queries: ``(q, d) float32``.
        k: Neighbours per query.

    Returns:
        ``(q, k) int64`` row ids and ``(q, k) float32`` scores, best first.
    """
    flat = faiss.IndexFlatIP(x.shape[1])
    flat.add(x)
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    try:
        scores, ids = flat.search(queries, k)
    finally:
        faiss.omp_set_num_threads(1)  # every timed search in this thread uses one
    return ids.astype(np.int64), scores


def recall_at(
    got: Sequence[int], query: Vectors, x: Vectors, exact_scores: Vectors, k: int = 10
) -> float:
    """recall@k of one answer, ties at the k-th exact score counted as hits.

    Args:
        got: Row ids returned, best first (at most ``k`` are read).
        query: ``(d,) float32``.
        x: ``(n, d) float32`` stored vectors.
        exact_scores: ``(k,) float32`` exact top-k scores of ``query``, best first.
        k: Cut-off.

    Returns:
        In ``[0, 1]``.
    """
    ids = [i for i in list(dict.fromkeys(got))[:k] if 0 <= i < len(x)]
    if not ids:
        return 0.0
    kth = float(exact_scores[k - 1])
    scores = x[np.asarray(ids)] @ query
    return min(1.0, float(np.sum(scores >= kth - 1e-5)) / k)


def run_threads(
    call: Callable[[int], object], n_queries: int, concurrency: int, seconds: float
) -> list[RunResult]:
    """Closed-loop load from ``concurrency`` threads of this process.

    Each thread sets FAISS to one OpenMP thread (libgomp keeps it per thread),
    waits at a barrier, then calls ``call(i)`` with ``i`` cycling over
    ``range(n_queries)`` for ``seconds``.

    Args:
        call: One query by index; must be safe from several threads at once.
        n_queries: Number of distinct query indexes.
        concurrency: Threads.
        seconds: Length of the loop, in seconds.

    Returns:
        One result per thread.
    """
    barrier = threading.Barrier(concurrency)
    out: list[RunResult] = []
    lock = threading.Lock()

    def body(offset: int) -> None:
        faiss.omp_set_num_threads(1)
        call(offset % n_queries)
        barrier.wait()
        latencies: list[float] = []
        start = time.monotonic()
        deadline = start + seconds
        i = offset
        now = start
        while now < deadline:
            t0 = time.perf_counter()
            call(i % n_queries)
            latencies.append(time.perf_counter() - t0)
            i += 1
            now = time.monotonic()
        with lock:
            out.append(RunResult(latencies, start, now))

    threads = [threading.Thread(target=body, args=(j * 7,)) for j in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def chroma_available() -> str | None:
    """The installed Chroma version, or None when ``chromadb`` does not import."""
    try:
        import chromadb
    except ImportError:
        return None
    return str(chromadb.__version__)


class ChromaPeer:
    """One Chroma collection (HNSW, inner product) over the benchmark's vectors.

    Args:
        x: ``(n, d) float32`` vectors; row ``i`` gets id ``str(i)``.

    Attributes:
        build_s: Seconds to add every vector.
        ef: The ``hnsw.ef_search`` in force.
        default_ef: Chroma's default ``ef_search``.
    """

    def __init__(self, x: Vectors) -> None:
        import chromadb

        self._chromadb: Any = chromadb
        self._dir = Path(tempfile.mkdtemp(prefix="lethe-bench-chroma-"))
        self._client: Any = chromadb.PersistentClient(path=str(self._dir))
        self._col: Any = self._client.create_collection(
            "bench", configuration={"hnsw": {"space": "ip"}}, embedding_function=None
        )
        step = min(5000, int(self._client.get_max_batch_size()))
        t0 = time.perf_counter()
        for i in range(0, len(x), step):
            chunk = x[i : i + step]
            self._col.add(ids=[str(j) for j in range(i, i + len(chunk))], embeddings=chunk)
        self.build_s = time.perf_counter() - t0
        config: Any = self._col.configuration
        self.default_ef = int(config["hnsw"]["ef_search"])
        self.ef = self.default_ef

    def set_ef(self, ef: int) -> None:
        """Search with ``hnsw.ef_search = ef`` from now on (reopens the client).

        Args:
            ef: Candidate list size of the HNSW search, ``>= 10``.
        """
        from chromadb.api.shared_system_client import SharedSystemClient

        self._col.modify(configuration={"hnsw": {"ef_search": ef}})
        SharedSystemClient.clear_system_cache()
        self._client = self._chromadb.PersistentClient(path=str(self._dir))
        self._col = self._client.get_collection("bench", embedding_function=None)
        self.ef = ef

    def search(self, query: Vectors, k: int = 10) -> list[int]:
        """Top ``k`` row ids for one ``(d,) float32`` query (thread-safe)."""
        got = self._col.query(query_embeddings=[query], n_results=k, include=[])
        return [int(i) for i in got["ids"][0]]

    def close(self) -> None:
        """Drop the client and delete the collection's directory."""
        from chromadb.api.shared_system_client import SharedSystemClient

        SharedSystemClient.clear_system_cache()
        shutil.rmtree(self._dir, ignore_errors=True)
