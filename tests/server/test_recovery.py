"""Crash recovery and group commit of the record store (white-box on the real LMDB)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from lethe._rpc import reason_of as _reason
from lethe.v1 import common_pb2, threads_pb2
from server.store import ForgetTargets, Store, TurnDraft
from shredder import RingRef


def _draft(text: str, commit: bool = True) -> TurnDraft:
    return TurnDraft(
        role=common_pb2.USER,
        speaker="",
        text=text,
        time=None,
        embedding=None,
        context_manifest="",
        context_refs=[],
        commit=commit,
        pending_ttl=3600.0,
    )


def test_forget_interrupted_after_tombstones_is_resumed_at_start(
    tmp_path: Path, lethe_at: Callable[..., Any]
) -> None:
    store = Store(tmp_path / "d")
    store.create_thread("alice", "t1", "")
    metas, _, _ = store.append_turns("alice", "t1", [_draft("one"), _draft("two")], "")
    # Step 1 only, as if the process died before destroying keys and purging.
    plan = store.plan_forget(
        "alice", ForgetTargets.of(turns=[("t1", 1)]), reason="FORGET", request_time=0.0
    )
    ring = RingRef("alice", "t1")
    assert store.keystore.has_record_key(ring, metas[0].key_id)
    assert [e.id for e in store.outstanding_deletions()] == [plan.id]
    store.close()

    lethe = lethe_at(tmp_path / "d")
    assert lethe.server is not None
    st = lethe.server.store
    assert st.outstanding_deletions() == []
    assert not st.keystore.has_record_key(ring, metas[0].key_id)
    assert st.keystore.has_record_key(ring, metas[1].key_id)
    entry = st.deletion("alice", plan.id)
    assert entry is not None
    assert entry.complete_time > 0
    assert all(d.done for d in entry.destinations.values())
    c = lethe.client("alice")
    with pytest.raises(grpc.RpcError) as err:
        c.threads.GetTurn(
            threads_pb2.GetTurnRequest(name="owners/alice/threads/t1/turns/1"), metadata=c.md
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert _reason(err.value) == "RECORD_DELETED"
    two = c.threads.GetTurn(
        threads_pb2.GetTurnRequest(name="owners/alice/threads/t1/turns/2"), metadata=c.md
    )
    assert two.text == "two"


def test_append_retry_with_same_request_id_destroys_the_unused_keys(
    tmp_path: Path, kek_env: str
) -> None:
    store = Store(tmp_path / "d")
    try:
        store.create_thread("alice", "t1", "")
        first, retried, _ = store.append_turns("alice", "t1", [_draft("x")], "req-1")
        keys_after_first = store.keystore.key_count()
        again, retried_again, _ = store.append_turns("alice", "t1", [_draft("x")], "req-1")
        assert (retried, retried_again) == (False, True)
        assert [m.rid for m in again] == [m.rid for m in first]
        assert store.keystore.key_count() == keys_after_first
    finally:
        store.close()


def test_second_store_on_same_directory_is_refused(tmp_path: Path, kek_env: str) -> None:
    from server import StoreLockedError

    store = Store(tmp_path / "d")
    try:
        with pytest.raises(StoreLockedError):
            Store(tmp_path / "d")
    finally:
        store.close()
