"""Vectors and ids for Lethe's dense retrieval.

This package knows vectors, int64 ids and string cache keys, nothing of records,
owners or states: the server decides what goes into an index and rechecks every hit.

Public names:

- :class:`Embedder`, :class:`WordLlamaEmbedder`, :class:`OnnxEmbedder`,
  :func:`load_embedder` — text to ``(n, dim) float32`` unit rows.
- :func:`normalize` — validate and scale vectors to unit L2 norm.
- :class:`VectorIndex` — exact in-memory cosine search (FAISS ``IndexFlatIP``).
- :class:`LexicalIndex`, :func:`analyze` — BM25 over texts (the lexical legs).
- :class:`EchoRule`, :func:`shingles`, :func:`containment`, :func:`find_echoes` and the
  ``ECHO_*`` defaults — whether one text repeats another (word shingles, Broder's
  containment), and the texts of a lexical index that do.
- :class:`SessionIndex` — BM25 over sessions, scores handed to their turns.
- :class:`TimeIndex` — turn times and time expressions: the time-expression prior and
  the session-date window; :func:`asks_when`, :func:`named_periods`,
  :func:`time_expression_score`, :class:`NamedPeriod` — their English-only rules.
- :func:`convex_fusion`, :func:`rrf` and the tuned ``HYBRID_*`` constants — fusion.
- :class:`IndexCache` — LRU of indexes by key; :func:`release_free_heap` after a large build;
  :func:`fix_mmap_threshold` for a serving process.
- :class:`IdMap` — int64 ids to int64 values in two sorted arrays (16 bytes an entry).
- :data:`State`, :func:`dump_state`, :func:`pack_state` (:func:`pack_state_stream` with
  :class:`StatePieces`), :func:`load_state`,
  :class:`StateReader`, :func:`combine_states`, :func:`separate_states` — an index's
  whole state (each index's ``to_state`` / ``from_state``) as bytes and back: the
  versioned container of :mod:`index._state`.
- :class:`VectorIndexError`, :class:`DimensionMismatchError`,
  :class:`InvalidVectorError` — see :mod:`index.errors`.
"""

from index._cache import IndexCache, fix_mmap_threshold, release_free_heap
from index._embedder import Embedder, WordLlamaEmbedder, load_embedder, normalize
from index._fusion import (
    HYBRID_LOWER_BOUNDS,
    HYBRID_SESSIONS,
    HYBRID_TUNED_WEIGHTS,
    HYBRID_WEIGHTS,
    convex_fusion,
    rrf,
)
from index._idmap import IdMap
from index._lexical import LexicalIndex, analyze
from index._onnx import OnnxEmbedder
from index._sessions import SessionIndex
from index._shingles import (
    ECHO_DEPTH,
    ECHO_MIN_SHINGLES,
    ECHO_SCAN_ABOVE,
    ECHO_THRESHOLD,
    ECHO_WIDTH,
    EchoRule,
    containment,
    find_echoes,
    shingles,
)
from index._state import Pieces as StatePieces
from index._state import State, StateReader
from index._state import combine as combine_states
from index._state import dumps as dump_state
from index._state import loads as load_state
from index._state import pack as pack_state
from index._state import pack_stream as pack_state_stream
from index._state import separate as separate_states
from index._temporal import NamedPeriod, asks_when, named_periods, time_expression_score
from index._timeline import WINDOW_DEPTH, WINDOW_SLACK, TimeIndex
from index._vectors import VectorIndex
from index.errors import (
    DimensionMismatchError,
    IndexChangedError,
    InvalidVectorError,
    VectorIndexError,
)

__all__ = [
    "ECHO_DEPTH",
    "ECHO_MIN_SHINGLES",
    "ECHO_SCAN_ABOVE",
    "ECHO_THRESHOLD",
    "ECHO_WIDTH",
    "HYBRID_LOWER_BOUNDS",
    "HYBRID_SESSIONS",
    "HYBRID_TUNED_WEIGHTS",
    "HYBRID_WEIGHTS",
    "WINDOW_DEPTH",
    "WINDOW_SLACK",
    "DimensionMismatchError",
    "EchoRule",
    "Embedder",
    "IdMap",
    "IndexCache",
    "IndexChangedError",
    "InvalidVectorError",
    "LexicalIndex",
    "NamedPeriod",
    "OnnxEmbedder",
    "SessionIndex",
    "State",
    "StatePieces",
    "StateReader",
    "TimeIndex",
    "VectorIndex",
    "VectorIndexError",
    "WordLlamaEmbedder",
    "analyze",
    "asks_when",
    "combine_states",
    "containment",
    "convex_fusion",
    "dump_state",
    "find_echoes",
    "fix_mmap_threshold",
    "load_embedder",
    "load_state",
    "named_periods",
    "normalize",
    "pack_state",
    "pack_state_stream",
    "release_free_heap",
    "rrf",
    "separate_states",
    "shingles",
    "time_expression_score",
]
