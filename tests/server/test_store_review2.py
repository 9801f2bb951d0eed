"""Regressions from the second adversarial review: each test failed on the code
before its fix (checked in a worktree of the previous commit)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from _helpers import append, create_thread, error_reason
from conftest import Client, Lethe

from lethe.v1 import (
    common_pb2,
    events_pb2,
    lifecycle_pb2,
    memories_pb2,
    repairs_pb2,
    repairs_pb2_grpc,
    retrieval_pb2,
    threads_pb2,
)

OWNER = "owners/alice"
M = memories_pb2.Memory


def ref(name: str, version: int = 1) -> common_pb2.SourceRef:
    return common_pb2.SourceRef(name=name, version=version)


def reply(c: Client, thread: str, text: str, refs: list[str]) -> threads_pb2.Turn:
    return c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=thread,
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT,
                    text=text,
                    commit=True,
                    context_refs=[ref(n) for n in refs],
                )
            ],
        ),
        metadata=tuple(c.md),
    ).turns[0]


def summary(c: Client, mid: str, text: str, sources: list[str], commit: bool = True) -> M:
    return c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=OWNER,
            memory_id=mid,
            memory=M(
                kind=M.SUMMARY,
                text=text,
                sources=[ref(n) for n in sources],
                state=common_pb2.COMMITTED if commit else common_pb2.PENDING,
            ),
        ),
        metadata=tuple(c.md),
    )


def visible_anywhere(c: Client, thread: str, needle: str) -> bool:
    found = ""
    for mode in (1, 2, 3):
        resp = c.retrieval.Search(
            retrieval_pb2.SearchRequest(parent=OWNER, query_text=needle, top_k=50, mode=mode),  # type: ignore[arg-type]
            metadata=tuple(c.md),
        )
        found += str(resp)
    found += str(
        c.retrieval.AssembleContext(
            retrieval_pb2.AssembleContextRequest(thread=thread, query_text=needle),
            metadata=tuple(c.md),
        )
    )
    return needle in found


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


def test_an_append_retry_does_not_return_what_was_sealed_since(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    req = threads_pb2.AppendTurnsRequest(
        parent=thread,
        request_id="rq-1",
        turns=[
            threads_pb2.TurnInput(role=common_pb2.USER, text="harmless", commit=True),
            threads_pb2.TurnInput(role=common_pb2.USER, text="sealed yakmuffin", commit=True),
        ],
    )
    c.threads.AppendTurns(req, metadata=tuple(c.md))
    repairs_pb2_grpc.RepairsStub(c.channel).SealRepair(
        repairs_pb2.SealRepairRequest(thread=thread, from_seq=2), metadata=tuple(c.md)
    )
    again = c.threads.AppendTurns(req, metadata=tuple(c.md))
    assert [t.text for t in again.turns] == ["harmless"]


def test_a_sealed_memory_cannot_be_updated(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turns = append(c, thread, ["harmless", "sealed secret is lemurcake"], commit=True)
    fact = summary(c, "f", "fact: lemurcake", [turns[1].name])
    repairs_pb2_grpc.RepairsStub(c.channel).SealRepair(
        repairs_pb2.SealRepairRequest(thread=thread, from_seq=2), metadata=tuple(c.md)
    )
    with pytest.raises(grpc.RpcError) as err:
        c.memories.UpdateMemory(
            memories_pb2.UpdateMemoryRequest(memory=M(name=fact.name, text="x")),
            metadata=tuple(c.md),
        )
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "SEALED")
    assert "lemurcake" not in str(err.value.details())


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


def test_a_reply_elsewhere_that_used_a_sealed_turn_is_tainted(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "t1")
    t2 = create_thread(c, "alice", "t2")
    turns = append(c, t1, ["harmless", "the embarrassing thing is otterjam"], commit=True)
    resp = reply(c, t2, "reply about otterjam", [turns[1].name])
    repairs_pb2_grpc.RepairsStub(c.channel).SealRepair(
        repairs_pb2.SealRepairRequest(thread=t1, from_seq=2), metadata=tuple(c.md)
    )
    listed = c.threads.ListTurns(
        threads_pb2.ListTurnsRequest(parent=t2, include_tainted=True), metadata=tuple(c.md)
    )
    assert [(t.name, t.tainted) for t in listed.turns] == [(resp.name, True)]
    assert not visible_anywhere(c, t2, "otterjam")


def test_concurrent_distills_store_one_lesson(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    append(c, thread, ["a", "b", "c"], commit=True)
    stub = repairs_pb2_grpc.RepairsStub(c.channel)
    repair = stub.SealRepair(
        repairs_pb2.SealRepairRequest(thread=thread, from_seq=2), metadata=tuple(c.md)
    )
    outcomes: list[str] = []

    def conclude(i: int) -> None:
        try:
            stub.ConcludeRepair(
                repairs_pb2.ConcludeRepairRequest(
                    name=repair.name,
                    outcome=threads_pb2.RepairInfo.DISTILL,
                    lesson_text=f"lesson number {i}",
                ),
                metadata=tuple(c.md),
            )
            outcomes.append("OK")
        except grpc.RpcError as err:
            outcomes.append(error_reason(err)[1])

    workers = [threading.Thread(target=conclude, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sorted(outcomes) == ["ILLEGAL_TRANSITION"] * 3 + ["OK"]
    lessons = c.memories.ListMemories(
        memories_pb2.ListMemoriesRequest(parent=OWNER, kinds=[M.LESSON]), metadata=tuple(c.md)
    ).memories
    assert len(lessons) == 1


def test_forgetting_a_repair_thread_takes_its_sealed_stretch(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turns = append(c, thread, ["kept", "sealed one", "sealed two"], commit=True)
    repair = repairs_pb2_grpc.RepairsStub(c.channel).SealRepair(
        repairs_pb2.SealRepairRequest(thread=thread, from_seq=2), metadata=tuple(c.md)
    )
    c.lifecycle.Forget(lifecycle_pb2.ForgetRequest(names=[repair.name]), metadata=tuple(c.md))
    with pytest.raises(grpc.RpcError) as err:
        c.threads.GetTurn(threads_pb2.GetTurnRequest(name=turns[1].name), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")
    report = c.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent=OWNER), metadata=tuple(c.md))
    assert (report.records_without_key, report.keys_without_record) == (0, 0)


def test_watch_with_a_huge_after_is_bad_field(lethe: Lethe) -> None:
    c = lethe.client("alice")
    with pytest.raises(grpc.RpcError) as err:
        list(
            c.events.Watch(
                events_pb2.WatchRequest(parent=OWNER, after="9" * 40),
                metadata=tuple(c.md),
                timeout=1.0,
            )
        )
    assert error_reason(err.value) == (grpc.StatusCode.INVALID_ARGUMENT, "BAD_FIELD")


def test_a_bad_tag_refuses_the_append_before_storing_anything(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    with pytest.raises(grpc.RpcError) as err:
        c.threads.AppendTurns(
            threads_pb2.AppendTurnsRequest(
                parent=thread,
                turns=[
                    threads_pb2.TurnInput(
                        role=common_pb2.USER, text="x", tags=[M(kind=M.FACT, text="")]
                    )
                ],
            ),
            metadata=tuple(c.md),
        )
    assert error_reason(err.value) == (grpc.StatusCode.INVALID_ARGUMENT, "BAD_FIELD")
    listed = c.threads.ListTurns(threads_pb2.ListTurnsRequest(parent=thread), metadata=tuple(c.md))
    assert list(listed.turns) == []


def test_a_preference_without_origin_is_explicit_and_conflicts(lethe: Lethe) -> None:
    c = lethe.client("alice")

    def pref(mid: str, origin: M.Origin.ValueType) -> M:
        return c.memories.CreateMemory(
            memories_pb2.CreateMemoryRequest(
                parent=OWNER,
                memory_id=mid,
                memory=M(
                    kind=M.PREFERENCE,
                    text="short",
                    slot="style",
                    origin=origin,
                    state=common_pb2.COMMITTED,
                ),
            ),
            metadata=tuple(c.md),
        )

    assert pref("p1", M.ORIGIN_UNSPECIFIED).origin == M.EXPLICIT
    with pytest.raises(grpc.RpcError) as err:
        pref("p2", M.EXPLICIT)
    assert error_reason(err.value) == (grpc.StatusCode.ALREADY_EXISTS, "SLOT_CONFLICT")
