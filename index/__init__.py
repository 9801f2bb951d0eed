"""Vectors and ids for Lethe's dense retrieval.

This package knows vectors, int64 ids and string cache keys, nothing of records,
owners or states: the server decides what goes into an index and rechecks every hit.

Public names:

- :class:`Embedder`, :class:`WordLlamaEmbedder`, :func:`load_embedder` — text to
  ``(n, dim) float32`` unit rows.
- :func:`normalize` — validate and scale vectors to unit L2 norm.
- :class:`VectorIndex` — exact in-memory cosine search (FAISS ``IndexFlatIP``).
- :class:`IndexCache` — LRU of indexes by key.
- :class:`VectorIndexError`, :class:`DimensionMismatchError`,
  :class:`InvalidVectorError` — see :mod:`index.errors`.
"""

from index._cache import IndexCache
from index._embedder import Embedder, WordLlamaEmbedder, load_embedder, normalize
from index._fusion import HYBRID_LOWER_BOUNDS, HYBRID_WEIGHTS, convex_fusion, rrf
from index._lexical import LexicalIndex, analyze
from index._vectors import VectorIndex
from index.errors import DimensionMismatchError, InvalidVectorError, VectorIndexError

__all__ = [
    "HYBRID_LOWER_BOUNDS",
    "HYBRID_WEIGHTS",
    "DimensionMismatchError",
    "Embedder",
    "IndexCache",
    "InvalidVectorError",
    "LexicalIndex",
    "VectorIndex",
    "VectorIndexError",
    "WordLlamaEmbedder",
    "analyze",
    "convex_fusion",
    "load_embedder",
    "normalize",
    "rrf",
]
