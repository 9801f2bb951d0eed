"""The session and time legs of Search: what they add, and that they obey every visibility rule.

A forgotten, pending, expired, sealed or tainted turn never contributes to a
session's document (so it never lifts another turn), a forget re-indexes its
session, and the audit checks it. The time heuristics add an empty leg, never a
filter, to a question they do not apply to.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from _helpers import append, create_thread, forget, reply, turn_input
from conftest import Client, Lethe
from google.protobuf import timestamp_pb2

from index import HYBRID_WEIGHTS
from lethe.v1 import lifecycle_pb2, retrieval_pb2, threads_pb2

MODES = {
    "HYBRID": retrieval_pb2.SearchRequest.HYBRID,
    "LEXICAL": retrieval_pb2.SearchRequest.LEXICAL,
}
# "zorblax" is said by one turn; its session-mate "we packed the tent" says
# nothing of it, and is found for "zorblax" only through the session leg.
SAYS = "my zorblax festival ticket came"
MATE = "we packed the tent"


def _texts(
    c: Client, query: str, mode: str = "HYBRID", *, thread: str = "", pending: bool = False
) -> list[str]:
    """The texts of the hits a leg other than the dense one contributed to.

    In LEXICAL every hit; in HYBRID those scoring above the dense leg's weight
    (the most a turn gets from dense similarity alone, which finds every turn).
    """
    floor = 0.0 if mode == "LEXICAL" else HYBRID_WEIGHTS[0] + 1e-6
    resp = c.retrieval.Search(
        retrieval_pb2.SearchRequest(
            parent="owners/alice",
            query_text=query,
            top_k=20,
            mode=MODES[mode],
            thread=thread,
            include_pending=pending,
        ),
        metadata=c.md,
    )
    return [h.turn.text for h in resp.hits if h.score > floor]


def _drift(c: Client) -> int:
    report = c.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent="owners/alice"), metadata=c.md)
    return int(report.index_drift)


def _at(c: Client, thread: str, items: list[tuple[str, datetime]]) -> list[threads_pb2.Turn]:
    inputs = []
    for text, when in items:
        inp = turn_input(text, commit=True)
        ts = timestamp_pb2.Timestamp()
        ts.FromDatetime(when)
        inp.time.CopyFrom(ts)
        inputs.append(inp)
    return list(c.append_turns(thread, inputs, echo_text=True).turns)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_session_mate_is_found_through_its_session(lethe: Lethe, mode: str) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    t2 = create_thread(c, "alice", "t2")
    append(c, t1, [SAYS, "filler words here", MATE], commit=True)
    append(c, t2, ["unrelated cooking chat"], commit=True)
    found = _texts(c, "zorblax", mode)
    assert found[0] == SAYS
    assert MATE in found  # no word of the query: lifted by its session
    assert "unrelated cooking chat" not in found
    assert _drift(c) == 0


def test_forgetting_a_turn_reindexes_its_session_without_it(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    turns = append(c, t1, [SAYS, "filler words here", MATE], commit=True)
    assert MATE in _texts(c, "zorblax")
    forget(c, turns[0].name)
    assert _texts(c, "zorblax") == []
    assert _texts(c, "zorblax", "LEXICAL") == []
    assert _drift(c) == 0
    lethe.restart()  # built afresh from LMDB: the same
    assert _texts(lethe.client("alice"), "zorblax") == []


def test_a_pending_turn_never_enters_the_owners_session_documents(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    append(c, t1, [SAYS])  # pending
    append(c, t1, [MATE], commit=True)
    for mode in MODES:
        assert _texts(c, "zorblax", mode) == []
    # Within its own thread (include_pending) it may lift pending turns only.
    found = _texts(c, "zorblax", thread=t1, pending=True)
    assert found == [SAYS]
    assert _drift(c) == 0


def test_an_expired_pending_turn_stops_contributing_before_the_sweeper(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    append(c, t1, [SAYS], ttl=0.8)
    append(c, t1, [MATE])  # pending, lives 72 h
    found = _texts(c, "zorblax", thread=t1, pending=True)
    assert found[0] == SAYS
    assert MATE in found  # lifted by the pending session's document
    time.sleep(1.0)  # sweep_interval 0: no sweeper runs in these tests
    for mode in MODES:
        assert _texts(c, "zorblax", mode, thread=t1, pending=True) == []
    assert _texts(c, "packed tent", thread=t1, pending=True) == [MATE]


def test_a_sealed_turn_leaves_its_session(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    turns = append(c, t1, [MATE, "filler words here", SAYS], commit=True)
    assert MATE in _texts(c, "zorblax")
    c.seal_repair(t1, from_seq=turns[2].seq)
    for mode in MODES:
        assert _texts(c, "zorblax", mode) == []
    assert _drift(c) == 0


def test_a_tainted_response_leaves_its_session(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    t2 = create_thread(c, "alice", "t2")
    (source,) = append(c, t1, ["the locker code is 2231"], commit=True)
    reply(c, t2, "your zorblax locker code is 2231", [source.name])
    append(c, t2, [MATE], commit=True)
    assert MATE in _texts(c, "zorblax")
    c.forget([source.name], responses="TAINT")
    for mode in MODES:
        found = _texts(c, "zorblax", mode)
        assert MATE not in found
        assert found == []
    assert _drift(c) == 0


def test_a_response_whose_pending_source_expired_leaves_its_session(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    t2 = create_thread(c, "alice", "t2")
    (source,) = append(c, t1, ["the locker code is 2231"], ttl=0.8)  # pending
    reply(c, t2, "your zorblax locker code is 2231", [source.name])
    append(c, t2, [MATE], commit=True)
    assert MATE in _texts(c, "zorblax")
    time.sleep(1.0)  # the source expires; no sweeper runs
    for mode in MODES:
        assert _texts(c, "zorblax", mode) == []
    assert _drift(c) == 0


def test_the_audit_sees_a_session_holding_a_forgotten_turn(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    turns = append(c, t1, [SAYS, MATE], commit=True)
    forget(c, turns[0].name)
    _texts(c, "tent")  # loads the owner's indexes
    assert _drift(c) == 0
    assert lethe.server is not None
    bundle = lethe.server.retriever.cache.get("o/alice")
    assert bundle is not None
    # White-box: put the forgotten turn back into its session's document.
    (mate_rid,) = bundle.sessions.ids()
    session = bundle.sessions.session_of(int(mate_rid))
    assert session is not None
    bundle.sessions.add([int(mate_rid) - 1], [session], [SAYS], ["1 January 2030"])
    assert _drift(c) == 2  # a member that is not visible; the time leg lacks it


def test_a_when_question_prefers_the_turn_that_anchors_a_time(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    append(c, t1, ["camping trips are the best kind of trips"], commit=True)
    t2 = create_thread(c, "alice", "t2")
    append(c, t2, ["we went camping at the lake yesterday"], commit=True)
    assert _texts(c, "When did we go camping?")[0] == "we went camping at the lake yesterday"
    # Not a when-question: no prior, no filter; the plain BM25 order stands.
    assert _texts(c, "camping trips")[0] == "camping trips are the best kind of trips"
    # Every LEXICAL hit comes from a non-dense leg: the other turn is still found.
    found = _texts(c, "camping trips", "LEXICAL")
    assert found == [
        "camping trips are the best kind of trips",
        "we went camping at the lake yesterday",
    ]


def test_a_question_naming_a_date_prefers_turns_said_on_or_just_after_it(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    _at(c, t1, [("we had dinner at the harbour", datetime(2023, 5, 7, 18, tzinfo=UTC))])
    t2 = create_thread(c, "alice", "t2")
    _at(c, t2, [("we had dinner at the harbour", datetime(2023, 6, 20, 18, tzinfo=UTC))])
    on_may = _texts(c, "Where did we have dinner on 7 May 2023?")
    on_june = _texts(c, "Where did we have dinner in June 2023?")
    names = c.retrieval.Search(
        retrieval_pb2.SearchRequest(
            parent="owners/alice", query_text="Where did we have dinner on 7 May 2023?"
        ),
        metadata=c.md,
    ).hits
    assert len(on_may) == len(on_june) == 2  # both found: a re-ranking, never a filter
    assert names[0].turn.name.startswith(t1)
    assert names[0].score > names[1].score
    assert names[1].score > 0.0
    june = c.retrieval.Search(
        retrieval_pb2.SearchRequest(
            parent="owners/alice", query_text="Where did we have dinner in June 2023?"
        ),
        metadata=c.md,
    ).hits
    assert june[0].turn.name.startswith(t2)
