r"""The least a gRPC server can do to answer ``lethe.v1.Retrieval/Search``: FAISS only.

No authentication, no store, no crypto, no visibility checks.

It is the peer that shows what Lethe's guarantees cost: the same request and
response messages, the same Python gRPC server (a thread pool of 16 workers,
as ``server.ServerConfig.max_workers``), the same FAISS index type, one
OpenMP thread per searching thread (as the server). The difference between
Lethe's latency and this one is the price of authentication, the record
store, sealing and every visibility check.

Vectors are read from ``{vectors}/{owner}.npy`` (``(n, d) float32``, unit
rows) the first time ``owners/{owner}`` is searched, into the index type of
``{vectors}/{owner}.layout`` when present (two lines: factory, parameters; the
scale benchmark writes there the layout Lethe chose) or of ``--factory``; row ``i`` has id ``i``
and answers as a hit whose ``Turn`` carries only ``name``
``owners/{owner}/threads/v/turns/{i}`` and whose ``score`` is the inner
product. ``query_embedding`` is searched as given (clients send unit vectors)::

    python bench/minimal_server.py --vectors DIR --listen 127.0.0.1:PORT \
        [--factory IDMap2,Flat] [--params ""]

Prints ``minimal serving on HOST:PORT`` when ready; stops on SIGTERM.

Threads: gRPC worker threads call :meth:`_Retrieval.Search` concurrently; each
owner's index is built once under a lock, then only searched.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path
from types import FrameType

import faiss
import grpc
import numpy as np

from lethe.v1 import retrieval_pb2, retrieval_pb2_grpc, threads_pb2

_omp = threading.local()
MAX_WORKERS = 16
"""gRPC worker threads, as the Lethe server's default ``max_workers``."""


def build_index(vectors: np.ndarray, factory: str, params: str) -> faiss.Index:
    """A FAISS index of the given type over ``vectors``, ids ``0..n-1``.

    Args:
        vectors: ``(n, d) float32`` rows.
        factory: ``faiss.index_factory`` description, inner-product metric
            (``"IDMap2,Flat"`` is ``IndexIDMap2(IndexFlatIP(d))``).
        params: ``faiss.ParameterSpace`` settings, comma-separated ``name=value``
            such as ``"nprobe=16"``, or ``""``.

    Returns:
        The trained, filled index.
    """
    index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:  # an IVF: trained on 64 vectors per list, as Lethe's
        try:
            nlist = faiss.extract_index_ivf(index).nlist
        except RuntimeError:
            nlist = len(vectors)
        rng = np.random.default_rng(0)
        index.train(vectors[rng.choice(len(vectors), min(len(vectors), 64 * nlist), replace=False)])
    ids = np.arange(len(vectors), dtype=np.int64)
    try:
        index.add_with_ids(vectors, ids)
    except RuntimeError:  # index types without an id map number rows in order
        index.add(vectors)
    space = faiss.ParameterSpace()
    for setting in filter(None, params.split(",")):
        name, _, value = setting.partition("=")
        space.set_index_parameter(index, name.strip(), float(value))
    return index


class _Retrieval(retrieval_pb2_grpc.RetrievalServicer):
    def __init__(self, vectors: Path, factory: str, params: str) -> None:
        self._dir = vectors
        self._factory = factory
        self._params = params
        self._lock = threading.Lock()
        self._indexes: dict[str, faiss.Index] = {}

    def _index(self, parent: str) -> faiss.Index | None:
        index = self._indexes.get(parent)
        if index is not None:
            return index
        with self._lock:
            if parent not in self._indexes:
                path = self._dir / f"{parent.removeprefix('owners/')}.npy"
                if not path.is_file():
                    return None
                factory, params = self._factory, self._params
                layout = path.with_suffix(".layout")  # per owner, as the benchmark chose it
                if layout.is_file():
                    factory, params = [*layout.read_text().splitlines(), "", ""][:2]
                self._indexes[parent] = build_index(np.load(path), factory, params)
            return self._indexes[parent]

    def AssembleContext(  # noqa: N802
        self, request: retrieval_pb2.AssembleContextRequest, context: grpc.ServicerContext
    ) -> retrieval_pb2.ContextBundle:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the minimal server only searches")

    def GetContextManifest(  # noqa: N802
        self, request: retrieval_pb2.GetContextManifestRequest, context: grpc.ServicerContext
    ) -> retrieval_pb2.ContextManifest:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the minimal server only searches")

    def Search(  # noqa: N802
        self, request: retrieval_pb2.SearchRequest, context: grpc.ServicerContext
    ) -> retrieval_pb2.SearchResponse:
        if not getattr(_omp, "set", False):
            faiss.omp_set_num_threads(1)
            _omp.set = True
        index = self._index(request.parent)
        if index is None:
            return retrieval_pb2.SearchResponse()
        query = np.asarray(request.query_embedding, dtype=np.float32).reshape(1, -1)
        scores, ids = index.search(query, request.top_k or 10)
        prefix = f"{request.parent}/threads/v/turns/"
        return retrieval_pb2.SearchResponse(
            hits=[
                retrieval_pb2.Hit(score=float(s), turn=threads_pb2.Turn(name=f"{prefix}{i}"))
                for s, i in zip(scores[0], ids[0], strict=True)
                if i >= 0
            ]
        )


def main() -> int:
    """Serve ``Search`` on ``--listen`` until SIGTERM or SIGINT, then stop (1 s grace).

    Returns:
        The exit status, 0.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=Path, required=True)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--factory", default="IDMap2,Flat")
    parser.add_argument("--params", default="")
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_WORKERS))
    retrieval_pb2_grpc.add_RetrievalServicer_to_server(
        _Retrieval(args.vectors, args.factory, args.params), server
    )
    port = server.add_insecure_port(args.listen)
    server.start()
    print(f"minimal serving on {args.listen.rpartition(':')[0]}:{port}", flush=True)
    stopped = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopped.wait()
    server.stop(grace=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
