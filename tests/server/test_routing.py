"""Routing checks of a sharded deployment, on a real server through real channels.

The typed client's ``x-lethe-owner`` header, refusal of a header that disagrees
with the request (a misrouted call), the optional requirement of the header,
and the moved-away marker's ``OWNER_MOVED`` answer.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from conftest import Lethe

import lethe.client as lc
from lethe.client._routing import request_owner
from lethe.names import OWNER_HEADER
from lethe.v1 import lifecycle_pb2, memories_pb2, retrieval_pb2, threads_pb2


def test_request_owner_reads_every_shape_of_request() -> None:
    assert request_owner(threads_pb2.CreateThreadRequest(parent="owners/a")) == "a"
    assert request_owner(threads_pb2.GetTurnRequest(name="owners/b/threads/t/turns/1")) == "b"
    assert request_owner(retrieval_pb2.AssembleContextRequest(thread="owners/c/threads/t")) == "c"
    update = memories_pb2.UpdateMemoryRequest(
        memory=memories_pb2.Memory(name="owners/d/memories/m")
    )
    assert request_owner(update) == "d"
    commit = lifecycle_pb2.CommitRequest(names=["owners/e/memories/m", "owners/x/memories/n"])
    assert request_owner(commit) == "e"
    ranged = lifecycle_pb2.ForgetRequest(
        range=lifecycle_pb2.TurnRange(thread="owners/f/threads/t", from_seq=1, to_seq=2)
    )
    assert request_owner(ranged) == "f"
    assert request_owner(threads_pb2.GetThreadRequest(name="people/g")) is None
    assert request_owner(threads_pb2.GetThreadRequest(name="owners/Not-An-Id/threads/t")) is None


def _expect(
    call: Callable[[], object], error: type[lc.LetheError], code: grpc.StatusCode
) -> lc.LetheError:
    """Run ``call`` (typed or raw stub), which must fail with ``error`` and ``code``."""
    try:
        call()
    except grpc.RpcError as raw:
        err = lc.error_from_rpc(raw)
    else:
        raise AssertionError("the call succeeded")
    assert isinstance(err, error), repr(err)
    assert err.code() == code
    return err


def test_a_server_that_requires_the_header_serves_the_typed_client(
    lethe_at: Callable[..., Lethe], tmp_path: pytest.TempPathFactory
) -> None:
    """Every kind of call the typed client makes carries the header.

    A server that requires it serves them all, and refuses the same call
    without it.
    """
    server = lethe_at(tmp_path / "data", embedder="none", require_owner_header=True)  # type: ignore[operator]
    client = server.client("alice")
    thread = client.create_thread("owners/alice", thread_id="t1")
    turns = client.append_turns(thread.name, [{"role": "USER", "text": "the lake is cold"}])
    client.commit([turns.turns[0].name])
    assert client.get_turn(turns.turns[0].name).text == "the lake is cold"
    memory = client.create_memory("owners/alice", memory={"kind": "FACT", "text": "likes tea"})
    client.update_memory(
        {"name": memory.name, "text": "likes green tea"},
        update_mask=["text"],
        expected_version=memory.version,
    )
    hits = client.search("owners/alice", query_text="lake", mode="LEXICAL")
    assert [h.turn.name for h in hits.hits] == [turns.turns[0].name]
    client.assemble_context(thread.name, query_text="lake")
    receipt = client.forget(range={"thread": thread.name, "from_seq": 1, "to_seq": 1})
    assert receipt.targets
    with client.watch("owners/alice", timeout=0.5) as stream:
        assert next(stream).id  # events of the writes above
    # The same call on the raw stub, without the header, is refused.
    err = _expect(
        lambda: client.stubs.threads.GetThread(
            threads_pb2.GetThreadRequest(name=thread.name), metadata=client.metadata
        ),
        lc.OwnerHeaderMissing,
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert err.reason_name == "OWNER_HEADER_MISSING"


def _raw_create(client: lc.Client, parent: str, thread_id: str, header: list[str]) -> object:
    metadata = (*client.metadata, *((OWNER_HEADER, h) for h in header))
    return client.stubs.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent=parent, thread_id=thread_id), metadata=metadata
    )


def test_a_misrouted_call_is_refused_before_it_writes(lethe: Lethe) -> None:
    """Header of owner bob, resource of owner alice: refused, and nothing of alice's is written.

    The token may act for both.
    """
    client = lethe.client("alice", "bob")
    for header in (["bob"], ["alice", "alice"], ["Alice"], ["owners/alice"]):
        err = _expect(
            lambda h=header: _raw_create(client, "owners/alice", "t1", h),  # type: ignore[misc]
            lc.OwnerHeaderMismatch,
            grpc.StatusCode.INVALID_ARGUMENT,
        )
        assert err.reason_name == "OWNER_HEADER_MISMATCH", header
    _expect(
        lambda: client.get_thread("owners/alice/threads/t1"), lc.NotFound, grpc.StatusCode.NOT_FOUND
    )
    assert list(client.iter_threads("owners/alice")) == []
    # Without the header (one server, no proxy) and with the right one: served.
    _raw_create(client, "owners/alice", "t1", [])
    _raw_create(client, "owners/alice", "t2", ["alice"])
    assert sorted(t.name for t in client.iter_threads("owners/alice")) == [
        "owners/alice/threads/t1",
        "owners/alice/threads/t2",
    ]


def test_permission_is_checked_before_the_route(lethe: Lethe) -> None:
    client = lethe.client("bob")
    _expect(
        lambda: _raw_create(client, "owners/alice", "t1", ["bob"]),
        lc.OwnerNotAllowed,
        grpc.StatusCode.PERMISSION_DENIED,
    )


def test_a_moved_owner_answers_owner_moved_with_the_destination(lethe: Lethe) -> None:
    client = lethe.client("alice", "bob")
    thread = client.create_thread("owners/alice", thread_id="t1")
    client.append_turns(thread.name, [{"role": "USER", "text": "alpha", "commit": True}])
    client.create_thread("owners/bob", thread_id="t1")
    assert lethe.server is not None
    store = lethe.server.store
    store.mark_moved("alice", "shard-c", "10.0.0.3:50051")
    calls: list[Callable[[], object]] = [
        lambda: client.get_thread(thread.name),
        lambda: client.list_threads("owners/alice"),
        lambda: client.append_turns(thread.name, [{"role": "USER", "text": "beta"}]),
        lambda: client.search("owners/alice", query_text="alpha", mode="LEXICAL"),
        lambda: client.forget(["owners/alice"]),
        lambda: client.audit("owners/alice"),
    ]
    for call in calls:
        err = _expect(call, lc.OwnerMoved, grpc.StatusCode.FAILED_PRECONDITION)
        assert isinstance(err, lc.OwnerMoved)
        assert (err.shard, err.target, err.subject) == ("shard-c", "10.0.0.3:50051", "owners/alice")
        assert err.info_metadata == {
            "owner": "alice",
            "shard": "shard-c",
            "target": "10.0.0.3:50051",
        }
    with (
        client.watch("owners/alice", timeout=2.0, max_reconnects=0) as stream,
        pytest.raises(lc.OwnerMoved),
    ):
        next(stream)
    # Another owner is untouched; nothing of alice's was changed while marked.
    assert client.get_thread("owners/bob/threads/t1").name == "owners/bob/threads/t1"
    assert [r.owner for r in store.moved_owners()] == ["alice"]
    assert store.clear_moved("alice") is True
    assert store.clear_moved("alice") is False
    assert [t.text for t in client.iter_turns(thread.name)] == ["alpha"]
