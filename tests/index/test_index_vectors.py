"""Tests for index.VectorIndex against real FAISS."""

import pickle
import threading

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from index import DimensionMismatchError, InvalidVectorError, VectorIndex


def _unit_rows(n: int, d: int, seed: int = 0) -> npt.NDArray[np.float32]:
    rows = np.random.default_rng(seed).normal(size=(n, d))
    unit: npt.NDArray[np.float32] = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(
        np.float32
    )
    return unit


def test_removals_anywhere_keep_every_survivor_exact() -> None:
    """Removals anywhere, in any order, keep every survivor exact under its own id.

    Removing one vector moves the last row into its slot: after removing
    firsts, lasts, runs, repeats and absent ids in any order, and re-adding
    some, every survivor is found under its own id with its own vector (exact
    search against a brute-force scan of the survivors), and no removed id is
    held.
    """
    n, d = 2000, 32
    vecs = _unit_rows(n, d, seed=3)
    ids = np.arange(10_000, 10_000 + n, dtype=np.int64)
    ix = VectorIndex(d)
    ix.add(ids, vecs)
    rng = np.random.default_rng(4)
    live = dict(zip(ids.tolist(), vecs, strict=True))
    batches = [
        [int(ids[-1])],
        [int(ids[0])],
        [int(i) for i in ids[500:1500]],
        [int(ids[1]), int(ids[1]), 5],
        [int(i) for i in rng.choice(ids, 300)],
    ]
    for batch in batches:
        expect = len({i for i in batch if i in live})
        assert ix.remove(np.asarray(batch, dtype=np.int64)) == expect
        for i in batch:
            live.pop(i, None)
    back = [int(i) for i in ids[600:610]]
    ix.add(np.asarray(back), vecs[600:610])
    live.update(zip(back, vecs[600:610], strict=True))
    held = np.asarray(sorted(live), dtype=np.int64)
    assert len(ix) == len(live)
    assert np.array_equal(ix.ids(), held)
    assert all(i in ix for i in back)
    assert int(ids[0]) not in ix
    matrix = np.stack([live[i] for i in held.tolist()])
    for q in rng.choice(len(held), 40, replace=False):
        hits = ix.search(matrix[q], k=5)
        scores = matrix @ matrix[q]
        best = held[np.argsort(-scores, kind="stable")[:5]]
        assert hits[0][0] == int(held[q])
        assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
        assert [h for h, _ in hits] == best.tolist()


def test_add_then_search_identical_vector_scores_one() -> None:
    vecs = _unit_rows(50, 16)
    ix = VectorIndex(16)
    ix.add(np.arange(100, 150), vecs)
    hits = ix.search(vecs[7], k=3)
    assert hits[0][0] == 107
    assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert len(hits) == 3
    assert hits[0][1] >= hits[1][1] >= hits[2][1]
    assert len(ix) == 50


def test_search_scores_are_cosine_of_unnormalised_inputs() -> None:
    ix = VectorIndex(2)
    ix.add([1, 2], [[10.0, 0.0], [1.0, 1.0]])
    hits = ix.search([0.0, 5.0], k=2)
    assert [h[0] for h in hits] == [2, 1]
    assert hits[0][1] == pytest.approx(2**-0.5, abs=1e-6)
    assert hits[1][1] == pytest.approx(0.0, abs=1e-6)


def test_remove_makes_vector_unfindable() -> None:
    vecs = _unit_rows(10, 8)
    ix = VectorIndex(8)
    ix.add(np.arange(10), vecs)
    assert ix.remove([3, 4, 999]) == 2
    assert len(ix) == 8
    assert 3 not in ix
    assert 5 in ix
    assert all(i not in (3, 4) for i, _ in ix.search(vecs[3], k=10))
    np.testing.assert_array_equal(ix.ids(), [0, 1, 2, 5, 6, 7, 8, 9])


def test_remove_absent_ids_returns_zero() -> None:
    ix = VectorIndex(4)
    assert ix.remove([1, 2]) == 0
    assert ix.remove([]) == 0


