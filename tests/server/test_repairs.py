"""Repairs and the pending window, over gRPC against the real server.

Sealing a stretch after the fact, reopening, pausing, concluding with each
outcome, ExtendPending and PENDING_EXPIRING.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path

import grpc
import pytest
from _helpers import append, create_thread, error_reason, reply, run_cli, summary, visible_anywhere
from conftest import Client, Lethe
from google.protobuf import duration_pb2

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

M = memories_pb2.Memory

OWNER = "owners/alice"
WORDS = [
    "anchovy",
    "bramble",
    "cobalt",
    "dulcimer",
    "ember",
    "fjord",
    "garnet",
    "halyard",
    "indigo",
    "juniper",
]


def repairs(c: Client) -> repairs_pb2_grpc.RepairsStub:
    return repairs_pb2_grpc.RepairsStub(c.channel)


def texts(c: Client, query: str, mode: int = retrieval_pb2.SearchRequest.LEXICAL) -> list[str]:
    resp = c.retrieval.Search(
        retrieval_pb2.SearchRequest(parent=OWNER, query_text=query, top_k=50, mode=mode),  # type: ignore[arg-type]
        metadata=tuple(c.md),
    )
    return [h.turn.text or h.memory.text for h in resp.hits]


def memory(c: Client, mid: str, text: str, sources: list[str], kind: int) -> memories_pb2.Memory:
    return c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=OWNER,
            memory_id=mid,
            memory=memories_pb2.Memory(
                kind=kind,  # type: ignore[arg-type]
                text=text,
                sources=[common_pb2.SourceRef(name=n, version=1) for n in sources],
                state=common_pb2.COMMITTED,
            ),
        ),
        metadata=tuple(c.md),
    )


def drain(stream: Iterable[events_pb2.Event]) -> list[events_pb2.Event]:
    """Every event a Watch stream yields before its deadline ends it."""
    out: list[events_pb2.Event] = []
    try:
        out.extend(stream)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
    return out


def ten_turns(c: Client) -> tuple[str, list[threads_pb2.Turn]]:
    thread = create_thread(c, "alice", "t1")
    return thread, append(c, thread, [f"turn about {w}" for w in WORDS], commit=True)


def seal(c: Client, thread: str, from_seq: int) -> threads_pb2.Thread:
    return repairs(c).SealRepair(
        repairs_pb2.SealRepairRequest(thread=thread, from_seq=from_seq), metadata=tuple(c.md)
    )


def test_seal_from_turn_six_seals_the_fact_and_rebuilds_the_summary(lethe: Lethe) -> None:
    """Sealing from turn 6 seals a fact built from turns 6-8 and rebuilds a summary of turns 1-10.

    The fact is sealed with the turns; the summary is deleted, and a rebuild
    from turns 1-5 is requested.
    """
    c = lethe.client("alice")
    thread, turns = ten_turns(c)
    fact = memory(
        c, "fact", "fact from six to eight", [t.name for t in turns[5:8]], memories_pb2.Memory.FACT
    )
    summary = memory(
        c, "sum", "summary of one to ten", [t.name for t in turns], memories_pb2.Memory.SUMMARY
    )
    repair = seal(c, thread, 6)
    assert repair.kind == threads_pb2.Thread.REPAIR
    assert (repair.repair.state, repair.repair.from_seq) == (threads_pb2.RepairInfo.PAUSED, 6)
    with pytest.raises(grpc.RpcError) as err:
        c.memories.GetMemory(memories_pb2.GetMemoryRequest(name=fact.name), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "SEALED")
    with pytest.raises(grpc.RpcError) as err:
        c.memories.GetMemory(memories_pb2.GetMemoryRequest(name=summary.name), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")
    stream = c.events.Watch(
        events_pb2.WatchRequest(parent=OWNER), metadata=tuple(c.md), timeout=1.0
    )
    rebuilds = [e for e in drain(stream) if e.type == events_pb2.REBUILD_REQUESTED]
    assert [(e.subject, [s.name for s in e.sources]) for e in rebuilds] == [
        (summary.name, [t.name for t in turns[:5]])
    ]
    for word in WORDS[5:]:
        for mode in (1, 2, 3):
            assert f"turn about {word}" not in texts(c, word, mode)
    for word in WORDS[:5]:
        assert f"turn about {word}" in texts(c, word)
    with pytest.raises(grpc.RpcError) as err:
        c.threads.GetTurn(threads_pb2.GetTurnRequest(name=turns[6].name), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "SEALED")
    assert "turn about garnet" not in str(err.value.details())
    listed = c.threads.ListTurns(threads_pb2.ListTurnsRequest(parent=thread), metadata=tuple(c.md))
    assert [t.seq for t in listed.turns] == [1, 2, 3, 4, 5]
    after = append(c, thread, ["turn about kelp"], commit=True)[0]
    assert after.seq == 11  # the source thread numbers on after the sealed stretch


def test_reopen_append_pause_reopen_then_destroy_with_a_backup_from_before(
    lethe: Lethe, tmp_path: Path
) -> None:
    """A repair reopened, appended to, paused and reopened keeps its stretch; DESTROY shreds it.

    A backup taken before brings none of it back.
    """
    c = lethe.client("alice")
    thread, turns = ten_turns(c)
    backup = tmp_path / "before-seal"
    assert run_cli(["backup", "--data", str(lethe.data_dir), "--out", str(backup)]) == 0
    repair = seal(c, thread, 6)
    with pytest.raises(grpc.RpcError) as err:
        append(c, repair.name, ["too early"])
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "REPAIR_NOT_CONTINUED")
    first = repairs(c).ReopenRepair(
        repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=tuple(c.md)
    )
    assert first.repair.repair.state == threads_pb2.RepairInfo.CONTINUED
    assert [t.text for t in first.turns] == [f"turn about {w}" for w in WORDS[5:]]
    own = append(c, repair.name, ["i needed a break", "it still hurts"])
    assert [t.state for t in own] == [common_pb2.SEALED, common_pb2.SEALED]
    repairs(c).PauseRepair(repairs_pb2.PauseRepairRequest(name=repair.name), metadata=tuple(c.md))
    again = repairs(c).ReopenRepair(
        repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=tuple(c.md)
    )
    assert [t.text for t in again.turns] == [f"turn about {w}" for w in WORDS[5:]] + [
        "i needed a break",
        "it still hurts",
    ]
    assert texts(c, "hurts break") == []
    done = repairs(c).ConcludeRepair(
        repairs_pb2.ConcludeRepairRequest(name=repair.name, outcome=threads_pb2.RepairInfo.DESTROY),
        metadata=tuple(c.md),
    )
    assert done.repair.repair.state == threads_pb2.RepairInfo.CONCLUDED
    assert done.receipt.deleted == 7
    assert "hurts" not in str(done.receipt)
    for turn in turns[5:]:
        with pytest.raises(grpc.RpcError) as err:
            c.threads.GetTurn(threads_pb2.GetTurnRequest(name=turn.name), metadata=tuple(c.md))
        assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")
    with pytest.raises(grpc.RpcError) as err:
        repairs(c).ReopenRepair(
            repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=tuple(c.md)
        )
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "ILLEGAL_TRANSITION")
    # The backup from before the seal, restored beside the keystore.
    lethe.stop()
    assert run_cli(["restore", "--backup", str(backup), "--data", str(lethe.data_dir)]) == 0
    lethe.start()
    c = lethe.client("alice")
    listed = c.threads.ListTurns(threads_pb2.ListTurnsRequest(parent=thread), metadata=tuple(c.md))
    assert [t.text for t in listed.turns] == [f"turn about {w}" for w in WORDS[:5]]
    for word in WORDS[5:]:
        assert f"turn about {word}" not in texts(c, word, retrieval_pb2.SearchRequest.HYBRID)
    report = c.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent=OWNER), metadata=tuple(c.md))
    # The repair ring's keys have no record in the restored data: destroyed at start.
    assert (report.orphans, report.records_without_key, report.keys_without_record) == (0, 0, 0)


def test_distill_keeps_only_the_lesson(lethe: Lethe) -> None:
    """DISTILL stores the lesson as a committed root and destroys the rest."""
    c = lethe.client("alice")
    thread, turns = ten_turns(c)
    repair = seal(c, thread, 6)
    done = repairs(c).ConcludeRepair(
        repairs_pb2.ConcludeRepairRequest(
            name=repair.name,
            outcome=threads_pb2.RepairInfo.DISTILL,
            lesson_text="ask before bringing up the move to oslo",
        ),
        metadata=tuple(c.md),
    )
    lesson = done.lesson
    assert lesson.kind == memories_pb2.Memory.LESSON
    assert lesson.state == common_pb2.COMMITTED
    assert list(lesson.sources) == []
    assert lesson.scope == repair.name
    assert texts(c, "bringing up the move to oslo")[:1] == [lesson.text]
    up = c.lifecycle.GetLineage(
        lifecycle_pb2.GetLineageRequest(
            name=lesson.name, direction=lifecycle_pb2.GetLineageRequest.ANCESTORS
        ),
        metadata=tuple(c.md),
    )
    assert list(up.edges) == []
    with pytest.raises(grpc.RpcError) as err:
        c.threads.GetTurn(threads_pb2.GetTurnRequest(name=turns[7].name), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")


def test_derivative_on_a_sealed_source_is_refused(lethe: Lethe) -> None:
    """Publishing a derivative on a sealed source answers SOURCE_SEALED."""
    c = lethe.client("alice")
    thread, turns = ten_turns(c)
    seal(c, thread, 6)
    with pytest.raises(grpc.RpcError) as err:
        memory(c, "late", "built on six", [turns[5].name], memories_pb2.Memory.FACT)
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "SOURCE_SEALED")


def test_restricted_repair_needs_acknowledgement_to_reopen(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread, _ = ten_turns(c)
    repair = seal(c, thread, 9)
    repairs(c).ConcludeRepair(
        repairs_pb2.ConcludeRepairRequest(
            name=repair.name, outcome=threads_pb2.RepairInfo.PRESERVE_RESTRICTED
        ),
        metadata=tuple(c.md),
    )
    with pytest.raises(grpc.RpcError) as err:
        repairs(c).ReopenRepair(
            repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=tuple(c.md)
        )
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "RESTRICTED")
    opened = repairs(c).ReopenRepair(
        repairs_pb2.ReopenRepairRequest(name=repair.name, acknowledge_restricted=True),
        metadata=tuple(c.md),
    )
    assert [t.text for t in opened.turns] == ["turn about indigo", "turn about juniper"]
    listed = c.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent=OWNER), metadata=tuple(c.md)
    )
    assert [t.name for t in listed.threads] == [thread]
    with_repairs = c.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent=OWNER, include_repairs=True), metadata=tuple(c.md)
    )
    assert {t.name for t in with_repairs.threads} == {thread, repair.name}


def test_sealed_pending_turn_never_expires(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turns = append(c, thread, ["pending one", "pending two"], ttl=0.5)
    repair = seal(c, thread, 1)
    time.sleep(0.7)
    opened = repairs(c).ReopenRepair(
        repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=tuple(c.md)
    )
    assert [t.name for t in opened.turns] == [t.name for t in turns]


def test_extend_pending_keeps_a_turn_alive(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turn = append(c, thread, ["hold this thought"], ttl=0.5)[0]
    resp = c.lifecycle.ExtendPending(
        lifecycle_pb2.ExtendPendingRequest(
            names=[turn.name], ttl=duration_pb2.Duration(seconds=60)
        ),
        metadata=tuple(c.md),
    )
    assert [r.name for r in resp.records] == [turn.name]
    time.sleep(0.7)
    got = c.threads.GetTurn(threads_pb2.GetTurnRequest(name=turn.name), metadata=tuple(c.md))
    assert got.state == common_pb2.PENDING
    assert got.expire_time.seconds > time.time() + 50


def test_pending_expiring_is_announced_once(tmp_path: Path, lethe_at: object) -> None:
    lethe = lethe_at(tmp_path / "d", sweep_interval=0.1, expiry_warning=30.0)  # type: ignore[operator]
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turn = append(c, thread, ["expiring soon"], ttl=20.0)[0]
    append(c, thread, ["expiring later"], ttl=3600.0)
    deadline = time.time() + 3
    seen: list[events_pb2.Event] = []
    while time.time() < deadline and not seen:
        stream = c.events.Watch(
            events_pb2.WatchRequest(parent=OWNER, types=[events_pb2.PENDING_EXPIRING]),
            metadata=tuple(c.md),
            timeout=0.5,
        )
        with pytest.raises(grpc.RpcError):
            seen.extend(stream)
    time.sleep(0.3)
    stream = c.events.Watch(
        events_pb2.WatchRequest(parent=OWNER, types=[events_pb2.PENDING_EXPIRING]),
        metadata=tuple(c.md),
        timeout=0.5,
    )
    everything: list[events_pb2.Event] = []
    with pytest.raises(grpc.RpcError):
        everything.extend(stream)
    assert [e.subject for e in everything] == [turn.name]


def test_backup_taken_while_continued_reveals_nothing_after_destroy(
    lethe: Lethe, tmp_path: Path
) -> None:
    c = lethe.client("alice")
    thread, _ = ten_turns(c)
    repair = seal(c, thread, 8)
    repairs(c).ReopenRepair(repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=tuple(c.md))
    append(c, repair.name, ["the zanzibar incident still bothers me"])
    backup = tmp_path / "while-continued"
    assert run_cli(["backup", "--data", str(lethe.data_dir), "--out", str(backup)]) == 0
    repairs(c).ConcludeRepair(
        repairs_pb2.ConcludeRepairRequest(name=repair.name, outcome=threads_pb2.RepairInfo.DESTROY),
        metadata=tuple(c.md),
    )
    lethe.stop()
    assert run_cli(["restore", "--backup", str(backup), "--data", str(lethe.data_dir)]) == 0
    lethe.start()
    c = lethe.client("alice")
    for mode in (1, 2, 3):
        assert "zanzibar" not in str(texts(c, "zanzibar incident", mode))
    with pytest.raises(grpc.RpcError) as err:
        repairs(c).ReopenRepair(
            repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=tuple(c.md)
        )
    assert err.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
    listed = c.threads.ListTurns(threads_pb2.ListTurnsRequest(parent=thread), metadata=tuple(c.md))
    assert [t.seq for t in listed.turns] == [1, 2, 3, 4, 5, 6, 7]


def test_expired_pending_turn_is_not_in_context(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    append(c, thread, ["kept turn"], commit=True)
    append(c, thread, ["fleeting turn"], ttl=0.4)
    bundle = c.retrieval.AssembleContext(
        retrieval_pb2.AssembleContextRequest(thread=thread), metadata=tuple(c.md)
    )
    assert [t.text for t in bundle.recent_turns] == ["kept turn", "fleeting turn"]
    time.sleep(0.6)
    bundle = c.retrieval.AssembleContext(
        retrieval_pb2.AssembleContextRequest(thread=thread), metadata=tuple(c.md)
    )
    assert [t.text for t in bundle.recent_turns] == ["kept turn"]


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
