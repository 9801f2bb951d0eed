"""Lineage and deletion that holds, over gRPC against the real server.

Bulk forgets, edges, cascades with rebuild requests, late and stale
publications, tainted responses, Watch.
"""

from __future__ import annotations

import time

import grpc
import pytest
from _helpers import append, create_thread, error_reason, ref, reply, summary, visible_anywhere
from conftest import Client, Lethe
from google.protobuf import field_mask_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from lethe.v1 import (
    common_pb2,
    events_pb2,
    lifecycle_pb2,
    memories_pb2,
    retrieval_pb2,
    threads_pb2,
)

OWNER = "owners/alice"
Kind = memories_pb2.Memory.Kind


def make(
    c: Client,
    memory_id: str,
    text: str,
    sources: list[common_pb2.SourceRef],
    *,
    kind: int = Kind.FACT,
    commit: bool = True,
    edge: tuple[str, str, str] | None = None,
) -> memories_pb2.Memory:
    memory = memories_pb2.Memory(
        kind=kind,  # type: ignore[arg-type]
        text=text,
        sources=sources,
        state=common_pb2.COMMITTED if commit else common_pb2.PENDING,
    )
    if edge is not None:
        memory.edge.CopyFrom(
            memories_pb2.GraphEdge(subject=edge[0], predicate=edge[1], object=edge[2])
        )
    return c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(parent=OWNER, memory_id=memory_id, memory=memory),
        metadata=tuple(c.md),
    )


def forget(c: Client, *names: str, delete_responses: bool = False) -> common_pb2.DeletionReceipt:
    return c.lifecycle.Forget(
        lifecycle_pb2.ForgetRequest(
            names=list(names),
            responses=lifecycle_pb2.ForgetRequest.DELETE
            if delete_responses
            else lifecycle_pb2.ForgetRequest.TAINT,
        ),
        metadata=tuple(c.md),
    )


def memory_ids(c: Client, **kw: object) -> set[str]:
    resp = c.memories.ListMemories(
        memories_pb2.ListMemoriesRequest(parent=OWNER, page_size=1000, **kw),  # type: ignore[arg-type]
        metadata=tuple(c.md),
    )
    return {m.name.rsplit("/", 1)[-1] for m in resp.memories}


def search_names(
    c: Client, query: str, mode: int = retrieval_pb2.SearchRequest.HYBRID
) -> list[str]:
    resp = c.retrieval.Search(
        retrieval_pb2.SearchRequest(parent=OWNER, query_text=query, top_k=50, mode=mode),  # type: ignore[arg-type]
        metadata=tuple(c.md),
    )
    return [h.memory.name or h.turn.name for h in resp.hits]


def search_texts(c: Client, query: str, mode: int) -> list[str]:
    resp = c.retrieval.Search(
        retrieval_pb2.SearchRequest(parent=OWNER, query_text=query, top_k=50, mode=mode),  # type: ignore[arg-type]
        metadata=tuple(c.md),
    )
    return [h.memory.text or h.turn.text for h in resp.hits]


def get_error(c: Client, name: str) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        c.memories.GetMemory(memories_pb2.GetMemoryRequest(name=name), metadata=tuple(c.md))
    return error_reason(err.value)


def precondition_subject(err: grpc.RpcError) -> str:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.PreconditionFailure.DESCRIPTOR):
            failure = error_details_pb2.PreconditionFailure()
            detail.Unpack(failure)
            return str(failure.violations[0].subject)
    return ""


def events(c: Client, after: str = "", limit: int = 50) -> list[events_pb2.Event]:
    """Read the events available now (the stream is cancelled after a short wait)."""
    stream = c.events.Watch(
        events_pb2.WatchRequest(parent=OWNER, after=after), metadata=tuple(c.md), timeout=1.0
    )
    out: list[events_pb2.Event] = []
    try:
        for event in stream:
            out.append(event)
            if len(out) >= limit:
                break
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:  # the stream's normal end here
            raise
    return out


