"""Visibility holds in every search mode, and contextual indexing follows the records it quotes.

Nothing forgotten, expired or pending leaks through any leg, and forgetting the
previous turn re-indexes the next without it.
"""

from __future__ import annotations

import time

import pytest
from _helpers import append, create_thread, forget
from conftest import Client, Lethe

from lethe.v1 import lifecycle_pb2, retrieval_pb2

MODES = {
    "HYBRID": retrieval_pb2.SearchRequest.HYBRID,
    "DENSE": retrieval_pb2.SearchRequest.DENSE,
    "LEXICAL": retrieval_pb2.SearchRequest.LEXICAL,
}


def _texts(
    c: Client, query: str, mode: str, *, thread: str = "", include_pending: bool = False
) -> list[str]:
    resp = c.retrieval.Search(
        retrieval_pb2.SearchRequest(
            parent="owners/alice",
            query_text=query,
            top_k=20,
            mode=MODES[mode],
            thread=thread,
            include_pending=include_pending,
        ),
        metadata=tuple(c.md),
    )
    return [h.turn.text for h in resp.hits]


@pytest.mark.parametrize("mode", list(MODES))
def test_pending_turn_only_in_its_thread_with_include_pending(lethe: Lethe, mode: str) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    append(c, thread, ["the quetzalcoatl statue arrived broken"])
    append(c, thread, ["weather is mild today"], commit=True)
    assert "the quetzalcoatl statue arrived broken" not in _texts(c, "quetzalcoatl statue", mode)
    found = _texts(c, "quetzalcoatl statue", mode, thread=thread, include_pending=True)
    assert "the quetzalcoatl statue arrived broken" in found


@pytest.mark.parametrize("mode", list(MODES))
def test_forgotten_turn_is_gone_from_every_mode(lethe: Lethe, mode: str) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turns = append(c, thread, ["my zanzibarite collection grew", "lunch was pasta"], commit=True)
    assert "my zanzibarite collection grew" in _texts(c, "zanzibarite collection", mode)
    forget(c, turns[0].name)
    assert "my zanzibarite collection grew" not in _texts(c, "zanzibarite collection", mode)
    assert "my zanzibarite collection grew" not in _texts(
        c, "zanzibarite collection", mode, thread=thread, include_pending=True
    )


@pytest.mark.parametrize("mode", list(MODES))
def test_expired_pending_turn_is_refused_by_every_mode_without_sweeper(
    lethe: Lethe, mode: str
) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    append(c, thread, ["the obsidian kettle whistles"], ttl=0.5)
    found = _texts(c, "obsidian kettle", mode, thread=thread, include_pending=True)
    assert found == ["the obsidian kettle whistles"]
    time.sleep(0.7)
    assert _texts(c, "obsidian kettle", mode, thread=thread, include_pending=True) == []


def test_forgetting_the_previous_turn_reindexes_the_next_without_it(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turns = append(c, thread, ["my cat is called pumpernickel", "she likes sardines"], commit=True)
    before = _texts(c, "pumpernickel", "LEXICAL")
    # The second turn matches through its contextual text (it quotes the first).
    assert set(before) == {"my cat is called pumpernickel", "she likes sardines"}
    forget(c, turns[0].name)
    assert _texts(c, "pumpernickel", "LEXICAL") == []
    assert _texts(c, "sardines", "LEXICAL") == ["she likes sardines"]
    # A restart rebuilds the indexes from LMDB: same answer.
    lethe.restart()
    c = lethe.client("alice")
    assert _texts(c, "pumpernickel", "LEXICAL") == []


def test_pending_previous_turn_never_enters_the_general_index(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    first = append(c, thread, ["the password hint is quixotic"])
    append(c, thread, ["anyway how was your day"], commit=True)
    assert _texts(c, "quixotic", "LEXICAL") == []
    c.lifecycle.Commit(lifecycle_pb2.CommitRequest(names=[first[0].name]), metadata=tuple(c.md))
    # Once committed, the first turn is found, and the next one quotes it.
    assert set(_texts(c, "quixotic", "LEXICAL")) == {
        "the password hint is quixotic",
        "anyway how was your day",
    }


def test_audit_sees_a_context_that_quotes_the_wrong_turn(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turns = append(c, thread, ["first words", "second words", "third words"], commit=True)
    forget(c, turns[1].name)
    _texts(c, "words", "LEXICAL")  # loads the owner's indexes
    report = c.lifecycle.Audit(
        lifecycle_pb2.AuditRequest(parent="owners/alice"), metadata=tuple(c.md)
    )
    assert report.index_drift == 0
    # White-box: make the third turn's context claim it quotes the forgotten turn.
    assert lethe.server is not None
    bundle = lethe.server.retriever.cache.get("o/alice")
    assert bundle is not None
    rids = sorted(bundle.ctx_prev)
    bundle.ctx_prev[rids[-1]] = 999_999
    report = c.lifecycle.Audit(
        lifecycle_pb2.AuditRequest(parent="owners/alice"), metadata=tuple(c.md)
    )
    assert report.index_drift == 1
