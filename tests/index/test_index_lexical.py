"""Tests for index.LexicalIndex against real bm25s and PyStemmer."""

import pickle
import threading

import bm25s
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from index import LexicalIndex, _lexical, analyze
from index._lexical import bm25_matrix

TEXTS = [
    "Caroline: I went to a support group yesterday, it was powerful.",
    "Melanie: She runs every morning before work.",
    "Caroline: I'm researching adoption agencies for my family.",
    "Melanie: We painted a sunrise by the lake last week.",
]


def _index() -> LexicalIndex:
    ix = LexicalIndex()
    ix.add([10, 11, 12, 13], TEXTS)
    return ix


def test_analyze_lowercases_drops_stopwords_and_stems() -> None:
    assert analyze("What did Caroline RESEARCH about the running?") == [
        "carolin",
        "research",
        "run",
    ]


def test_search_ranks_matching_doc_first_with_positive_scores() -> None:
    hits = _index().search("adoption agencies", k=3)
    assert hits[0][0] == 12
    assert len(hits) == 1
    assert hits[0][1] > 0.0


def test_stemming_query_running_finds_runs() -> None:
    hits = _index().search("running", k=5)
    assert [i for i, _ in hits] == [11]


def test_results_are_best_first_and_capped_at_k() -> None:
    ix = _index()
    hits = ix.search("Caroline Melanie support lake", k=2)
    assert len(hits) == 2
    assert hits[0][1] >= hits[1][1]


def test_search_terms_of_the_analysed_query_equals_search() -> None:
    ix = _index()
    ix.add([14], ["Melanie: a support group by the lake"])  # a delta beside the main segment
    for query in ("Caroline Melanie support lake", "running", "the of", ""):
        assert ix.search_terms(analyze(query), 3) == ix.search(query, 3)
    with pytest.raises(ValueError, match="k must be"):
        ix.search_terms(["lake"], 0)


def test_query_of_only_stopwords_or_unknown_terms_finds_nothing() -> None:
    ix = _index()
    assert ix.search("what is the", k=5) == []
    assert ix.search("zeppelin", k=5) == []


def test_remove_makes_doc_unfindable_immediately() -> None:
    ix = _index()
    assert ix.search("sunrise", k=5)[0][0] == 13
    assert ix.remove([13, 999]) == 1
    assert ix.search("sunrise", k=5) == []
    assert 13 not in ix
    assert len(ix) == 3
    np.testing.assert_array_equal(ix.ids(), [10, 11, 12])


def test_removed_terms_leave_the_vocabulary() -> None:
    ix = _index()
    ix.remove([13])
    ix.add([14], ["Melanie: the lake again"])
    assert [i for i, _ in ix.search("sunrise lake", k=5)] == [14]


def test_readding_an_id_replaces_its_text() -> None:
    ix = _index()
    ix.add([12], ["Caroline: I bought a violin."])
    assert ix.search("adoption", k=5) == []
    assert [i for i, _ in ix.search("violin", k=5)] == [12]
    assert len(ix) == 4


def test_empty_index_and_empty_batches() -> None:
    ix = LexicalIndex()
    assert ix.search("anything", k=3) == []
    ix.add([], [])
    assert ix.remove([]) == 0
    assert len(ix) == 0


def test_scores_match_bm25_lucene_formula() -> None:
    ix = LexicalIndex(k1=1.2, b=0.75)
    ix.add([1, 2, 3], ["apple banana", "apple apple cherry", "cherry"])
    n, df, avgdl = 3, 2, 6 / 3
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    expected = {
        2: idf * 2 / (2 + 1.2 * (0.25 + 0.75 * 3 / avgdl)),
        1: idf * 1 / (1 + 1.2 * (0.25 + 0.75 * 2 / avgdl)),
    }
    hits = ix.search("apple", k=3)
    assert [i for i, _ in hits] == [2, 1]
    for id_, score in hits:
        assert score == pytest.approx(expected[id_], rel=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 11), max_size=30), min_size=1, max_size=25),
    chunk=st.sampled_from([1, 7, 64, 1 << 20]),
    k1=st.sampled_from([0.9, 1.2, 1.5]),
    b=st.sampled_from([0.0, 0.4, 0.75, 1.0]),
)
def test_bm25_matrix_is_bm25s_build_bit_for_bit(
    docs: list[list[int]], chunk: int, k1: float, b: float
) -> None:
    """The vectorised build gives bm25s's own matrix: same floats, same order, any chunking.

    Term ids 0-11 of which some are held by no document (empty columns),
    empty documents, and chunks of 1 to 1 MiB term occurrences.
    """
    if not any(docs):
        docs = [*docs, [3]]
    reference = bm25s.BM25(k1=k1, b=b, method="lucene").build_index_from_ids(
        unique_token_ids=list(range(12)), corpus_token_ids=docs, show_progress=False
    )
    arrays = [np.array(d, dtype=np.int32) for d in docs]
    previous = _lexical._CHUNK_TERMS
    _lexical._CHUNK_TERMS = chunk
    try:
        data, indices, indptr = bm25_matrix(arrays, 12, k1, b)
    finally:
        _lexical._CHUNK_TERMS = previous
    assert [str(a.dtype) for a in (data, indices, indptr)] == ["float32", "int32", "int64"]
    assert indptr.tolist() == np.asarray(reference["indptr"]).tolist()
    assert indices.tolist() == np.asarray(reference["indices"]).tolist()
    assert data.tobytes() == np.asarray(reference["data"], dtype=np.float32).tobytes()