def audit(c: Client) -> lifecycle_pb2.AuditReport:
    return c.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent=OWNER), metadata=tuple(c.md))


def test_bulk_forget_of_memories_agrees_in_listing_and_search(lethe: Lethe) -> None:
    """After a bulk forget, listing and search agree at once."""
    c = lethe.client("alice")
    for i in range(5):
        make(c, f"m{i}", f"the heliotrope garden fact number {i}", [])
    assert len(search_names(c, "heliotrope garden")) == 5
    receipt = forget(c, *[f"{OWNER}/memories/m{i}" for i in range(5)])
    assert receipt.deleted == 5
    assert memory_ids(c) == set()
    for mode in (1, 2, 3):
        assert search_names(c, "heliotrope garden", mode) == []
    assert get_error(c, f"{OWNER}/memories/m0") == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")
    assert audit(c).orphans == 0


def test_deleting_a_memory_removes_only_the_edges_it_alone_supports(lethe: Lethe) -> None:
    """Edges extracted from a deleted memory go; edges supported by others stay."""
    c = lethe.client("alice")
    a = make(c, "a", "Ana works at the observatory", [])
    b = make(c, "b", "Ana's sister Bea lives in Porto", [])
    make(c, "e1", "", [ref(a.name)], kind=Kind.GRAPH_EDGE, edge=("Ana", "works_at", "observatory"))
    make(c, "e2", "", [ref(b.name)], kind=Kind.GRAPH_EDGE, edge=("Bea", "lives_in", "Porto"))
    make(
        c,
        "e3",
        "",
        [ref(a.name), ref(b.name)],
        kind=Kind.GRAPH_EDGE,
        edge=("Ana", "sister_of", "Bea"),
    )
    receipt = forget(c, a.name)
    assert receipt.cascaded == 2  # e1 and e3
    assert memory_ids(c) == {"b", "e2"}
    assert receipt.rebuilds_requested == 1  # e3 had a surviving source, b
    rebuilds = [e for e in events(c) if e.type == events_pb2.REBUILD_REQUESTED]
    assert [(e.subject, [s.name for s in e.sources]) for e in rebuilds] == [
        (f"{OWNER}/memories/e3", [b.name])
    ]
    assert rebuilds[0].receipt.name == receipt.name
    assert audit(c).orphans == 0


def test_summary_over_two_conversations_goes_when_one_is_deleted(lethe: Lethe) -> None:
    """The summary is gone and a rebuild is requested from the survivor.

    The survivor's own derivatives stay.
    """
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    t2 = create_thread(c, "alice", "t2")
    one = append(c, t1, ["we planned the lisbon trip"], commit=True)[0]
    two = append(c, t2, ["the dog needs a sitter in may"], commit=True)[0]
    summary = make(
        c,
        "s",
        "trip to lisbon; dog sitter in may",
        [ref(one.name), ref(two.name)],
        kind=Kind.SUMMARY,
    )
    own = make(c, "f2", "needs a dog sitter", [ref(two.name)])
    receipt = forget(c, t1)
    assert receipt.cascaded == 1
    assert get_error(c, summary.name) == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")
    assert memory_ids(c) == {"f2"}
    got = c.memories.GetMemory(memories_pb2.GetMemoryRequest(name=own.name), metadata=tuple(c.md))
    assert got.text == "needs a dog sitter"
    rebuilds = [e for e in events(c) if e.type == events_pb2.REBUILD_REQUESTED]
    assert [(e.subject, [(s.name, s.version) for s in e.sources]) for e in rebuilds] == [
        (summary.name, [(two.name, 1)])
    ]
    assert "trip to lisbon; dog sitter in may" not in str(search_names(c, "lisbon trip"))
    report = audit(c)
    assert (report.orphans, report.records_without_key, report.keys_without_record) == (0, 0, 0)


