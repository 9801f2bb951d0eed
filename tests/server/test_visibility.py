"""Visibility over gRPC: pending turns serve their own thread only.

Committed turns enter the owner's general retrieval; no search crosses owners.
"""

from __future__ import annotations

from _helpers import (
    append,
    create_thread,
    forget,
    get_turn,
    search,
    search_names,
    search_texts,
    unique,
)
from conftest import Lethe

from lethe.v1 import common_pb2, lifecycle_pb2, retrieval_pb2


def test_pending_turn_is_invisible_to_owner_wide_search(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    text = f"pending note {unique()}"
    (turn,) = append(c, thread, [text])
    assert turn.state == common_pb2.PENDING
    assert search_texts(c, "alice", text) == []
    # Not even when the thread is named, unless include_pending is set.
    assert search_texts(c, "alice", text, thread=thread) == []


def test_pending_turn_is_visible_with_thread_and_include_pending(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    other = create_thread(c, "alice")
    text = f"pending note {unique()}"
    (turn,) = append(c, thread, [text])
    hits = search(c, "alice", text, thread=thread, include_pending=True)
    assert [h.name for h in hits] == [turn.name]
    assert hits[0].state == common_pb2.PENDING
    assert hits[0].text == text
    # Another thread's pending scope does not reveal it.
    assert search_texts(c, "alice", text, thread=other, include_pending=True) == []


def test_turn_committed_at_append_is_found_by_owner_wide_search(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    text = f"committed note {unique()}"
    (turn,) = append(c, thread, [text], commit=True)
    assert turn.state == common_pb2.COMMITTED
    hits = search(c, "alice", text)
    assert hits, "committed turn not found"
    assert hits[0].name == turn.name
    assert hits[0].text == text
    assert hits[0].state == common_pb2.COMMITTED


def test_commit_makes_pending_turn_searchable_and_names_versions(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    texts = [f"first {unique()}", f"second {unique()}", f"third {unique()}"]
    turns = append(c, thread, texts)
    assert search_texts(c, "alice", texts[0]) == []
    resp = c.lifecycle.Commit(
        lifecycle_pb2.CommitRequest(names=[turns[0].name, turns[2].name]), metadata=tuple(c.md)
    )
    assert [(r.name, r.version) for r in resp.committed] == [
        (turns[0].name, 1),
        (turns[2].name, 1),
    ]
    found = search_texts(c, "alice", texts[0])
    assert texts[0] in found
    assert texts[2] in found
    assert texts[1] not in found
    assert get_turn(c, turns[0].name).state == common_pb2.COMMITTED
    assert get_turn(c, turns[1].name).state == common_pb2.PENDING


def test_commit_of_committed_turn_is_idempotent(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    (turn,) = append(c, thread, [f"again {unique()}"], commit=True)
    resp = c.lifecycle.Commit(lifecycle_pb2.CommitRequest(names=[turn.name]), metadata=tuple(c.md))
    assert [(r.name, r.version) for r in resp.committed] == [(turn.name, 1)]
    assert get_turn(c, turn.name).state == common_pb2.COMMITTED


def test_pending_turn_has_expire_time_and_committed_does_not(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    (pending,) = append(c, thread, ["waiting"], ttl=600)
    (committed,) = append(c, thread, ["kept"], commit=True)
    assert pending.HasField("expire_time")
    assert pending.expire_time.seconds - pending.create_time.seconds in (599, 600, 601)
    assert not committed.HasField("expire_time")
    assert get_turn(c, pending.name).HasField("expire_time")
    assert not get_turn(c, committed.name).HasField("expire_time")
    # Committing clears the expiry.
    c.lifecycle.Commit(lifecycle_pb2.CommitRequest(names=[pending.name]), metadata=tuple(c.md))
    assert not get_turn(c, pending.name).HasField("expire_time")


def test_default_pending_ttl_is_server_default(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    (turn,) = append(c, thread, ["default ttl"])
    assert turn.expire_time.seconds - turn.create_time.seconds in range(
        72 * 3600 - 1, 72 * 3600 + 2
    )


def test_search_never_returns_other_owners_records(lethe: Lethe) -> None:
    alice = lethe.client("alice")
    bob = lethe.client("bob")
    text = f"we both said this {unique()}"
    a_thread = create_thread(alice, "alice")
    b_thread = create_thread(bob, "bob")
    (a_turn,) = append(alice, a_thread, [text], commit=True)
    (b_turn,) = append(bob, b_thread, [text], commit=True)
    a_hits = search(alice, "alice", text)
    b_hits = search(bob, "bob", text)
    assert [h.name for h in a_hits] == [a_turn.name]
    assert [h.name for h in b_hits] == [b_turn.name]
    # An admin searching alice sees alice only.
    admin = lethe.client(admin=True)
    assert [h.name for h in search(admin, "alice", text)] == [a_turn.name]


def test_commit_with_a_name_twice_commits_once_and_stays_searchable(lethe: Lethe) -> None:
    # Was INTERNAL (duplicate ids in one lexical add) with the turn committed but unsearchable.
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turn = append(c, thread, ["the marmalade jar is empty"])[0]
    resp = c.lifecycle.Commit(
        lifecycle_pb2.CommitRequest(names=[turn.name, turn.name]), metadata=tuple(c.md)
    )
    assert [r.name for r in resp.committed] == [turn.name]
    assert search_names(c, "marmalade jar", mode=retrieval_pb2.SearchRequest.LEXICAL) == [turn.name]
    receipt = forget(c, turn.name, turn.name)
    assert list(receipt.targets) == [turn.name]