def test_to_state_copies_every_document_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state taken in small copy steps holds every document's terms in order."""
    monkeypatch.setattr(_lexical, "_CHUNK_TERMS", 3)
    ix = _index()
    meta, arrays = ix.to_state()
    again = LexicalIndex.from_state((meta, arrays))
    assert again.terms_of() == ix.terms_of()
    assert again.search("adoption agencies", 2) == ix.search("adoption agencies", 2)


def test_add_rejects_bad_batches_without_changing_index() -> None:
    ix = _index()
    with pytest.raises(ValueError, match="distinct"):
        ix.add([1, 1], ["a b", "c d"])
    with pytest.raises(ValueError, match="ids for"):
        ix.add([1, 2], ["a b"])
    with pytest.raises(ValueError, match="integers"):
        ix.add([1.5], ["a b"])
    with pytest.raises(TypeError, match="strings"):
        ix.add([1], [b"bytes"])  # type: ignore[list-item]
    assert len(ix) == 4


def test_search_rejects_k_below_one() -> None:
    with pytest.raises(ValueError, match="k must be"):
        _index().search("lake", k=0)


def test_contains_only_ints() -> None:
    ix = _index()
    assert 10 in ix
    assert np.int64(11) in ix
    assert "10" not in ix
    ix.add([1], ["one"])
    assert 1 in ix
    assert True not in ix  # True == 1, yet a bool is not an id


def test_pickling_is_refused() -> None:
    with pytest.raises(TypeError, match="plaintext"):
        pickle.dumps(_index())


def test_a_small_change_after_the_build_rebuilds_nothing() -> None:
    """A write after the first search lands in the delta and is found without a rebuild.

    The first search builds the main segment; the first search after a write
    costs what any search costs.
    """
    ix = _index()
    ix.search("lake", k=1)
    ix.search("lake", k=1)
    assert ix.rebuilds == 1
    ix.add([20], ["new lake text"])
    ix.remove([13])
    assert [i for i, _ in ix.search("lake", k=5)] == [20]
    assert ix.rebuilds == 1


def test_many_changes_rebuild_the_main_segment_once_past_the_threshold() -> None:
    from index._lexical import MIN_REBUILD

    ix = LexicalIndex()
    ix.add(np.arange(10_000), [f"base doc{i} lake" for i in range(10_000)])
    ix.search("lake", k=1)
    for i in range(MIN_REBUILD + 500):
        ix.add([100_000 + i], [f"fresh lake {i}"])
    assert ix.rebuilds == 2  # one rebuild, when the delta passed 10 % of 10,000
    assert len(ix.search("fresh", k=10_000)) == MIN_REBUILD + 500


def test_delta_scores_equal_a_fresh_build() -> None:
    """Documents in the delta are scored with the current collection statistics.

    That is exactly what a full rebuild over the same documents gives them.
    """
    base = [f"common words {i} here" for i in range(50)]
    extra = ["apple apple common", "apple banana"]
    grown = LexicalIndex(k1=1.2, b=0.75)
    grown.add(np.arange(50), base)
    grown.search("common", k=1)  # builds the main segment
    grown.add([50, 51], extra)  # the delta
    fresh = LexicalIndex(k1=1.2, b=0.75)
    fresh.add(np.arange(52), base + extra)
    got = dict(grown.search("apple", k=5))
    want = dict(fresh.search("apple", k=5))
    assert set(got) == set(want) == {50, 51}
    for id_, score in want.items():
        assert got[id_] == pytest.approx(score, rel=1e-5)


