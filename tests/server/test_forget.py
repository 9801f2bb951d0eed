"""Forget over gRPC: turns, ranges, threads, owners; tombstones, receipts, what stays untouched."""

from __future__ import annotations

import grpc
import pytest
from _helpers import (
    append,
    create_thread,
    error_reason,
    expect_error,
    forget,
    get_turn,
    list_texts,
    outcome,
    search_texts,
    unique,
)
from conftest import Lethe

from lethe.v1 import common_pb2, lifecycle_pb2, memories_pb2, threads_pb2

DESTINATIONS = {"lmdb", "index", "lexical", "keystore", "cache"}
NOT_FOUND = grpc.StatusCode.NOT_FOUND


def _assert_receipt(
    receipt: common_pb2.DeletionReceipt, owner: str, targets: list[str], deleted: int, *planted: str
) -> None:
    assert receipt.name.startswith(f"owners/{owner}/deletions/")
    assert len(receipt.name) > len(f"owners/{owner}/deletions/")
    assert list(receipt.targets) == targets
    assert receipt.deleted == deleted
    assert {d.name for d in receipt.destinations} == DESTINATIONS
    assert len(receipt.destinations) == len(DESTINATIONS)
    for dest in receipt.destinations:
        assert dest.done, dest.name
        assert dest.HasField("complete_time"), dest.name
    assert receipt.HasField("request_time")
    assert receipt.HasField("complete_time")
    assert receipt.complete_time.ToNanoseconds() >= receipt.request_time.ToNanoseconds()
    raw = receipt.SerializeToString()
    text_form = str(receipt)
    for secret in planted:
        assert secret.encode() not in raw
        assert secret not in text_form


def test_forget_turn_removes_it_from_search_get_and_list(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    gone, kept = f"forget me {unique()}", f"keep me {unique()}"
    t_gone, t_kept = append(c, thread, [gone, kept], commit=True, speaker=unique("spk"))
    assert gone in search_texts(c, "alice", gone)
    receipt = forget(c, t_gone.name)
    _assert_receipt(receipt, "alice", [t_gone.name], 1, gone, t_gone.speaker)
    assert receipt.reason == "FORGET"
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=t_gone.name),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )
    assert list_texts(c, thread) == [kept]
    found = search_texts(c, "alice", gone)
    assert gone not in found
    assert kept in found
    assert get_turn(c, t_kept.name).text == kept


def test_forget_pending_turn_removes_it_from_pending_search(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    text = f"pending forget {unique()}"
    (turn,) = append(c, thread, [text])
    assert search_texts(c, "alice", text, thread=thread, include_pending=True) == [text]
    forget(c, turn.name)
    assert search_texts(c, "alice", text, thread=thread, include_pending=True) == []
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=turn.name),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )


def test_get_never_existing_turn_is_not_found_not_deleted(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    append(c, thread, ["only one"])
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=f"{thread}/turns/2"),
        c.md,
        NOT_FOUND,
        "NOT_FOUND",
    )
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name="owners/alice/threads/nope/turns/1"),
        c.md,
        NOT_FOUND,
        "NOT_FOUND",
    )
    expect_error(
        c.threads.GetThread,
        threads_pb2.GetThreadRequest(name="owners/alice/threads/no"),
        c.md,
        NOT_FOUND,
        "NOT_FOUND",
    )


