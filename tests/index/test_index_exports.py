"""Pins the public names of the ``index`` package."""

import index


def test_public_names_are_pinned() -> None:
    assert sorted(index.__all__) == [
        "DimensionMismatchError",
        "ECHO_DEPTH",
        "ECHO_MIN_SHINGLES",
        "ECHO_SCAN_ABOVE",
        "ECHO_THRESHOLD",
        "ECHO_WIDTH",
        "EchoRule",
        "Embedder",
        "HYBRID_LOWER_BOUNDS",
        "HYBRID_SESSIONS",
        "HYBRID_TUNED_WEIGHTS",
        "HYBRID_WEIGHTS",
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
        "WINDOW_DEPTH",
        "WINDOW_SLACK",
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
    for name in index.__all__:
        if name.startswith(("HYBRID_", "WINDOW_", "ECHO_")) or name == "State":
            continue  # constants and the State type alias carry no __module__ of ours
        assert getattr(index, name).__module__.startswith("index")


def test_error_tree() -> None:
    assert issubclass(index.DimensionMismatchError, index.VectorIndexError)
    assert issubclass(index.InvalidVectorError, index.VectorIndexError)
    assert issubclass(index.IndexChangedError, index.VectorIndexError)
    assert issubclass(index.VectorIndexError, Exception)
    assert not issubclass(index.VectorIndexError, IndexError)


def test_import_does_not_load_wordllama() -> None:
    import subprocess
    import sys

    code = "import sys, index; print('wordllama' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
