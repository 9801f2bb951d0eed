"""Context assembly, manifests and the commitment scheduler, over gRPC."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from _helpers import append, create_thread, error_reason
from conftest import Client, Lethe
from google.protobuf import field_mask_pb2, timestamp_pb2

from lethe.v1 import (
    common_pb2,
    events_pb2,
    lifecycle_pb2,
    memories_pb2,
    retrieval_pb2,
    threads_pb2,
)

OWNER = "owners/alice"
M = memories_pb2.Memory


def create(c: Client, mid: str, kind: M.Kind.ValueType, text: str, **fields: Any) -> M:
    return c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=OWNER,
            memory_id=mid,
            memory=M(kind=kind, text=text, state=common_pb2.COMMITTED, **fields),
        ),
        metadata=tuple(c.md),
    )


def context(c: Client, thread: str, query: str = "", **kw: Any) -> retrieval_pb2.ContextBundle:
    return c.retrieval.AssembleContext(
        retrieval_pb2.AssembleContextRequest(thread=thread, query_text=query, **kw),
        metadata=tuple(c.md),
    )


def ts(seconds: float) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromNanoseconds(int(seconds * 1e9))
    return out


def test_event_planning_scenario(tmp_path: Path, lethe_at: Callable[..., Lethe]) -> None:
    lethe = lethe_at(tmp_path / "d", sweep_interval=0.1)
    c = lethe.client("alice")
    t1 = create_thread(c, "alice", "planning-1")
    append(c, t1, ["we are planning the garden party"], commit=True)
    guests = create(c, "guests", M.FACT, "the guest count is forty", slot="event.guest_count")
    venue = create(c, "venue", M.OPEN_QUESTION, "which venue should we book?")
    budget = create(c, "budget", M.GOAL, "stay under the budget of 3000")
    # Second conversation: the guest count is revised (a correction).
    t2 = create_thread(c, "alice", "planning-2")
    append(c, t2, ["actually more people are coming"], commit=True)
    c.memories.UpdateMemory(
        memories_pb2.UpdateMemoryRequest(
            memory=M(name=guests.name, text="the guest count is fifty-five"),
            update_mask=field_mask_pb2.FieldMask(paths=["text"]),
            expected_version=1,
        ),
        metadata=tuple(c.md),
    )
    bundle = context(c, t2, "how many guests are coming")
    assert "forty" not in str(bundle)
    assert any(m.memory.text == "the guest count is fifty-five" for m in bundle.memories)
    # The venue is answered: closed, never offered again.
    answer = append(c, t2, ["we booked the botanical garden"], commit=True)[0]
    c.memories.TransitionMemory(
        memories_pb2.TransitionMemoryRequest(
            name=venue.name,
            status=M.ANSWERED,
            evidence=common_pb2.SourceRef(name=answer.name, version=1),
        ),
        metadata=tuple(c.md),
    )
    # Partial progress does not close the goal.
    c.memories.TransitionMemory(
        memories_pb2.TransitionMemoryRequest(
            name=budget.name, status=M.ACTIVE, note="the caterer came in under"
        ),
        metadata=tuple(c.md),
    )
    bundle = context(c, t2)
    assert [m.name for m in bundle.open_items] == [budget.name]
    # The assistant will check with the vendor by tomorrow: the tagger proposes a
    # commitment with a due time. Said two days ago, it is due now once committed.
    said = ts(time.time() - 2 * 86400)
    proposed = c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=t2,
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT,
                    time=said,
                    text="I'll check whether the vendor confirmed the date by tomorrow.",
                )
            ],
        ),
        metadata=tuple(c.md),
    ).proposed
    assert [M.Kind.Name(m.kind) for m in proposed] == ["COMMITMENT"]
    commitment = proposed[0]
    assert commitment.direction == M.OWED_BY_SYSTEM
    assert commitment.due_time.seconds < time.time()
    assert [m.name for m in context(c, t2).open_items] == [
        budget.name
    ]  # candidates are not offered
    c.lifecycle.Commit(
        lifecycle_pb2.CommitRequest(names=[commitment.name], include_sources=True),
        metadata=tuple(c.md),
    )
    # The person breaks off for a call (a pending point).
    point = create(c, "seating", M.PENDING_POINT, "was describing the seating chart")
    time.sleep(0.4)
    bundle = context(c, t2)
    assert [m.name for m in bundle.open_items] == [commitment.name, point.name, budget.name]
    assert all(m.kind != M.FACT for m in bundle.open_items)
    due = c.events.Watch(
        events_pb2.WatchRequest(parent=OWNER, types=[events_pb2.COMMITMENT_DUE]),
        metadata=tuple(c.md),
        timeout=1.0,
    )
    got: list[events_pb2.Event] = []
    with pytest.raises(grpc.RpcError):
        got.extend(due)
    assert [e.subject for e in got] == [commitment.name]
    # Resumed closes the pending point; fulfilled closes the commitment; achieved the goal.
    for name, status in (
        (point.name, M.RESUMED),
        (commitment.name, M.FULFILLED),
        (budget.name, M.ACHIEVED),
    ):
        c.memories.TransitionMemory(
            memories_pb2.TransitionMemoryRequest(name=name, status=status),
            metadata=tuple(c.md),
        )
    assert list(context(c, t2).open_items) == []


def test_manifest_is_stored_and_becomes_the_response_lineage(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turn = append(c, thread, ["my sister is called maren"], commit=True)[0]
    fact = create(
        c,
        "sister",
        M.FACT,
        "sister: Maren",
        sources=[common_pb2.SourceRef(name=turn.name, version=1)],
    )
    bundle = context(c, thread, "sister name")
    refs = {(r.name, r.version) for r in bundle.manifest.refs}
    assert (turn.name, 1) in refs
    assert (fact.name, 1) in refs
    stored = c.retrieval.GetContextManifest(
        retrieval_pb2.GetContextManifestRequest(name=bundle.manifest.name), metadata=tuple(c.md)
    )
    assert {(r.name, r.version) for r in stored.refs} == refs
    response = c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=thread,
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT,
                    text="your sister Maren",
                    context_manifest=bundle.manifest.name,
                    commit=True,
                )
            ],
        ),
        metadata=tuple(c.md),
    ).turns[0]
    c.lifecycle.Forget(lifecycle_pb2.ForgetRequest(names=[turn.name]), metadata=tuple(c.md))
    listed = c.threads.ListTurns(
        threads_pb2.ListTurnsRequest(parent=thread, include_tainted=True), metadata=tuple(c.md)
    )
    assert [(t.name, t.tainted) for t in listed.turns] == [(response.name, True)]
    assert "maren" not in str(context(c, thread, "sister name")).lower()


def test_context_excludes_pending_candidates_sealed_and_respects_the_budget(
    lethe: Lethe,
) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    append(c, thread, [f"turn number {i} " + "x" * 80 for i in range(20)], commit=True)
    c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=OWNER, memory_id="cand", memory=M(kind=M.OPEN_QUESTION, text="a candidate")
        ),
        metadata=tuple(c.md),
    )
    bundle = context(c, thread, recent_turns=20, max_chars=500)
    assert list(bundle.open_items) == []
    assert 0 < len(bundle.recent_turns) < 20
    assert sum(len(t.text) for t in bundle.recent_turns) <= 500
    assert bundle.recent_turns[-1].seq == 20  # the newest turns are kept
    with pytest.raises(grpc.RpcError) as err:
        context(c, "owners/alice/threads/missing")
    assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


def test_tagger_proposes_a_commitment_with_a_due_time_and_client_tags_replace_it(
    lethe: Lethe,
) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    said = ts(1_683_122_400.0)  # Wednesday 2023-05-03 14:00 UTC
    resp = c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=thread,
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.USER, text="Did the vendor confirm?", time=said
                ),
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT,
                    time=said,
                    text="I'll check whether the vendor confirmed the date by tomorrow.",
                ),
                threads_pb2.TurnInput(
                    role=common_pb2.USER, time=said, text="Hold on, I have a call."
                ),
            ],
        ),
        metadata=tuple(c.md),
    )
    kinds = {M.Kind.Name(m.kind): m for m in resp.proposed}
    assert set(kinds) == {"COMMITMENT", "PENDING_POINT"}
    commitment = kinds["COMMITMENT"]
    assert commitment.state == common_pb2.PENDING
    assert commitment.direction == M.OWED_BY_SYSTEM
    assert commitment.due_time.seconds == 1_683_190_800  # tomorrow 09:00 UTC
    assert [s.name for s in commitment.sources] == [resp.turns[1].name]
    events = c.events.Watch(
        events_pb2.WatchRequest(parent=OWNER, types=[events_pb2.CANDIDATE_PROPOSED]),
        metadata=tuple(c.md),
        timeout=1.0,
    )
    got: list[events_pb2.Event] = []
    with pytest.raises(grpc.RpcError):
        got.extend(events)
    assert {e.subject for e in got} == {m.name for m in resp.proposed}
    # A client that tags the turn itself replaces the rules, even with no tags.
    own = c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=thread,
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT, tagged=True, text="I'll check the weather tomorrow."
                ),
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT,
                    text="Noted: the cake is lemon.",
                    tags=[M(kind=M.FACT, text="the cake is lemon")],
                ),
            ],
        ),
        metadata=tuple(c.md),
    )
    assert [(M.Kind.Name(m.kind), m.text) for m in own.proposed] == [("FACT", "the cake is lemon")]
