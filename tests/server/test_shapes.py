"""Memory with shape, over gRPC against the real server.

The transition matrix, corrections, slots and preferences.
"""

from __future__ import annotations

import grpc
import pytest
from _helpers import append, create_thread, error_reason
from conftest import Client, Lethe
from google.protobuf import field_mask_pb2

from lethe.v1 import common_pb2, events_pb2, lifecycle_pb2, memories_pb2, retrieval_pb2

OWNER = "owners/alice"
M = memories_pb2.Memory
ALL_STATUSES = [v for v in M.Status.values() if v != 0]
KINDS = {
    M.FACT: M.ACTIVE,
    M.OPEN_QUESTION: M.OPEN,
    M.GOAL: M.ACTIVE,
    M.COMMITMENT: M.OPEN,
    M.PENDING_POINT: M.PAUSED,
    M.PREFERENCE: M.ACTIVE,
    M.SUMMARY: M.ACTIVE,
    M.GRAPH_EDGE: M.ACTIVE,
    M.ANNOTATION: M.ACTIVE,
    M.REFLECTION: M.ACTIVE,
    M.LESSON: M.ACTIVE,
}
ALLOWED = {
    M.OPEN_QUESTION: {M.ANSWERED},
    M.GOAL: {M.ACTIVE, M.ACHIEVED, M.ABANDONED},
    M.COMMITMENT: {M.FULFILLED, M.CANCELLED, M.EXPIRED, M.BROKEN},
    M.PENDING_POINT: {M.RESUMED, M.RELEASED},
}


def create(c: Client, mid: str, kind: int, text: str, **fields: object) -> M:
    return c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=OWNER,
            memory_id=mid,
            memory=M(kind=kind, text=text, state=common_pb2.COMMITTED, **fields),  # type: ignore[arg-type]
        ),
        metadata=tuple(c.md),
    )


def transition(c: Client, name: str, status: int, **kw: object) -> M:
    return c.memories.TransitionMemory(
        memories_pb2.TransitionMemoryRequest(name=name, status=status, **kw),  # type: ignore[arg-type]
        metadata=tuple(c.md),
    )


def test_transition_matrix_every_kind_and_status(lethe: Lethe) -> None:
    c = lethe.client("alice")
    for kind, initial in KINDS.items():
        for status in ALL_STATUSES:
            mid = f"k{kind}-s{status}"
            extra = (
                {"edge": memories_pb2.GraphEdge(subject="a", predicate="b", object="c")}
                if kind == M.GRAPH_EDGE
                else {}
            )
            created = create(c, mid, kind, f"{M.Kind.Name(kind)} example", **extra)
            assert created.status == initial
            allowed = status in ALLOWED.get(kind, set())
            if allowed:
                moved = transition(c, created.name, status, expected_version=created.version)
                assert (moved.status, moved.version) == (status, created.version + 1), mid
            else:
                with pytest.raises(grpc.RpcError) as err:
                    transition(c, created.name, status)
                assert error_reason(err.value) == (
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "ILLEGAL_TRANSITION",
                ), mid


def test_closed_items_cannot_move_again_and_etag_is_checked(lethe: Lethe) -> None:
    c = lethe.client("alice")
    question = create(c, "q", M.OPEN_QUESTION, "which venue?")
    thread = create_thread(c, "alice", "t1")
    answer = append(c, thread, ["the botanical garden"], commit=True)[0]
    closed = transition(
        c, question.name, M.ANSWERED, evidence=common_pb2.SourceRef(name=answer.name, version=1)
    )
    assert closed.status == M.ANSWERED
    with pytest.raises(grpc.RpcError) as err:
        transition(c, question.name, M.ANSWERED)
    assert error_reason(err.value)[1] == "ILLEGAL_TRANSITION"
    goal = create(c, "g", M.GOAL, "stay under budget")
    progress = transition(
        c, goal.name, M.ACTIVE, note="caterer came in 10% under", expected_version=1
    )
    assert (progress.status, progress.version) == (M.ACTIVE, 2)
    with pytest.raises(grpc.RpcError) as err:
        transition(c, goal.name, M.ACHIEVED, expected_version=1)
    assert error_reason(err.value) == (grpc.StatusCode.ABORTED, "VERSION_MISMATCH")
    assert transition(c, goal.name, M.ACHIEVED, expected_version=2).status == M.ACHIEVED


