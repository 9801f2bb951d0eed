"""Tests for index.SessionIndex: BM25 over sessions, exact updates."""

from __future__ import annotations

import pickle

import pytest

from index import SessionIndex, analyze


def _index() -> SessionIndex:
    ix = SessionIndex()
    ix.add(
        [1, 2, 3, 4, 5],
        ["t1/a", "t1/a", "t1/b", "t1/b", "t2/a"],
        [
            "we went camping by the lake",
            "the tent leaked",
            "my violin lesson was hard",
            "practice every day",
            "the lake froze over",
        ],
        ["8 May 2023"] * 2 + ["9 May 2023"] * 2 + ["8 May 2023"],
    )
    return ix


def test_members_of_the_best_session_share_its_score() -> None:
    hits = _index().search("camping trip", sessions=1)
    assert [i for i, _ in hits] == [1, 2]
    assert hits[0][1] == hits[1][1] > 0.0


def test_a_turn_without_the_query_words_rises_with_its_session() -> None:
    ix = _index()
    # "tent leaked" holds no query word; its session does ("camping").
    assert 2 in dict(ix.search("camping", sessions=2))
    sessions = ix.search_sessions("lake", sessions=5)
    assert {s for s, _ in sessions} == {"t1/a", "t2/a"}


def test_search_terms_of_the_analysed_query_equals_search() -> None:
    ix = _index()
    for query in ("camping trip", "lake", "the of", ""):
        assert ix.search_terms(analyze(query), 2) == ix.search(query, 2)
    with pytest.raises(ValueError, match="sessions must be"):
        ix.search_terms(["lake"], 0)


def test_the_header_is_part_of_the_document() -> None:
    assert _index().search_sessions("2023", sessions=5) != []
    assert [s for s, _ in _index().search_sessions("violin", sessions=5)] == ["t1/b"]


def test_removing_a_turn_reindexes_its_session_without_its_words() -> None:
    ix = _index()
    assert ix.remove([1]) == 1
    assert ix.search("camping", sessions=5) == []  # only turn 1 said it
    assert ix.session_of(2) == "t1/a"
    assert [s for s, _ in ix.search_sessions("tent", sessions=5)] == ["t1/a"]


def test_a_removed_turns_own_words_leave_the_index_and_their_ids_are_reused() -> None:
    """Members hold term ids; a term nothing holds any more is dropped from the vocabulary."""
    ix = _index()
    ix.remove([3])  # "violin" and "lesson" were turn 3's alone; "hard" too
    held, slots = set(ix._word), len(ix._word)
    assert not {"violin", "lesson", "hard"} & held
    assert {"tent", "practic", "lake"} <= held
    ix.add([6], ["t1/b"], ["a cello recital"], ["9 May 2023"])
    assert len(ix._word) == slots  # the new words took freed ids
    assert [s for s, _ in ix.search_sessions("cello", sessions=5)] == ["t1/b"]
    ix.remove([6, 4])  # session t1/b is gone with its header
    assert not {"cello", "recit", "practic", "9"} & set(ix._word)
    assert ix.search_sessions("cello", sessions=5) == []


def test_removal_is_exact_against_a_fresh_index() -> None:
    ix = _index()
    ix.remove([3])
    fresh = SessionIndex()
    fresh.add(
        [1, 2, 4, 5],
        ["t1/a", "t1/a", "t1/b", "t2/a"],
        [
            "we went camping by the lake",
            "the tent leaked",
            "practice every day",
            "the lake froze over",
        ],
        ["8 May 2023", "8 May 2023", "9 May 2023", "8 May 2023"],
    )
    for query in ("lake", "practice violin", "tent camping 2023"):
        got, want = ix.search(query, 5), fresh.search(query, 5)
        assert [i for i, _ in got] == [i for i, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want])


def test_a_session_without_members_is_dropped_with_its_header() -> None:
    ix = _index()
    ix.remove([3, 4])
    assert set(ix.sessions()) == {"t1/a", "t2/a"}
    assert ix.search_sessions("9", sessions=5) == []
    assert len(ix) == 3


def test_adding_an_id_again_moves_it() -> None:
    ix = _index()
    ix.add([5], ["t1/b"], ["the lake froze over"], ["9 May 2023"])
    assert ix.sessions()["t1/b"] == frozenset({3, 4, 5})
    assert "t2/a" not in ix.sessions()


def test_unknown_words_give_nothing() -> None:
    assert _index().search("zeppelin", sessions=3) == []
    assert SessionIndex().search("lake", sessions=3) == []


def test_bad_arguments_are_refused() -> None:
    ix = SessionIndex()
    with pytest.raises(ValueError, match="distinct"):
        ix.add([1, 1], ["a", "a"], ["x", "y"], ["h", "h"])
    with pytest.raises(ValueError, match="got 1 ids"):
        ix.add([1], ["a", "b"], ["x"], ["h"])
    with pytest.raises(ValueError, match="sessions must be"):
        ix.search("x", 0)
    with pytest.raises(ValueError, match="k1"):
        SessionIndex(k1=0.0)


def test_refuses_pickling() -> None:
    with pytest.raises(TypeError, match="plaintext"):
        pickle.dumps(_index())


def test_nbytes_estimates_what_the_session_and_time_indexes_hold() -> None:
    """The cache's estimates stay within 30 % of what tracemalloc sees the two indexes allocate.

    The texts are analysed beforehand, so the analyser's own caches are not
    counted.
    """
    import random
    import tracemalloc

    import numpy as np

    from index import TimeIndex, analyze, time_expression_score

    rng = random.Random(7)
    words = [f"{w}{i}" for i, w in enumerate(["tea", "dog", "rain", "park", "June"] * 800)]
    n = 5000
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 25))) for _ in range(n)]
    sessions = [f"t{i // 200}/{i // 20}" for i in range(n)]
    headers = [f"{1 + (i // 20) % 28} May 2023" for i in range(n)]
    for text in texts + headers:
        analyze(text)
        time_expression_score(text)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        six = SessionIndex()
        six.add(np.arange(n), sessions, texts, headers)
        middle = tracemalloc.take_snapshot()
        tix = TimeIndex()
        tix.add(np.arange(n), [1.6e9 + 3600.0 * i for i in range(n)], texts)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    used_sessions = sum(s.size_diff for s in middle.compare_to(before, "filename"))
    used_times = sum(s.size_diff for s in after.compare_to(middle, "filename"))
    assert 0.7 * used_sessions <= six.nbytes() <= 1.3 * used_sessions, (six.nbytes(), used_sessions)
    assert 0.7 * used_times <= tix.nbytes() <= 1.3 * used_times, (tix.nbytes(), used_times)
    six.remove(np.arange(n))
    tix.remove(np.arange(n))
    assert (six.nbytes(), tix.nbytes()) == (0, 0)