def test_late_summary_on_older_source_version_is_refused(lethe: Lethe) -> None:
    """Two jobs finish out of order; the one built on older versions is refused."""
    c = lethe.client("alice")
    fact = make(c, "fact", "guest count is 40", [])
    newer = c.memories.UpdateMemory(
        memories_pb2.UpdateMemoryRequest(
            memory=memories_pb2.Memory(name=fact.name, text="guest count is 55"),
            expected_version=1,
        ),
        metadata=tuple(c.md),
    )
    assert newer.version == 2
    job_b = make(c, "sum-b", "about 55 guests", [ref(fact.name, 2)], kind=Kind.SUMMARY)
    with pytest.raises(grpc.RpcError) as err:  # job A read version 1 and finishes late
        make(c, "sum-a", "about 40 guests", [ref(fact.name, 1)], kind=Kind.SUMMARY)
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "SOURCE_STALE")
    assert precondition_subject(err.value) == fact.name
    assert memory_ids(c, kinds=[Kind.SUMMARY]) == {"sum-b"}
    assert job_b.sources[0].version == 2


def test_child_of_a_deleted_parent_is_refused(lethe: Lethe) -> None:
    """A sync job that read a parent before it was deleted cannot add children."""
    c = lethe.client("alice")
    parent = make(c, "parent", "project apollo notes", [])
    forget(c, parent.name)
    with pytest.raises(grpc.RpcError) as err:
        make(c, "child", "apollo launch date", [ref(parent.name)])
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "SOURCE_DELETED")
    assert precondition_subject(err.value) == parent.name
    assert memory_ids(c) == set()
    assert audit(c).keys_without_record == 0  # the refused write's key was destroyed


def test_search_follows_the_updated_text(lethe: Lethe) -> None:
    """Updating a memory's text updates what search matches."""
    c = lethe.client("alice")
    m = make(c, "pet", "my pet is a tortoise called Sheldon", [])
    assert search_names(c, "tortoise Sheldon")[:1] == [m.name]
    c.memories.UpdateMemory(
        memories_pb2.UpdateMemoryRequest(
            memory=memories_pb2.Memory(name=m.name, text="my pet is a parrot called Kiwi"),
            update_mask=field_mask_pb2.FieldMask(paths=["text"]),
            expected_version=1,
        ),
        metadata=tuple(c.md),
    )
    for mode in (1, 2, 3):
        assert search_names(c, "parrot called Kiwi", mode)[:1] == [m.name]
        # Dense legs always return neighbours; what they return is the new text.
        assert "tortoise" not in str(search_texts(c, "tortoise Sheldon", mode))
    assert search_names(c, "tortoise Sheldon", retrieval_pb2.SearchRequest.LEXICAL) == []
    old = c.memories.GetMemory(
        memories_pb2.GetMemoryRequest(name=m.name, version=1), metadata=tuple(c.md)
    )
    assert (old.version, old.text, old.status) == (
        1,
        "my pet is a tortoise called Sheldon",
        memories_pb2.Memory.SUPERSEDED,
    )
    with pytest.raises(grpc.RpcError) as err:
        c.memories.UpdateMemory(
            memories_pb2.UpdateMemoryRequest(
                memory=memories_pb2.Memory(name=m.name, text="x"), expected_version=1
            ),
            metadata=tuple(c.md),
        )
    assert error_reason(err.value) == (grpc.StatusCode.ABORTED, "VERSION_MISMATCH")
    lethe.restart()
    c = lethe.client("alice")
    assert search_names(c, "parrot called Kiwi")[:1] == [m.name]
    assert search_names(c, "tortoise Sheldon", retrieval_pb2.SearchRequest.LEXICAL) == []