def test_correction_supersedes_and_search_returns_only_the_new_value(lethe: Lethe) -> None:
    c = lethe.client("alice")
    fact = create(c, "guests", M.FACT, "the guest count is forty", slot="event.guest_count")
    fixed = c.memories.UpdateMemory(
        memories_pb2.UpdateMemoryRequest(
            memory=M(name=fact.name, text="the guest count is fifty-five"),
            update_mask=field_mask_pb2.FieldMask(paths=["text"]),
            expected_version=1,
        ),
        metadata=tuple(c.md),
    )
    assert (fixed.version, fixed.supersedes, fixed.status) == (2, 1, M.ACTIVE)
    old = c.memories.GetMemory(
        memories_pb2.GetMemoryRequest(name=fact.name, version=1), metadata=tuple(c.md)
    )
    assert (old.text, old.status) == ("the guest count is forty", M.SUPERSEDED)
    modes = (
        retrieval_pb2.SearchRequest.HYBRID,
        retrieval_pb2.SearchRequest.DENSE,
        retrieval_pb2.SearchRequest.LEXICAL,
    )
    for mode in modes:
        resp = c.retrieval.Search(
            retrieval_pb2.SearchRequest(
                parent=OWNER, query_text="guest count forty", top_k=20, mode=mode
            ),
            metadata=tuple(c.md),
        )
        assert "forty" not in str([h.memory.text for h in resp.hits])
        assert [h.memory.version for h in resp.hits if h.memory.name == fact.name] in ([], [2])


def test_a_second_active_fact_on_a_slot_is_a_conflict(lethe: Lethe) -> None:
    c = lethe.client("alice")
    first = create(c, "g1", M.FACT, "forty guests", slot="event.guest_count", scope="wedding")
    with pytest.raises(grpc.RpcError) as err:
        create(c, "g2", M.FACT, "fifty guests", slot="event.guest_count", scope="wedding")
    assert error_reason(err.value) == (grpc.StatusCode.ALREADY_EXISTS, "SLOT_CONFLICT")
    assert first.name in str(err.value.details())
    # Another scope is another slot; after the first is forgotten the slot is free.
    create(c, "g3", M.FACT, "ten guests", slot="event.guest_count", scope="rehearsal")
    c.lifecycle.Forget(
        lifecycle_pb2.ForgetRequest(names=[first.name]),
        metadata=tuple(c.md),
    )
    create(c, "g4", M.FACT, "fifty guests", slot="event.guest_count", scope="wedding")
    stream = c.events.Watch(
        events_pb2.WatchRequest(parent=OWNER, types=[events_pb2.SLOT_CONFLICT]),
        metadata=tuple(c.md),
        timeout=1.0,
    )
    got: list[events_pb2.Event] = []
    with pytest.raises(grpc.RpcError):
        got.extend(stream)
    assert [e.subject for e in got] == [first.name]


def test_slot_names_are_not_stored_in_plaintext(lethe: Lethe) -> None:
    c = lethe.client("alice")
    create(c, "s", M.FACT, "x", slot="zeppelin.registration_number")
    lethe.stop()
    raw = b"".join(p.read_bytes() for p in lethe.data_dir.rglob("*") if p.is_file())
    assert b"zeppelin" not in raw
    lethe.start()


def test_preference_resolution_narrowest_scope_explicit_first(lethe: Lethe) -> None:
    c = lethe.client("alice")
    create(c, "p-default", M.PREFERENCE, "short answers", slot="style.length", origin=M.EXPLICIT)
    create(
        c,
        "p-research-inferred",
        M.PREFERENCE,
        "long answers",
        slot="style.length",
        scope="research",
        origin=M.INFERRED,
    )
    create(
        c,
        "p-research",
        M.PREFERENCE,
        "detailed answers with sources",
        slot="style.length",
        scope="research",
        origin=M.EXPLICIT,
    )
    c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=OWNER,
            memory_id="p-candidate",
            memory=M(
                kind=M.PREFERENCE,
                text="bullet points",
                slot="style.length",
                scope="research.papers",
                origin=M.INFERRED,
            ),
        ),
        metadata=tuple(c.md),
    )

    def resolve(scope: str) -> memories_pb2.ResolvePreferenceResponse:
        return c.memories.ResolvePreference(
            memories_pb2.ResolvePreferenceRequest(parent=OWNER, slot="style.length", scope=scope),
            metadata=tuple(c.md),
        )

    assert resolve("research").preference.text == "detailed answers with sources"
    papers = resolve("research.papers")
    assert papers.preference.text == "detailed answers with sources"
    assert [m.text for m in papers.candidates] == ["bullet points"]
    assert resolve("cooking").preference.text == "short answers"
    assert resolve("").preference.text == "short answers"
    missing = c.memories.ResolvePreference(
        memories_pb2.ResolvePreferenceRequest(parent=OWNER, slot="style.tone", scope="research"),
        metadata=tuple(c.md),
    )
    assert not missing.HasField("preference")


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