def test_forget_never_existing_turn_is_not_found_and_deletes_nothing(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    (turn,) = append(c, thread, ["stay"], commit=True)
    req = lifecycle_pb2.ForgetRequest(names=[turn.name, f"{thread}/turns/9"])
    expect_error(c.lifecycle.Forget, req, c.md, NOT_FOUND, "NOT_FOUND")
    assert get_turn(c, turn.name).text == "stay"


def test_forget_thread_removes_all_its_turns_and_the_thread(lethe: Lethe) -> None:
    c = lethe.client("alice")
    title = unique("title")
    thread = create_thread(c, "alice", title=title)
    other = create_thread(c, "alice")
    texts = [f"thread text {unique()}" for _ in range(3)]
    turns = append(c, thread, texts[:2], commit=True) + append(c, thread, texts[2:])
    survivor = f"other thread {unique()}"
    (s_turn,) = append(c, other, [survivor], commit=True)

    receipt = forget(c, thread)
    _assert_receipt(receipt, "alice", [thread], 3, *texts, title)

    expect_error(
        c.threads.GetThread,
        threads_pb2.GetThreadRequest(name=thread),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )
    for turn in turns:
        expect_error(
            c.threads.GetTurn,
            threads_pb2.GetTurnRequest(name=turn.name),
            c.md,
            NOT_FOUND,
            "RECORD_DELETED",
        )
    expect_error(
        c.threads.ListTurns,
        threads_pb2.ListTurnsRequest(parent=thread),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )
    for text in texts:
        assert text not in search_texts(c, "alice", text)
    listed = c.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent="owners/alice"), metadata=tuple(c.md)
    )
    assert [t.name for t in listed.threads] == [other]
    # The other thread is untouched.
    assert survivor in search_texts(c, "alice", survivor)
    assert get_turn(c, s_turn.name).text == survivor


def test_forget_thread_with_pending_turns_hides_them_from_pending_search(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    text = f"pending in forgotten thread {unique()}"
    append(c, thread, [text])
    assert search_texts(c, "alice", text, thread=thread, include_pending=True) == [text]
    forget(c, thread)
    # The thread is gone: naming it in search either finds nothing or is refused.
    got = outcome(lambda: search_texts(c, "alice", text, thread=thread, include_pending=True))
    assert got in (("ok", []), ("error", NOT_FOUND)), got


def test_forget_owner_removes_everything_of_that_owner_only(lethe: Lethe) -> None:
    alice = lethe.client("alice")
    bob = lethe.client("bob")
    a_threads = [create_thread(alice, "alice", title=unique("t")) for _ in range(2)]
    a_texts = [f"alice says {unique()}" for _ in range(2)]
    a_turns = [
        append(alice, t, [x], commit=True)[0] for t, x in zip(a_threads, a_texts, strict=True)
    ]
    b_thread = create_thread(bob, "bob")
    b_text = f"bob says {unique()}"
    (b_turn,) = append(bob, b_thread, [b_text], commit=True)

    receipt = forget(alice, "owners/alice")
    _assert_receipt(receipt, "alice", ["owners/alice"], 2, *a_texts)

    for thread in a_threads:
        expect_error(
            alice.threads.GetThread,
            threads_pb2.GetThreadRequest(name=thread),
            alice.md,
            NOT_FOUND,
            "RECORD_DELETED",
        )
    for turn in a_turns:
        expect_error(
            alice.threads.GetTurn,
            threads_pb2.GetTurnRequest(name=turn.name),
            alice.md,
            NOT_FOUND,
            "RECORD_DELETED",
        )
    for text in a_texts:
        assert search_texts(alice, "alice", text) == []
    listed = alice.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent="owners/alice"), metadata=tuple(alice.md)
    )
    assert list(listed.threads) == []
    # Bob is untouched.
    assert search_texts(bob, "bob", b_text) == [b_text]
    assert get_turn(bob, b_turn.name).text == b_text