def test_derivative_of_pending_source_is_pending_and_commit_needs_sources(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    turn = append(c, t1, ["i might take the job in oslo"])[0]
    fact = make(c, "job", "may move to oslo", [ref(turn.name)], commit=True)
    assert fact.state == common_pb2.PENDING
    assert search_names(c, "oslo job") == []
    with pytest.raises(grpc.RpcError) as err:
        c.lifecycle.Commit(lifecycle_pb2.CommitRequest(names=[fact.name]), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "SOURCE_PENDING")
    assert precondition_subject(err.value) == turn.name
    done = c.lifecycle.Commit(
        lifecycle_pb2.CommitRequest(names=[fact.name], include_sources=True),
        metadata=tuple(c.md),
    )
    assert {r.name for r in done.committed} == {fact.name, turn.name}
    assert set(search_names(c, "oslo job")) == {fact.name, turn.name}


def test_response_is_tainted_or_deleted_when_its_context_is_forgotten(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    user = append(c, t1, ["my pin is 4471"], commit=True)[0]
    resp = c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=t1,
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT,
                    text="noted, your pin ends in 71",
                    context_refs=[ref(user.name)],
                    commit=True,
                ),
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT, text="the weather is sunny", commit=True
                ),
            ],
        ),
        metadata=tuple(c.md),
    ).turns
    assert search_names(c, "pin ends")[:1] == [resp[0].name]
    lineage = c.lifecycle.GetLineage(
        lifecycle_pb2.GetLineageRequest(
            name=resp[0].name, direction=lifecycle_pb2.GetLineageRequest.ANCESTORS
        ),
        metadata=tuple(c.md),
    )
    assert [(e.source.name, e.derivative.name) for e in lineage.edges] == [
        (user.name, resp[0].name)
    ]
    receipt = forget(c, user.name)
    assert receipt.tainted == 1
    assert resp[0].name not in search_names(c, "pin ends")
    listed = c.threads.ListTurns(threads_pb2.ListTurnsRequest(parent=t1), metadata=tuple(c.md))
    assert [t.name for t in listed.turns] == [resp[1].name]
    tainted = c.threads.ListTurns(
        threads_pb2.ListTurnsRequest(parent=t1, include_tainted=True), metadata=tuple(c.md)
    )
    assert [(t.name, t.tainted) for t in tainted.turns] == [
        (resp[0].name, True),
        (resp[1].name, False),
    ]
    # With responses: DELETE the response goes too.
    user2 = append(c, t1, ["my locker is 12"], commit=True)[0]
    r2 = c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=t1,
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT,
                    text="locker twelve",
                    context_refs=[ref(user2.name)],
                    commit=True,
                )
            ],
        ),
        metadata=tuple(c.md),
    ).turns[0]
    receipt = forget(c, user2.name, delete_responses=True)
    assert (receipt.cascaded, receipt.tainted) == (1, 0)
    with pytest.raises(grpc.RpcError) as err:
        c.threads.GetTurn(threads_pb2.GetTurnRequest(name=r2.name), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")


def test_cascade_is_transitive_and_narrow(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    turns = append(c, t1, ["alpha fact", "beta fact"], commit=True)
    f1 = make(c, "f1", "alpha derived", [ref(turns[0].name)])
    f2 = make(c, "f2", "alpha derived twice", [ref(f1.name)])
    f3 = make(c, "f3", "alpha derived thrice", [ref(f2.name)])
    unrelated = make(c, "u", "beta derived", [ref(turns[1].name)])
    down = c.lifecycle.GetLineage(
        lifecycle_pb2.GetLineageRequest(
            name=turns[0].name, direction=lifecycle_pb2.GetLineageRequest.DESCENDANTS
        ),
        metadata=tuple(c.md),
    )
    assert {e.derivative.name for e in down.edges} == {f1.name, f2.name, f3.name}
    receipt = forget(c, turns[0].name)
    assert receipt.cascaded == 3
    assert receipt.rebuilds_requested == 0
    assert memory_ids(c) == {"u"}
    assert unrelated.name in search_names(c, "beta derived")
    deletions = c.lifecycle.ListDeletions(
        lifecycle_pb2.ListDeletionsRequest(parent=OWNER), metadata=tuple(c.md)
    )
    assert [r.name for r in deletions.receipts] == [receipt.name]
    assert all(d.done for d in deletions.receipts[0].destinations)
    assert "alpha" not in str(deletions)
    kinds = [e.type for e in events(c)]
    assert kinds.count(events_pb2.RECORD_DELETED) == 4  # the turn and three memories


def test_watch_resumes_after_an_event_id(lethe: Lethe) -> None:
    c = lethe.client("alice")
    for i in range(3):
        make(c, f"w{i}", f"watch me {i}", [])
        forget(c, f"{OWNER}/memories/w{i}")
    first = events(c)
    assert [e.subject for e in first] == [f"{OWNER}/memories/w{i}" for i in range(3)]
    rest = events(c, after=first[0].id)
    assert [e.subject for e in rest] == [f"{OWNER}/memories/w{i}" for i in (1, 2)]
    other = lethe.client("bob")
    with pytest.raises(grpc.RpcError) as err:
        list(
            other.events.Watch(
                events_pb2.WatchRequest(parent=OWNER), metadata=tuple(other.md), timeout=1.0
            )
        )
    assert error_reason(err.value) == (grpc.StatusCode.PERMISSION_DENIED, "OWNER_NOT_ALLOWED")


def test_bad_memory_input_is_bad_field(lethe: Lethe) -> None:
    c = lethe.client("alice")
    cases = [
        memories_pb2.Memory(text="no kind"),
        memories_pb2.Memory(kind=Kind.FACT, text=""),
        memories_pb2.Memory(kind=Kind.GRAPH_EDGE, text="edge without edge"),
        memories_pb2.Memory(kind=Kind.FACT, text="x", direction=memories_pb2.Memory.OWED_BY_SYSTEM),
        memories_pb2.Memory(kind=Kind.FACT, text="x", sources=[ref("owners/bob/memories/m")]),
        memories_pb2.Memory(kind=Kind.FACT, text="x", sources=[ref(f"{OWNER}/memories/m", 0)]),
        memories_pb2.Memory(kind=Kind.FACT, text="x", sources=[ref(f"{OWNER}/memories/nope")]),
        memories_pb2.Memory(kind=Kind.FACT, text="x" * (64 * 1024 + 1)),
    ]
    for memory in cases:
        with pytest.raises(grpc.RpcError) as err:
            c.memories.CreateMemory(
                memories_pb2.CreateMemoryRequest(parent=OWNER, memory=memory),
                metadata=tuple(c.md),
            )
        assert error_reason(err.value) == (grpc.StatusCode.INVALID_ARGUMENT, "BAD_FIELD"), memory
    make(c, "dup", "first", [])
    with pytest.raises(grpc.RpcError) as err:
        make(c, "dup", "second", [])
    assert error_reason(err.value) == (grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS")
    assert audit(c).keys_without_record == 0


def test_a_memory_built_from_a_tainted_response_goes_with_the_source(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    user = append(c, thread, ["my secret code is quokkaplum"], commit=True)[0]
    answer = reply(c, thread, "noted quokkaplum", [user.name])
    derived = summary(c, "s", "summary: user code quokkaplum", [answer.name])
    receipt = c.lifecycle.Forget(
        lifecycle_pb2.ForgetRequest(names=[user.name]), metadata=tuple(c.md)
    )
    assert (receipt.tainted, receipt.cascaded) == (1, 1)
    with pytest.raises(grpc.RpcError) as err:
        c.memories.GetMemory(memories_pb2.GetMemoryRequest(name=derived.name), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")
    assert not visible_anywhere(c, thread, "quokkaplum")


def test_a_derivative_expires_with_its_pending_source(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turn = append(c, thread, ["pending source hedgehogtart"], ttl=0.4)[0]
    derived = summary(c, "d", "derived hedgehogtart", [turn.name], commit=False)
    assert derived.expire_time.ToNanoseconds() <= turn.expire_time.ToNanoseconds()
    time.sleep(0.6)
    with pytest.raises(grpc.RpcError) as err:
        c.memories.GetMemory(memories_pb2.GetMemoryRequest(name=derived.name), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")