def test_re_add_replaces_vector() -> None:
    ix = VectorIndex(3)
    ix.add([5], [[1.0, 0.0, 0.0]])
    ix.add([5], [[0.0, 1.0, 0.0]])
    assert len(ix) == 1
    [(hit, score)] = ix.search([0.0, 1.0, 0.0], k=5)
    assert hit == 5
    assert score == pytest.approx(1.0)
    ix.add([5], [[0.0, 1.0, 0.0]])
    assert len(ix) == 1
    np.testing.assert_array_equal(ix.ids(), [5])


def test_search_with_k_larger_than_size() -> None:
    ix = VectorIndex(4)
    ix.add([1, 2], _unit_rows(2, 4))
    hits = ix.search(_unit_rows(1, 4, seed=9)[0], k=1_000_000)
    assert sorted(i for i, _ in hits) == [1, 2]


def test_search_empty_index_returns_nothing() -> None:
    assert VectorIndex(4).search([1.0, 0.0, 0.0, 0.0], k=5) == []


def test_search_with_nonpositive_k_fails() -> None:
    ix = VectorIndex(2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        ix.search([1.0, 0.0], k=0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        ix.search([1.0, 0.0], k=-1)


def test_add_with_wrong_dim_raises_dimension_mismatch() -> None:
    ix = VectorIndex(4)
    with pytest.raises(DimensionMismatchError):
        ix.add([1], np.ones((1, 5)))
    assert len(ix) == 0


def test_search_with_wrong_dim_raises_dimension_mismatch() -> None:
    with pytest.raises(DimensionMismatchError):
        VectorIndex(4).search(np.ones(3), k=1)


def test_add_zero_vector_fails_and_leaves_index_unchanged() -> None:
    ix = VectorIndex(2)
    ix.add([1], [[1.0, 0.0]])
    with pytest.raises(InvalidVectorError):
        ix.add([1, 2], [[0.0, 1.0], [0.0, 0.0]])
    [(hit, score)] = ix.search([1.0, 0.0], k=2)
    assert hit == 1
    assert score == pytest.approx(1.0)


def test_search_with_several_query_rows_fails() -> None:
    with pytest.raises(InvalidVectorError):
        VectorIndex(2).search(np.ones((2, 2)), k=1)


def test_add_with_duplicate_ids_fails() -> None:
    with pytest.raises(ValueError, match="distinct"):
        VectorIndex(2).add([1, 1], np.ones((2, 2)))


def test_add_with_count_mismatch_fails() -> None:
    with pytest.raises(ValueError, match="3 ids for 2 vectors"):
        VectorIndex(2).add([1, 2, 3], np.ones((2, 2)))


def test_add_with_reserved_id_fails() -> None:
    with pytest.raises(ValueError, match="reserved"):
        VectorIndex(2).add([-1], np.ones((1, 2)))


def test_add_with_float_ids_fails() -> None:
    with pytest.raises(ValueError, match="integers"):
        VectorIndex(2).add([1.5], np.ones((1, 2)))


def test_large_int64_ids_round_trip() -> None:
    big = np.iinfo(np.int64).max
    ix = VectorIndex(2)
    ix.add(np.array([big, -(2**40)], dtype=np.int64), [[1.0, 0.0], [0.0, 1.0]])
    assert ix.search([1.0, 0.0], k=1)[0][0] == big
    assert big in ix
    assert -(2**40) in ix


def test_contains_rejects_non_ints() -> None:
    ix = VectorIndex(2)
    ix.add([1], [[1.0, 0.0]])
    assert np.int64(1) in ix
    assert "1" not in ix
    assert True not in ix  # True == 1 and id 1 is held, yet a bool is not an id


def test_vector_index_refuses_pickling() -> None:
    with pytest.raises(TypeError, match="pickle"):
        pickle.dumps(VectorIndex(2))


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    n=st.integers(min_value=1, max_value=24),
    d=st.integers(min_value=2, max_value=32),
)
def test_search_top1_of_stored_vector_is_itself(data: st.DataObject, n: int, d: int) -> None:
    raw = data.draw(
        hnp.arrays(
            np.float64,
            (n, d),
            elements=st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False),
            fill=st.nothing(),
        )
    )
    norms = np.linalg.norm(raw, axis=1)
    assume(bool(np.all(norms > 1e-3)))
    unit = raw / norms[:, None]
    cos = unit @ unit.T
    np.fill_diagonal(cos, -1.0)
    assume(bool(np.all(cos < 0.999)))  # distinct directions: ties would make top-1 ambiguous
    ids = np.arange(n, dtype=np.int64) * 7 + 3
    ix = VectorIndex(d)
    ix.add(ids, raw)
    for i in range(n):
        top_id, score = ix.search(raw[i], k=1)[0]
        assert top_id == ids[i]
        assert score == pytest.approx(1.0, abs=1e-5)


