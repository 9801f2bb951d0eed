"""The events a forget announces, on a real store: one RECORD_DELETED per
forgotten turn of a range, numbered consecutively in one batch (one read and
one write of the event counter), and the counter moved past all of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from server.store import Store, TurnDraft

N = 300


@pytest.fixture
def store(tmp_path: Path, kek_env: str) -> Iterator[Store]:
    s = Store(tmp_path / "d")
    s.create_thread("alice", "t1", "")
    drafts = [TurnDraft(1, "", f"turn {i}", None, None, "", [], True, 0.0) for i in range(1, N + 1)]
    s.append_turns("alice", "t1", drafts, "req-1")
    yield s
    s.close()


def test_a_range_forget_numbers_its_events_consecutively_and_moves_the_counter(
    store: Store,
) -> None:
    before = store.events("alice", 0, set())
    start = int(before[-1].id) if before else 0
    entry = store.plan_forget("alice", reason="FORGET", request_time=0.0, ranges=[("t1", 11, 260)])
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