def test_concurrent_add_remove_and_search_stay_consistent() -> None:
    ix = LexicalIndex()
    ix.add(np.arange(100), [f"common doc{i}" for i in range(100)])
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        try:
            for round_ in range(30):
                base = 1000 + round_ * 10
                ix.add(np.arange(base, base + 10), [f"common fresh{j}" for j in range(10)])
                ix.remove(np.arange(base, base + 10))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            stop.set()

    def reader() -> None:
        try:
            while not stop.is_set():
                hits = ix.search("common", k=200)
                assert len(hits) >= 100
                assert all(s > 0.0 for _, s in hits)
                assert len({i for i, _ in hits}) == len(hits)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=reader) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(ix) == 100
    assert len(ix.search("common", k=500)) == 100


def test_nbytes_estimates_what_the_index_holds() -> None:
    """The estimate the index cache bounds by stays within 30 % of what tracemalloc sees allocated.

    Measured with a main segment and a delta.
    """
    import random
    import tracemalloc

    rng = random.Random(7)
    words = [f"{w}{i}" for i, w in enumerate(["tea", "dog", "rain", "park", "Paris"] * 1200)]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) for _ in range(6000)]
    warm = LexicalIndex()  # what a first build imports is not the index's memory
    warm.add([1], ["warm up"])
    warm.search("warm", 1)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        ix = LexicalIndex()
        ix.add(np.arange(5000), texts[:5000])
        ix.search("tea1 dog2", 5)  # builds the main segment
        ix.add(np.arange(5000, 5400), texts[5000:5400])  # lands in the delta
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    used = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert ix.rebuilds == 1
    assert 0.7 * used <= ix.nbytes() <= 1.3 * used, (ix.nbytes(), used)
    assert LexicalIndex().nbytes() == 0


_WORDS = ["lake", "violin", "tent", "dinner", "sunrise", "garden"]
_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(0, 15),
            st.lists(st.sampled_from(_WORDS), max_size=4).map(" ".join),
        ),
        st.tuples(st.just("remove"), st.integers(0, 15), st.just("")),
        st.tuples(st.just("search"), st.just(0), st.just("")),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=_ops, threshold=st.sampled_from([1, 3, 512]))
def test_documents_held_follow_any_sequence_of_adds_removals_and_rebuilds(
    ops: list[tuple[str, int, str]], threshold: int
) -> None:
    """Documents in the main segment, in the delta and masked agree with a plain dict.

    Ids arrive in any order; a low rebuild threshold moves documents between
    the delta and the main segment often.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_lexical, "MIN_REBUILD", threshold)
        patch.setattr(_lexical, "REBUILD_FRACTION", 0.0 if threshold < 512 else 0.1)
        _follow(ops)


def _follow(ops: list[tuple[str, int, str]]) -> None:
    ix, model = LexicalIndex(), {}
    for op, id_, text in ops:
        if op == "add":
            ix.add([id_], [text])
            model[id_] = analyze(text)
        elif op == "remove":
            assert ix.remove([id_]) == (1 if model.pop(id_, None) is not None else 0)
        else:
            ix.search("lake", 1)  # builds the main segment when there is none
    for index in (ix, LexicalIndex.from_state(ix.to_state())):
        assert index.terms_of() == model
        assert len(index) == len(model)
        assert index.ids().tolist() == sorted(model)
        assert all((i in index) == (i in model) for i in range(16))
        for word in _WORDS:
            want = {i for i, terms in model.items() if analyze(word)[0] in terms}
            assert {i for i, _ in index.search(word, 100)} == want


def test_a_rebuild_with_the_index_own_document_counts_is_the_bm25s_matrix() -> None:
    """A rebuild takes each term's document frequency from the index's reference counts.

    After a removal freed term ids and an add reused them, the main segment
    equals ``bm25_matrix`` over the held documents.
    """
    ix = _index()
    ix.search("adoption", 3)  # the first main segment
    ix.remove([11])
    ix.add([50, 51], ["adoption papers signed today", "a brand new word here"])
    with ix._lock:
        ix._built = ix._build()
    built = ix._built
    assert built is not None
    docs = [np.frombuffer(ix._docs[int(i)], np.int32) for i in built.ids.tolist()]
    data, indices, indptr = bm25_matrix(docs, len(ix._refs), ix._k1, ix._b)
    assert indptr.tolist() == built.indptr.tolist()
    assert indices.tolist() == built.indices.tolist()
    assert data.tobytes() == built.data.tobytes()
