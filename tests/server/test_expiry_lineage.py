"""Expiry follows lineage at read time, the instant a pending source expires.

Before the sweeper forgets the source, an assistant turn whose context named it
is tainted in every read path, and what was derived from that turn is gone,
exactly as after a forget; then the sweeper makes it permanent.
"""

from __future__ import annotations

import time

import grpc
from _helpers import create_thread, expect_error, reply, turn_input
from conftest import Client, Lethe

from lethe.v1 import common_pb2, lifecycle_pb2, memories_pb2, retrieval_pb2, threads_pb2

M = memories_pb2.Memory
MODES = [
    retrieval_pb2.SearchRequest.HYBRID,
    retrieval_pb2.SearchRequest.DENSE,
    retrieval_pb2.SearchRequest.LEXICAL,
]
TTL = 1.5  # seconds the pending source lives


def _setup(c: Client) -> tuple[str, threads_pb2.Turn, str]:
    """(the pending source, the committed response that used it, a fact derived from it).

    The fact is committed and derived from the response.
    """
    t1 = create_thread(c, "alice", "t1")
    t2 = create_thread(c, "alice", "t2")
    pending = c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=t1, turns=[turn_input("the quince orchard gate code is 4417", ttl=TTL)]
        ),
        metadata=c.md,
    ).turns[0]
    response = reply(c, t2, "the quince orchard gate code you gave me is 4417", [pending.name])
    fact = c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent="owners/alice",
            memory_id="gate",
            memory=M(
                kind=M.FACT,
                text="quince orchard gate opens with 4417",
                state=common_pb2.COMMITTED,
                sources=[common_pb2.SourceRef(name=response.name, version=1)],
            ),
        ),
        metadata=c.md,
    )
    return pending.name, response, fact.name


def _found_anywhere(c: Client, thread: str, names: set[str]) -> set[str]:
    found: set[str] = set()
    for mode in MODES:
        resp = c.retrieval.Search(
            retrieval_pb2.SearchRequest(
                parent="owners/alice", query_text="quince orchard gate code", top_k=50, mode=mode
            ),
            metadata=c.md,
        )
        found |= {h.turn.name or h.memory.name for h in resp.hits}
    bundle = c.retrieval.AssembleContext(
        retrieval_pb2.AssembleContextRequest(thread=thread, query_text="quince orchard gate"),
        metadata=c.md,
    )
    found |= {t.name for t in bundle.recent_turns} | {h.memory.name for h in bundle.memories}
    listed = c.memories.ListMemories(
        memories_pb2.ListMemoriesRequest(parent="owners/alice"), metadata=c.md
    )
    found |= {m.name for m in listed.memories}
    turns = c.threads.ListTurns(threads_pb2.ListTurnsRequest(parent=thread), metadata=c.md)
    found |= {t.name for t in turns.turns}
    return found & names


def _assert_gone(c: Client, pending: str, response: threads_pb2.Turn, fact: str) -> None:
    thread = response.name.rsplit("/turns/", 1)[0]
    assert _found_anywhere(c, thread, {response.name, fact}) == set()
    got = c.threads.GetTurn(threads_pb2.GetTurnRequest(name=response.name), metadata=c.md)
    assert got.tainted  # what was said stays readable by name, marked
    with_tainted = c.threads.ListTurns(
        threads_pb2.ListTurnsRequest(parent=thread, include_tainted=True), metadata=c.md
    )
    assert [(t.name, t.tainted) for t in with_tainted.turns] == [(response.name, True)]
    for name in (pending, fact):
        call = c.threads.GetTurn if "/turns/" in name else c.memories.GetMemory
        req = (
            threads_pb2.GetTurnRequest(name=name)
            if "/turns/" in name
            else memories_pb2.GetMemoryRequest(name=name)
        )
        expect_error(call, req, c.md, grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")
    expect_error(
        c.memories.CreateMemory,
        memories_pb2.CreateMemoryRequest(
            parent="owners/alice",
            memory=M(
                kind=M.SUMMARY,
                text="late summary",
                sources=[common_pb2.SourceRef(name=response.name, version=1)],
            ),
        ),
        c.md,
        grpc.StatusCode.FAILED_PRECONDITION,
        "SOURCE_DELETED",
    )


def test_an_expired_pending_source_taints_its_response_before_the_sweeper(
    lethe: Lethe,
) -> None:
    c = lethe.client("alice")
    pending, response, fact = _setup(c)
    thread = response.name.rsplit("/turns/", 1)[0]
    # Before expiry: the response and the fact are found everywhere.
    assert _found_anywhere(c, thread, {response.name, fact}) == {response.name, fact}
    time.sleep(TTL + 0.3)
    _assert_gone(c, pending, response, fact)  # no sweeper has run (sweep_interval 0)
    lethe.restart()  # indexes built afresh from LMDB: the same
    _assert_gone(lethe.client("alice"), pending, response, fact)
    assert lethe.server is not None
    assert lethe.server.lifecycle.sweep() == 1  # the sweeper forgets the expired source
    c = lethe.client("alice")
    _assert_gone(c, pending, response, fact)
    report = c.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent="owners/alice"), metadata=c.md)
    assert (report.orphans, report.records_without_key, report.index_drift) == (0, 0, 0)


def test_a_committed_source_keeps_its_response(lethe: Lethe) -> None:
    """Control: committing the pending source in time keeps everything."""
    c = lethe.client("alice")
    pending, response, fact = _setup(c)
    c.lifecycle.Commit(lifecycle_pb2.CommitRequest(names=[pending]), metadata=c.md)
    time.sleep(TTL + 0.3)
    thread = response.name.rsplit("/turns/", 1)[0]
    assert _found_anywhere(c, thread, {response.name, fact}) == {response.name, fact}
    got = c.threads.GetTurn(threads_pb2.GetTurnRequest(name=response.name), metadata=c.md)
    assert not got.tainted
