"""Steps 1 and 4 of a forget on a real store: the events it announces, and the purge of every row.

The events: one RECORD_DELETED per forgotten turn of a range, numbered
consecutively in one batch, the counter moved past all of them. The purge:
every row of the forgotten turns, from the plan's own positions and from an
entry read back from the log alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _one_thread import one_thread_store

from server.store import ForgetTargets, Store
from server.store import _schema as sk

N = 300


@pytest.fixture
def store(tmp_path: Path, kek_env: str) -> Iterator[Store]:
    s = one_thread_store(tmp_path / "d", N)
    yield s
    s.close()


def test_a_range_forget_numbers_its_events_consecutively_and_moves_the_counter(
    store: Store,
) -> None:
    before = store.events("alice", 0, set())
    start = int(before[-1].id) if before else 0
    entry = store.plan_forget(
        "alice", ForgetTargets.of(ranges=[("t1", 11, 260)]), reason="FORGET", request_time=0.0
    )
    store.finish_forget(entry, 0.0)
    store.emit_event("alice", "RECORD_DELETED", "owners/alice/after")
    got = store.events("alice", start, set())
    ids = [int(e.id) for e in got]
    assert ids == list(range(start + 1, start + 1 + 250 + 1))
    subjects = [e.subject for e in got[:-1]]
    assert subjects == [f"owners/alice/threads/t1/turns/{s}" for s in range(11, 261)]
    assert {e.receipt for e in got[:-1]} == {entry.name}
    assert got[-1].subject == "owners/alice/after"
    assert got[-1].receipt == ""


def _rows(store: Store, rid: int, thread: str, seq: int) -> list[str]:
    """The tables still holding a row of turn ``rid``."""
    t = store.t
    found = []
    with store.env.begin() as txn:
        if txn.get(sk.rid_key(rid), db=t.turns) is not None:
            found.append("turns")
        if any(txn.get(sk.payload_key(rid, p), db=t.payloads) for p in sk.TURN_PAYLOAD_TYPES):
            found.append("payloads")
        if txn.get(sk.seq_key("alice", thread, seq), db=t.seqs) is not None:
            found.append("seqs")
        if txn.get(sk.owner_record_key("alice", rid), db=t.owner_records) is not None:
            found.append("owner_records")
    return found


@pytest.mark.parametrize("read_back", [False, True])
def test_the_purge_removes_every_row_of_the_forgotten_turns_only(
    store: Store, read_back: bool
) -> None:
    metas = {m.seq: m for m in store.thread_turns("alice", "t1")}
    entry = store.plan_forget(
        "alice", ForgetTargets.of(ranges=[("t1", 41, 290)]), reason="FORGET", request_time=0.0
    )
    assert len(entry.positions) == 250
    if read_back:  # as the start-up resumer finds it: no positions
        stored = store.deletion("alice", entry.id)
        assert stored is not None
        assert stored.positions == {}
        entry = stored
    store.finish_forget(entry, 0.0)
    for seq, meta in metas.items():
        left = _rows(store, meta.rid, "t1", seq)
        if 41 <= seq <= 290:
            assert left == [], seq
        else:
            assert left == ["turns", "payloads", "seqs", "owner_records"], seq
    done = store.deletion("alice", entry.id)
    assert done is not None
    assert done.complete_time > 0