def test_forget_turn_range_deletes_exactly_that_range(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    texts = [f"turn {i} {unique()}" for i in range(1, 7)]
    turns = append(c, thread, texts, commit=True)
    receipt = forget(c, rng=lifecycle_pb2.TurnRange(thread=thread, from_seq=2, to_seq=4))
    expected_targets = [t.name for t in turns[1:4]]
    assert sorted(receipt.targets) == sorted(expected_targets)
    assert receipt.deleted == 3
    assert list_texts(c, thread) == [texts[0], texts[4], texts[5]]
    for i, turn in enumerate(turns, start=1):
        if 2 <= i <= 4:
            expect_error(
                c.threads.GetTurn,
                threads_pb2.GetTurnRequest(name=turn.name),
                c.md,
                NOT_FOUND,
                "RECORD_DELETED",
            )
            assert texts[i - 1] not in search_texts(c, "alice", texts[i - 1])
        else:
            assert get_turn(c, turn.name).text == texts[i - 1]
            assert texts[i - 1] in search_texts(c, "alice", texts[i - 1])


def test_forget_turn_range_past_the_end_stops_at_last_seq(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    texts = [f"turn {i} {unique()}" for i in range(3)]
    turns = append(c, thread, texts, commit=True)
    receipt = forget(c, rng=lifecycle_pb2.TurnRange(thread=thread, from_seq=3, to_seq=99))
    assert list(receipt.targets) == [turns[2].name]
    assert list_texts(c, thread) == texts[:2]


def test_a_full_batch_of_names_given_twice_forgets_each_once_in_order(lethe: Lethe) -> None:
    """1,000 names (the batch limit), 500 turns each named twice: each is forgotten once, in order.

    The 500 turns are each named twice, interleaved. The receipt lists the 500
    once each in first-seen order and deletes 500; the turns after them keep
    their text (the dedup used to rebuild a set of the names seen so far for
    every name).
    """
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    texts = [f"turn {i} {unique()}" for i in range(510)]
    turns = append(c, thread, texts, commit=True)
    names = [t.name for t in turns[:500]]
    given = [n for pair in zip(names, reversed(names), strict=True) for n in pair]
    receipt = forget(c, *given)
    first_seen = list(dict.fromkeys(given))
    assert len(first_seen) == 500
    assert list(receipt.targets) == first_seen
    assert receipt.deleted == 500
    assert list_texts(c, thread) == texts[500:]


def test_forget_twice_keeps_record_deleted(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    (turn,) = append(c, thread, ["twice"], commit=True)
    forget(c, turn.name)
    got = outcome(lambda: list(forget(c, turn.name).targets))
    assert got in (("ok", [turn.name]), ("error", NOT_FOUND)), got
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=turn.name),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )


def test_appending_to_forgotten_thread_is_refused(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    append(c, thread, ["x"])
    forget(c, thread)
    req = threads_pb2.AppendTurnsRequest(
        parent=thread, turns=[threads_pb2.TurnInput(role=common_pb2.USER, text="y")]
    )
    expect_error(c.threads.AppendTurns, req, c.md, NOT_FOUND, "RECORD_DELETED")


@pytest.mark.parametrize("seq", [1, 2])
def test_thread_last_seq_keeps_numbers_of_forgotten_turns(lethe: Lethe, seq: int) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    turns = append(c, thread, ["a", "b"], commit=True)
    forget(c, turns[seq - 1].name)
    (new,) = append(c, thread, ["c"], commit=True)
    assert new.seq == 3
    t = c.threads.GetThread(threads_pb2.GetThreadRequest(name=thread), metadata=tuple(c.md))
    assert t.last_seq == 3


def test_a_forgotten_thread_id_used_again_numbers_on(lethe: Lethe) -> None:
    # Was: turn 1 of the new thread reused the forgotten turn 1's name.
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "fg")
    old = append(c, thread, ["first life one", "first life two"], commit=True)
    forget(c, thread)
    create_thread(c, "alice", "fg")
    new = append(c, thread, ["second life"], commit=True)[0]
    assert new.seq == 3
    with pytest.raises(grpc.RpcError) as err:
        c.threads.GetTurn(threads_pb2.GetTurnRequest(name=old[0].name), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")


def test_a_forgotten_memory_id_used_again_continues_its_versions(lethe: Lethe) -> None:
    c = lethe.client("alice")

    def create(text: str) -> memories_pb2.Memory:
        return c.memories.CreateMemory(
            memories_pb2.CreateMemoryRequest(
                parent="owners/alice",
                memory_id="m",
                memory=memories_pb2.Memory(kind=memories_pb2.Memory.FACT, text=text),
            ),
            metadata=tuple(c.md),
        )

    first = create("old content")
    forget(c, first.name)
    second = create("new content")
    assert (first.version, second.version) == (1, 2)
    with pytest.raises(grpc.RpcError) as err:  # a stale reference to version 1 is refused
        c.memories.CreateMemory(
            memories_pb2.CreateMemoryRequest(
                parent="owners/alice",
                memory=memories_pb2.Memory(
                    kind=memories_pb2.Memory.SUMMARY,
                    text="s",
                    sources=[common_pb2.SourceRef(name=first.name, version=1)],
                ),
            ),
            metadata=tuple(c.md),
        )
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "SOURCE_STALE")
