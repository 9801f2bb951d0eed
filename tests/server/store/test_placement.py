"""Moved-away markers on a real store: written and read across processes, enforced by the writer.

Markers are written and read across processes' handles, and enforced by the
writer inside the write transaction — a write for a marked owner fails whole
(no row, no stray key) even when it never passed the server's authorisation
check, while internal work and other owners go on.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.errors import OwnerMoved
from server.store import Store, TurnDraft


@pytest.fixture
def store(tmp_path: Path, kek_env: str) -> Iterator[Store]:
    s = Store(tmp_path / "d")
    s.create_thread("alice", "t1", "")
    s.create_thread("bob", "t1", "")
    yield s
    s.close()


def _draft(text: str) -> TurnDraft:
    return TurnDraft(1, "", text, None, None, "", [], True, 0.0)


def test_writes_for_a_marked_owner_fail_inside_the_transaction(store: Store) -> None:
    store.append_turns("alice", "t1", [_draft("before")], "req-1")
    keys_before = sorted(store.keystore.list_record_keys("alice"))
    store.mark_moved("alice", "c", "10.0.0.3:50051")
    with pytest.raises(OwnerMoved) as info:
        store.append_turns("alice", "t1", [_draft("after")], "req-2")
    assert (info.value.shard, info.value.target) == ("c", "10.0.0.3:50051")
    with pytest.raises(OwnerMoved):
        store.create_thread("alice", "t2", "a title")
    with pytest.raises(OwnerMoved):
        store.commit_records(["owners/alice/threads/t1/turns/1"], False)
    # The refused ops' record keys were discarded (a new thread's empty ring may
    # stay, as after any failed create: it holds no key and no content).
    assert sorted(store.keystore.list_record_keys("alice")) == keys_before
    assert store.audit("alice").keys_without_record == 0
    # Another owner writes; the marked owner's data is untouched and readable.
    store.append_turns("bob", "t1", [_draft("bob writes")], "req-3")
    assert [t.meta.seq for t in store.recent_turns("alice", "t1", 10)] == [1]
    store.clear_moved("alice")
    store.append_turns("alice", "t1", [_draft("back")], "req-4")
    assert [t.meta.seq for t in store.recent_turns("alice", "t1", 10)] == [1, 2]


def test_a_marker_written_by_another_handle_is_seen_by_the_next_write(
    store: Store, tmp_path: Path
) -> None:
    """``lethe shard mark-moved`` in another process, beside the open store."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "server.cli",
            "shard",
            "mark-moved",
            "--data",
            str(tmp_path / "d"),
            "--owner",
            "alice",
            "--to",
            "c",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    row = store.moved("alice")
    assert row is not None
    assert (row.shard, row.target) == ("c", "")
    with pytest.raises(OwnerMoved):
        store.append_turns("alice", "t1", [_draft("late")], "req-1")
