"""Retention of committed records through the real server: enforced on read, then forgotten.

A committed turn, a memory, a thread and an owner's default: from the expiry
on every read treats the record as forgotten — get, listings, search, context,
export, and what was derived from it — although no sweeper ran (the fixture
runs none); the sweep then forgets it through the normal deletion path, with a
signed receipt of reason ``RETENTION``, its keys destroyed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from _helpers import append, create_thread, reply, summary
from conftest import Client, Lethe

from lethe.client import BadField, NotFound, OwnerNotAllowed, RecordDeleted, Sealed
from lethe.receipts import verify_receipt
from lethe.v1 import common_pb2

TTL = 1.5
"""Seconds a test's records live."""


def _sweep(lethe: Lethe) -> int:
    assert lethe.server is not None
    return lethe.server.lifecycle.sweep()


def _wait_past(expire_seconds: float) -> None:
    time.sleep(max(0.0, expire_seconds - time.time()) + 0.05)


def _keys(c: Client) -> list[bytes]:
    return [k.public_key for k in c.get_server_info().receipt_keys]


def _every_read(c: Client, thread: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """What listing, search, context and export show of alice's turns' texts."""
    listed = [t.text for t in c.iter_turns(thread, include_tainted=True)]
    found = [h.turn.text for h in c.search("owners/alice", query_text="biscuit puppy").hits]
    bundle = c.assemble_context(thread, query_text="biscuit puppy")
    context = [t.text for t in bundle.recent_turns] + [h.turn.text for h in bundle.memories]
    exported = [i.turn.text for i in c.export_owner("owners/alice") if i.HasField("turn")]
    return listed, found, context, exported


def test_an_expired_committed_turn_is_gone_from_every_read_before_the_sweep(
    lethe: Lethe,
) -> None:
    c = lethe.client("alice")
    t = create_thread(c, "alice", thread_id="t")
    gone, kept = append(c, t, ["my puppy Biscuit", "I like tea"], commit=True)
    answer = reply(c, t, "Biscuit is a good name for a puppy", [gone.name])
    derived = summary(c, "sum", "has a puppy named Biscuit", [gone.name])
    done = c.set_retention([gone.name], ttl=TTL)
    assert [r.name for r in done.records] == [gone.name]
    expires = done.expire_time.ToNanoseconds() / 1e9
    assert abs(expires - (time.time() + TTL)) < 1.0
    assert c.get_turn(gone.name).expire_time.ToNanoseconds() / 1e9 == pytest.approx(expires)
    assert not c.get_turn(kept.name).HasField("expire_time")
    before = _every_read(c, t)
    assert "my puppy Biscuit" in before[0]
    assert "my puppy Biscuit" in before[1]

    _wait_past(expires)
    with pytest.raises(RecordDeleted):
        c.get_turn(gone.name)
    with pytest.raises(RecordDeleted):
        c.get_memory(derived.name)  # derived from it: gone with it
    assert c.get_turn(answer.name).tainted  # a response built on it
    for shown in _every_read(c, t):
        assert "my puppy Biscuit" not in shown
    assert "I like tea" in _every_read(c, t)[0]
    assert list(c.iter_deletions("owners/alice")) == []  # no sweeper has run

    assert _sweep(lethe) == 1
    [receipt] = list(c.iter_deletions("owners/alice"))
    assert receipt.reason == "RETENTION"
    assert list(receipt.targets) == [gone.name]
    assert receipt.deleted == 2  # the turn and the summary derived from it
    assert verify_receipt(receipt, _keys(c))
    assert all(d.done for d in receipt.destinations)
    assert c.audit("owners/alice").keys_without_record == 0
    assert _sweep(lethe) == 0


def test_a_memory_created_with_a_retention_expires(lethe: Lethe) -> None:
    c = lethe.client("alice")
    made = c.create_memory(
        "owners/alice",
        {"kind": "FACT", "text": "likes jasmine tea", "state": "COMMITTED"},
        memory_id="tea",
        retention=TTL,
    )
    assert made.HasField("expire_time")
    fixed = c.create_memory(
        "owners/alice", {"kind": "FACT", "text": "lives in Lyon", "state": "COMMITTED"}
    )
    assert not fixed.HasField("expire_time")
    corrected = c.update_memory(
        {"name": made.name, "text": "likes green tea"}, update_mask=["text"]
    )
    assert corrected.expire_time == made.expire_time  # every version goes at once
    _wait_past(made.expire_time.ToNanoseconds() / 1e9)
    with pytest.raises(RecordDeleted):
        c.get_memory(made.name)
    with pytest.raises(RecordDeleted):
        c.get_memory(made.name, version=1)
    assert [m.name for m in c.iter_memories("owners/alice")] == [fixed.name]
    assert _sweep(lethe) == 1
    [receipt] = list(c.iter_deletions("owners/alice"))
    assert (list(receipt.targets), receipt.reason) == ([made.name], "RETENTION")


def test_a_threads_retention_covers_its_turns_and_those_appended_later(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t = create_thread(c, "alice", thread_id="t", title="a chat to let go")
    other = create_thread(c, "alice", thread_id="keep")
    first = append(c, t, ["before the retention"], commit=True)[0]
    append(c, other, ["kept forever"], commit=True)
    done = c.set_retention([t], ttl=TTL)
    assert [r.name for r in done.records] == [first.name]
    later = append(c, t, ["after the retention"], commit=True)[0]
    pending = append(c, t, ["pending, longer window"])[0]
    thread = c.get_thread(t)
    assert thread.expire_time == done.expire_time
    for name in (first.name, later.name, pending.name):
        assert c.get_turn(name).expire_time == done.expire_time  # the pending window is shorter
    _wait_past(done.expire_time.ToNanoseconds() / 1e9)
    with pytest.raises(RecordDeleted):
        c.get_thread(t)
    with pytest.raises(RecordDeleted):
        c.get_turn(later.name)
    with pytest.raises(RecordDeleted):
        c.append_turns(t, [{"role": "USER", "text": "too late"}])
    assert [x.name for x in c.iter_threads("owners/alice")] == [other]
    assert _sweep(lethe) == 1  # the thread as a whole: one deletion, its ring destroyed
    [receipt] = list(c.iter_deletions("owners/alice"))
    assert (list(receipt.targets), receipt.reason) == ([t], "RETENTION")
    assert receipt.deleted == 3
    assert [x.text for x in c.iter_turns(other)] == ["kept forever"]


def test_an_owners_default_applies_to_what_is_created_from_then_on(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t = create_thread(c, "alice", thread_id="t")
    old = append(c, t, ["said before the default"], commit=True)[0]
    set_at = time.time()
    done = c.set_retention(["owners/alice"], ttl=TTL)
    assert done.owner_default.ToNanoseconds() / 1e9 == TTL
    assert list(done.records) == []
    new = append(c, t, ["said after the default"], commit=True)[0]
    mem = c.create_memory(
        "owners/alice", {"kind": "FACT", "text": "new fact", "state": "COMMITTED"}
    )
    for record in (c.get_turn(new.name), mem):
        assert record.expire_time.ToNanoseconds() / 1e9 == pytest.approx(set_at + TTL, abs=1.0)
    assert not c.get_turn(old.name).HasField("expire_time")
    cleared = c.set_retention(["owners/alice"], clear=True)
    assert not cleared.HasField("owner_default")
    last = append(c, t, ["said after the default was cleared"], commit=True)[0]
    assert not c.get_turn(last.name).HasField("expire_time")
    _wait_past(mem.expire_time.ToNanoseconds() / 1e9)
    assert [x.text for x in c.iter_turns(t)] == [
        "said before the default",
        "said after the default was cleared",
    ]
    assert _sweep(lethe) == 2


def test_a_pending_record_keeps_its_retention_when_committed(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t = create_thread(c, "alice", thread_id="t")
    turn = append(c, t, ["pending for now"], ttl=3600)[0]
    window = c.get_turn(turn.name).expire_time
    far = c.set_retention([turn.name], ttl=7200)
    assert c.get_turn(turn.name).expire_time == window  # a retention never lengthens the window
    c.commit([turn.name])
    assert c.get_turn(turn.name).expire_time == far.expire_time  # committed: its retention
    soon = c.set_retention([turn.name], ttl=TTL)
    assert c.get_turn(turn.name).expire_time == soon.expire_time
    c.set_retention([turn.name], clear=True)
    assert not c.get_turn(turn.name).HasField("expire_time")
    time.sleep(TTL + 0.1)
    assert c.get_turn(turn.name).text == "pending for now"
    assert _sweep(lethe) == 0


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c, n: c.set_retention([n["turn"]], ttl=60, clear=True), BadField),
        (lambda c, n: c.set_retention([n["turn"]]), BadField),
        (lambda c, n: c.set_retention(["owners/alice"], expire_time=time.time() + 60), BadField),
        (lambda c, n: c.set_retention(["owners/alice", n["turn"]], ttl=60), BadField),
        (lambda c, n: c.set_retention([n["turn"]], expire_time=time.time() - 60), BadField),
        (lambda c, n: c.set_retention([n["turn"], "owners/bob/memories/m"], ttl=60), BadField),
        (lambda c, n: c.set_retention([n["sealed"]], ttl=60), Sealed),
        (lambda c, n: c.set_retention(["owners/bob"], ttl=60), OwnerNotAllowed),
        (lambda c, n: c.set_retention([n["turn"] + "0"], ttl=60), NotFound),
    ],
    ids=["two", "none", "owner-time", "owner-mixed", "past", "two-owners", "sealed", "bob", "404"],
)
def test_set_retention_refusals_change_nothing(
    lethe: Lethe, call: Callable[[Client, dict[str, str]], object], error: type[Exception]
) -> None:
    c = lethe.client("alice")
    t = create_thread(c, "alice", thread_id="t")
    turn, _, sealed = append(c, t, ["one", "two", "three"], commit=True)
    c.seal_repair(t, from_seq=3)
    with pytest.raises(error):
        call(c, {"turn": turn.name, "sealed": sealed.name})
    assert not c.get_turn(turn.name).HasField("expire_time")
    assert c.get_turn(turn.name).state == common_pb2.COMMITTED


def test_the_audit_counts_no_drift_while_expired_records_await_the_sweep(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t = create_thread(c, "alice", thread_id="t")
    turn, _ = append(c, t, ["a puppy named Biscuit", "a cat named Tofu"], commit=True)
    memory = c.create_memory(
        "owners/alice", {"kind": "FACT", "text": "Biscuit is a puppy", "state": "COMMITTED"}
    )

    def found() -> set[str]:
        hits = c.search("owners/alice", query_text="Biscuit puppy").hits
        return {h.turn.text if h.HasField("turn") else h.memory.text for h in hits}

    assert {"a puppy named Biscuit", "Biscuit is a puppy"} <= found()  # the indexes are loaded
    done = c.set_retention([turn.name, memory.name], ttl=TTL)
    assert {"a puppy named Biscuit", "Biscuit is a puppy"} <= found()
    _wait_past(done.expire_time.ToNanoseconds() / 1e9)
    report = c.audit("owners/alice")
    assert (report.index_drift, report.orphans) == (0, 0)
    assert not {"a puppy named Biscuit", "Biscuit is a puppy"} & found()
    assert _sweep(lethe) == 2
    assert c.audit("owners/alice").index_drift == 0
