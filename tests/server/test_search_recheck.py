"""The recheck of search candidates on a real store.

Candidates the recheck drops (no row, pending, another owner's) are replaced by
the next ones in rank order, and when the best ``top_k`` all survive no other
candidate's row is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server.retrieval import Retriever, SearchHit, indexed_text
from server.store import Store, TurnDraft


@pytest.fixture
def store(tmp_path: Path, kek_env: str) -> Iterator[Store]:
    s = Store(tmp_path / "d")
    s.create_thread("alice", "t1", "")
    s.create_thread("bob", "t1", "")
    committed = [TurnDraft(1, "", f"kept {i}", None, None, "", [], True, 0.0) for i in range(6)]
    pending = [TurnDraft(1, "", f"held {i}", None, None, "", [], False, 3600.0) for i in range(2)]
    s.append_turns("alice", "t1", [*committed, *pending], "req-1")
    s.append_turns("bob", "t1", [TurnDraft(1, "", "bob's", None, None, "", [], True, 0.0)], "r2")
    yield s
    s.close()


def _texts(hits: list[SearchHit]) -> list[str]:
    return [indexed_text(h.view) for h in hits]


def _rids(store: Store, owner: str) -> dict[str, int]:
    return {m.name.rsplit("/", 1)[1]: m.rid for m in store.owner_turns(owner)}


def test_dropped_leading_candidates_are_replaced_in_rank_order(store: Store) -> None:
    alice, bob = _rids(store, "alice"), _rids(store, "bob")
    ranked = [
        (10**12, 0.99),  # no such record
        (alice["7"], 0.98),  # pending: not in general search
        (bob["1"], 0.97),  # another owner's
        (alice["2"], 0.9),
        (alice["8"], 0.85),  # pending
        (alice["4"], 0.8),
        (alice["1"], 0.7),
        (alice["3"], 0.6),
    ]
    hits = Retriever(store, None)._materialise(ranked, "alice", 3, None)
    assert list(zip(_texts(hits), [h.score for h in hits], strict=True)) == [
        ("kept 1", 0.9),
        ("kept 3", 0.8),
        ("kept 0", 0.7),
    ]


def test_pending_candidates_count_in_their_own_thread(store: Store) -> None:
    alice = _rids(store, "alice")
    ranked = [(alice["7"], 0.9), (alice["1"], 0.8)]
    hits = Retriever(store, None)._materialise(ranked, "alice", 2, "t1")
    assert _texts(hits) == ["held 0", "kept 0"]


def test_when_the_best_survive_no_other_row_is_read(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = _rids(store, "alice")
    ranked = [(alice[str(seq)], 1.0 - seq / 10) for seq in range(1, 7)]
    asked: list[list[int]] = []
    fetch = store.fetch

    def counting_fetch(rids: Any) -> Any:
        asked.append(list(rids))
        return fetch(rids)

    monkeypatch.setattr(store, "fetch", counting_fetch)
    hits = Retriever(store, None)._materialise(ranked, "alice", 3, None)
    assert _texts(hits) == ["kept 0", "kept 1", "kept 2"]
    assert asked == [[alice["1"], alice["2"], alice["3"]]]


def test_too_few_survivors_returns_every_survivor(store: Store) -> None:
    alice, bob = _rids(store, "alice"), _rids(store, "bob")
    ranked = [(bob["1"], 0.9), (alice["5"], 0.8), (alice["7"], 0.7), (alice["6"], 0.6)]
    hits = Retriever(store, None)._materialise(ranked, "alice", 10, None)
    assert _texts(hits) == ["kept 4", "kept 5"]