def test_concurrent_searches_during_adds_and_removes() -> None:
    d = 32
    pool = _unit_rows(400, d, seed=3)
    ix = VectorIndex(d)
    ix.add(np.arange(50), pool[:50])
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def writer(offset: int) -> None:
        try:
            start.wait()
            for j in range(50 + offset, 400, 2):
                ix.add([j], pool[j : j + 1])
                if j % 10 == 0:
                    assert ix.remove([j - 20]) == 1  # added earlier by this writer
        except BaseException as e:
            errors.append(e)

    def reader(seed: int) -> None:
        try:
            start.wait()
            rng = np.random.default_rng(seed)
            for _ in range(150):
                q = pool[rng.integers(0, 50)]
                hits = ix.search(q, k=5)
                assert 1 <= len(hits) <= 5
                assert all(-1.0001 <= s <= 1.0001 for _, s in hits)
                assert all(i != -1 for i, _ in hits)
                len(ix)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    threads += [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    removed = {j - 20 for j in range(50, 400) if j % 10 == 0}
    assert len(ix) == 400 - len(removed)
    np.testing.assert_array_equal(ix.ids(), sorted(set(range(400)) - removed))
    top_id, score = ix.search(pool[399], k=1)[0]
    assert top_id == 399
    assert score == pytest.approx(1.0, abs=1e-5)


def test_a_search_from_a_fresh_thread_uses_one_openmp_thread() -> None:
    """A search on a fresh thread (as a gRPC worker is) runs with one OpenMP thread.

    libgomp keeps the thread count per thread: setting it on the main thread
    did not reach the gRPC workers, where each search forked one OpenMP thread
    per core and contended with the other requests.
    """
    import os
    import threading

    import faiss

    index = VectorIndex(8)
    rng = np.random.default_rng(0)
    index.add(np.arange(100), rng.standard_normal((100, 8)))
    seen: dict[str, int] = {}

    def worker() -> None:
        seen["before"] = faiss.omp_get_max_threads()
        index.search(rng.standard_normal(8), 5)
        seen["after"] = faiss.omp_get_max_threads()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["after"] == 1
    if (os.cpu_count() or 1) > 1 and "OMP_NUM_THREADS" not in os.environ:
        assert seen["before"] > 1  # what a fresh thread gets: the bug this fixes


def test_a_query_already_normalised_is_searched_as_given() -> None:
    """``unit=True``: the same hits and scores as the query normalised here."""
    from index import normalize

    index = VectorIndex(16)
    index.add(np.arange(200), _unit_rows(200, 16, seed=1))
    raw = np.random.default_rng(2).normal(size=16) * 3.0
    unit = normalize(raw)[0]
    assert index.search(unit, 10, unit=True) == index.search(unit, 10)
    hits = index.search(unit, 10, unit=True)
    assert [i for i, _ in hits] == [i for i, _ in index.search(raw, 10)]
    with pytest.raises(DimensionMismatchError):
        index.search(unit[:8], 10, unit=True)
    # Anything but a float32 array is normalised, whatever ``unit`` says.
    assert index.search(raw.tolist(), 10, unit=True) == index.search(raw, 10)
