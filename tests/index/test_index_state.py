"""Each index's state round-trips through the versioned container and searches as before.

``to_state`` / ``from_state`` of VectorIndex (exact and inverted file),
LexicalIndex, SessionIndex and TimeIndex, through ``dump_state`` /
``load_state``: the restored index holds the same ids and answers every query
with the same hits and scores; a state taken after a removal holds nothing of
the removed document; malformed containers are refused with ``ValueError``.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from index import (
    IndexChangedError,
    LexicalIndex,
    SessionIndex,
    StatePieces,
    TimeIndex,
    VectorIndex,
    combine_states,
    dump_state,
    load_state,
    pack_state_stream,
    separate_states,
)
from index._state import FORMAT, MAGIC, StateReader, pack, unpack

D = 32


def _round(state: Any) -> Any:
    """The state through bytes and back (its arrays views of a bytearray)."""
    return load_state(bytearray(dump_state(state)))


# ---------------------------------------------------------------------- container


def test_container_round_trips_every_dtype_and_the_metadata() -> None:
    arrays: dict[str, npt.NDArray[Any]] = {
        "i8": np.arange(5, dtype=np.int64),
        "i4": np.arange(7, dtype=np.int32).reshape(7, 1),
        "f4": np.linspace(0, 1, 9, dtype=np.float32).reshape(3, 3),
        "f8": np.array([np.pi]),
        "u1": np.frombuffer(b"abc", dtype=np.uint8),
        "b1": np.array([True, False]),
        "empty": np.zeros((0, 4), np.float32),
        "big_endian": np.arange(3, dtype=">i8"),
    }
    meta = {"kind": "x", "n": 3, "nested": {"a": [1, 2.5, None, True]}}
    got_meta, got = _round((meta, arrays))
    assert got_meta == meta
    assert set(got) == set(arrays)
    for name, arr in arrays.items():
        assert got[name].shape == arr.shape
        assert np.array_equal(got[name], arr)


@settings(max_examples=50, deadline=None)
@given(pieces=st.lists(st.integers(1, 300), min_size=1, max_size=40))
def test_a_container_read_in_pieces_gives_the_same_arrays_each_its_own(pieces: list[int]) -> None:
    state: tuple[dict[str, Any], dict[str, npt.NDArray[Any]]] = (
        {"kind": "test", "n": [1, 2]},
        {
            "ids": np.arange(50, dtype=np.int64) * 3,
            "vectors": np.linspace(-1, 1, 60, dtype=np.float32).reshape(20, 3),
            "empty": np.zeros(0, np.int32),
            "flags": np.array([True, False, True]),
            "bytes": np.frombuffer(b"harbour", np.uint8).copy(),
        },
    )
    raw = dump_state(state)
    reader = StateReader(len(raw))
    at, step = 0, 0
    while at < len(raw):
        size = pieces[step % len(pieces)]
        reader.write(raw[at : at + size])
        at, step = at + size, step + 1
    meta, arrays = reader.state()
    assert meta == state[0]
    assert arrays.keys() == state[1].keys()
    for name, want in state[1].items():
        got = arrays[name]
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        assert np.array_equal(got, want)
        assert got.base is None or got.base.base is None  # its own memory, not a shared buffer
    assert not np.shares_memory(arrays["ids"], arrays["vectors"])


def test_a_container_read_in_pieces_refuses_what_unpack_refuses() -> None:
    raw = dump_state(({"kind": "test"}, {"ids": np.arange(8, dtype=np.int64)}))  # no padding
    short = StateReader(len(raw))
    short.write(raw[:-1])
    with pytest.raises(ValueError, match="cut short"):
        short.state()
    longer = StateReader(len(raw) - 1)
    with pytest.raises(ValueError, match="longer than its stated size"):
        longer.write(raw)
    with pytest.raises(ValueError, match="bad magic"):
        StateReader(len(raw)).write(b"x" * len(raw))
    past = StateReader(len(raw) - 8)  # the last array runs past the stated size
    with pytest.raises(ValueError, match="runs past the end"):
        past.write(raw[: len(raw) - 8])


def test_container_refuses_objects_and_foreign_bytes() -> None:
    with pytest.raises(ValueError, match="dtype"):
        pack({}, {"o": np.array(["a", None], dtype=object)})
    with pytest.raises(ValueError, match="JSON"):
        pack({"x": object()}, {})
    good = dump_state(({"k": 1}, {"a": np.arange(3)}))
    with pytest.raises(ValueError, match="magic"):
        unpack(b"not-ours" + good[8:])
    with pytest.raises(ValueError, match="format"):
        unpack(MAGIC + struct.pack("<I", FORMAT + 1) + good[12:])
    with pytest.raises(ValueError, match="past the end"):
        unpack(good[:-50])  # into the array (its padding is 40 bytes)
    with pytest.raises(ValueError, match="too short"):
        unpack(good[:10])


def test_combined_states_separate_into_their_parts() -> None:
    a = ({"kind": "a"}, {"x": np.arange(2)})
    b = ({"kind": "b"}, {"x": np.arange(3), "y": np.ones(1)})
    parts = separate_states(_round(combine_states({"a": a, "b": b})), ["a", "b"])
    assert parts["a"][0] == {"kind": "a"}
    assert sorted(parts["b"][1]) == ["x", "y"]
    assert np.array_equal(parts["b"][1]["x"], np.arange(3))
    with pytest.raises(ValueError, match="no part"):
        separate_states(combine_states({"a": a}), ["b"])


# ---------------------------------------------------------------------- vectors


def _unit(n: int, seed: int) -> npt.NDArray[np.float32]:
    x = np.random.default_rng(seed).standard_normal((n, D))
    out: npt.NDArray[np.float32] = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    return out


def _clustered(n: int, seed: int, clusters: int = 60) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, D)).astype(np.float32)
    x = centres[rng.integers(0, clusters, n)] + 0.15 * rng.standard_normal((n, D))
    out: npt.NDArray[np.float32] = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    return out


def _same_search(a: VectorIndex, b: VectorIndex, queries: npt.NDArray[np.float32]) -> None:
    assert a.layout == b.layout
    assert a.ids().tolist() == b.ids().tolist()
    for q in queries:
        for k in (1, 10, 1000):
            assert a.search(q, k) == b.search(q, k)


def test_exact_vector_index_round_trips_after_removals() -> None:
    x = _unit(300, 1)
    index = VectorIndex(D)
    index.add(np.arange(300) * 3 + 7, x)
    index.remove(np.arange(0, 300, 7) * 3 + 7)
    back = VectorIndex.from_state(_round(index.to_state()))
    _same_search(index, back, _unit(20, 2))
    assert 7 not in back
    assert 10 in back
    back.add([5], x[:1])  # the restored index keeps working
    assert back.search(x[0], 1)[0][0] == 5  # x[0]'s own id 7 was removed
    with pytest.raises(TypeError):
        pickle.dumps(back)


def test_ivf_vector_index_round_trips_with_its_layout_and_nprobe() -> None:
    x = _clustered(6000, 1)
    index = VectorIndex(D, ivf_min=3000)
    for start in range(0, 6000, 1000):
        index.add(np.arange(start, start + 1000) + 1, x[start : start + 1000])
    assert index.layout[0].startswith("IVF")
    index.remove(np.arange(1, 6001, 11))
    state = index.to_state()
    assert sorted(state[1]) == ["faiss"]  # serialised: the inverted file keeps its own ids
    back = VectorIndex.from_state(_round(state))
    _same_search(index, back, _clustered(30, 2))
    assert 1 not in back
    assert 2 in back


def test_a_vector_state_of_another_dimension_is_refused() -> None:
    index = VectorIndex(D)
    index.add([1], _unit(1, 3))
    meta, arrays = index.to_state()
    assert sorted(arrays) == ["ids", "vectors"]  # the exact layout: its rows as they are
    with pytest.raises(ValueError, match="disagree"):
        VectorIndex.from_state(({**meta, "dim": D + 1}, arrays))
    with pytest.raises(ValueError, match="disagree"):
        VectorIndex.from_state((meta, {**arrays, "ids": np.arange(2)}))
    with pytest.raises(ValueError, match="finite"):
        VectorIndex.from_state((meta, {**arrays, "vectors": arrays["vectors"] * np.nan}))
    ivf = VectorIndex(D, ivf_min=3000)
    ivf.add(np.arange(6000), _clustered(6000, 4))
    ivf_meta, ivf_arrays = ivf.to_state()
    assert ivf_meta["nprobe"] > 0
    with pytest.raises(ValueError, match="dimension"):
        VectorIndex.from_state(({**ivf_meta, "dim": D + 1}, ivf_arrays))
    with pytest.raises(ValueError, match="not a VectorIndex state"):
        VectorIndex.from_state(({**meta, "kind": "LexicalIndex"}, arrays))


# ---------------------------------------------------------------------- lexical

WORDS = [
    "harbour",
    "violin",
    "orchard",
    "glacier",
    "lantern",
    "painting",
    "adoption",
    "museum",
    "running",
    "guitar",
    "sunrise",
    "dinner",
]
_texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=6).map(" ".join)


def _same_ranking(a: LexicalIndex, b: LexicalIndex) -> None:
    assert a.ids().tolist() == b.ids().tolist()
    for query in [*WORDS, "harbour violin", "running dinner sunrise", "zzz"]:
        assert a.search(query, 50) == b.search(query, 50)


@settings(max_examples=40, deadline=None)
@given(
    docs=st.lists(_texts, min_size=1, max_size=40),
    removed=st.sets(st.integers(0, 39), max_size=15),
    later=st.lists(_texts, max_size=10),
)
def test_lexical_index_round_trips_after_adds_and_removals(
    docs: list[str], removed: set[int], later: list[str]
) -> None:
    index = LexicalIndex()
    index.add(np.arange(len(docs)), docs)
    index.search("harbour", 1)  # a main segment
    index.remove(np.asarray(sorted(removed), np.int64))
    if later:
        index.add(np.arange(len(later)) + 100, later)  # a delta
    back = LexicalIndex.from_state(_round(index.to_state()))
    _same_ranking(index, back)
    back.add([500], ["violin glacier"])
    index.add([500], ["violin glacier"])
    back.remove([0])
    index.remove([0])
    _same_ranking(index, back)


def test_a_lexical_state_holds_nothing_of_a_removed_document() -> None:
    index = LexicalIndex()
    index.add([1, 2, 3], ["harbour violin", "orchard glacier", "zanzibarian xylophonist"])
    assert index.search("zanzibarian", 5)[0][0] == 3  # in the main segment
    index.remove([3])
    raw = dump_state(index.to_state())
    assert b"zanzibarian" not in raw
    assert b"xylophonist" not in raw
    back = LexicalIndex.from_state(load_state(raw))
    assert back.search("zanzibarian", 5) == []
    assert back.search("harbour", 5) == index.search("harbour", 5)


def test_a_lexical_state_with_a_delta_keeps_it() -> None:
    index = LexicalIndex()
    index.add(np.arange(600), [f"{WORDS[i % 12]} doc{i}" for i in range(600)])
    index.search("harbour", 1)
    index.add([1000, 1001], ["lantern harbour", "violin"])  # below the rebuild threshold
    meta, arrays = index.to_state()
    assert sorted(arrays["delta"].tolist()) == [1000, 1001]
    back = LexicalIndex.from_state(_round((meta, arrays)))
    _same_ranking(index, back)


# ---------------------------------------------------------------------- sessions and times


@settings(max_examples=30, deadline=None)
@given(
    members=st.lists(st.tuples(st.integers(0, 4), _texts), min_size=1, max_size=30),
    removed=st.sets(st.integers(0, 29), max_size=10),
)
def test_session_index_round_trips(members: list[tuple[int, str]], removed: set[int]) -> None:
    index = SessionIndex()
    index.add(
        np.arange(len(members)),
        [f"t/{s}" for s, _ in members],
        [text for _, text in members],
        [f"{s + 1} May 2023" for s, _ in members],
    )
    index.remove(np.asarray(sorted(removed), np.int64))
    back = SessionIndex.from_state(_round(index.to_state()))
    assert back.sessions() == index.sessions()
    for query in [*WORDS, "may 2023", "3 may harbour"]:
        assert back.search(query, 3) == index.search(query, 3)
    # The restored members' term counts are the ones removal subtracts.
    rest = np.arange(0, len(members), 2)
    index.remove(rest)
    back.remove(rest)
    assert back.sessions() == index.sessions()
    for query in [*WORDS, "may 2023", "3 may harbour"]:
        assert back.search(query, 3) == index.search(query, 3)


def test_time_index_round_trips() -> None:
    index = TimeIndex()
    base = 1_683_504_000.0  # 8 May 2023
    texts = ["we met yesterday", "the guitar", "last week in May", "violin", "in 2022"]
    index.add(np.arange(5) + 10, [base + 3600 * i for i in range(5)], texts)
    index.remove([11])
    back = TimeIndex.from_state(_round(index.to_state()))
    assert back.ids().tolist() == index.ids().tolist()
    candidates = [10, 11, 12, 13, 14]
    assert back.prior("when did we meet?", candidates) == index.prior(
        "when did we meet?", candidates
    )
    periods = index.periods("what happened on 8 May 2023?")
    assert back.window(periods, 10) == index.window(periods, 10)
    assert back.years() == index.years()


# ---------------------------------------------------------------------- in pieces


def test_a_vector_state_streamed_in_pieces_is_the_state_packed_whole() -> None:
    """``state_in_pieces`` + ``pack_state_stream``: the same bytes as ``to_state`` + ``pack``."""
    index = VectorIndex(D)
    index.add(np.arange(500) + 1, _unit(500, 3))
    index.remove(np.arange(1, 500, 9))
    whole = b"".join(pack(*index.to_state()))
    piece_bytes = 7 * 4 * D  # 7 rows a piece: the last is short
    size, stream = pack_state_stream(*index.state_in_pieces(piece_bytes))
    got = [bytes(b) for b in stream]
    assert b"".join(got) == whole
    assert size == len(whole)
    assert max(len(b) for b in got) < 100 * 4 * D  # no buffer holds every vector
    back = VectorIndex.from_state(load_state(bytearray(whole)))
    _same_search(index, back, _unit(10, 4))


def test_a_write_while_the_vectors_stream_abandons_the_stream() -> None:
    index = VectorIndex(D)
    index.add(np.arange(100) + 1, _unit(100, 5))
    _, stream = pack_state_stream(*index.state_in_pieces(10 * 4 * D))
    next(stream)  # the header
    next(stream)  # the first piece
    index.remove([50])
    with pytest.raises(IndexChangedError):
        list(stream)


def test_removing_ids_not_held_leaves_a_streaming_save_going() -> None:
    index = VectorIndex(D)
    index.add(np.arange(100) + 1, _unit(100, 5))
    whole = b"".join(pack_state_stream(*index.state_in_pieces(10 * 4 * D))[1])
    _, stream = pack_state_stream(*index.state_in_pieces(10 * 4 * D))
    first = [bytes(next(stream)), bytes(next(stream))]  # the header, the first piece
    assert index.remove([500, 501]) == 0  # none held: no write section
    assert b"".join(first + [bytes(b) for b in stream]) == whole
    assert len(index) == 100


def test_pieces_of_another_size_or_dtype_are_refused() -> None:
    def pieces(*parts: npt.NDArray[Any]) -> StatePieces:
        return StatePieces(np.dtype("<f4"), (4,), lambda: iter(parts))

    ok = np.arange(4, dtype="<f4")
    assert b"".join(pack_state_stream({}, {"a": pieces(ok[:1], ok[1:])})[1]) == b"".join(
        pack({}, {"a": ok})
    )
    for bad in (pieces(ok[:3]), pieces(ok, ok[:1]), pieces(ok.astype("<f8"))):
        with pytest.raises(ValueError, match="piece"):
            list(pack_state_stream({}, {"a": bad})[1])
