"""Start-up recovery in process on a real store: one pass over the data and the keystore.

That pass (``check_keys``) answers every step of a clean start, stray keys are
still destroyed from it, and a key a stored row names — a forgotten turn's
tombstone included — is never taken for a stray one. Recovery made two more
passes before: the fallback of its last step was evaluated eagerly, and stray
keys were looked up owner by owner.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from server._metrics import Metrics
from server.lifecycle import Lifecycle, Recovery
from server.retrieval import Retriever
from server.store import ForgetTargets, Store, TurnDraft
from shredder import RingRef


@pytest.fixture
def store(tmp_path: Path, kek_env: str) -> Iterator[Store]:
    s = Store(tmp_path / "d")
    rng = np.random.default_rng(0)
    for t in ("t1", "t2"):
        s.create_thread("alice", t, "a title")
        vecs = rng.standard_normal((20, 8)).astype(np.float32)
        drafts = [
            TurnDraft(1, "", f"turn {i}", None, vecs[i], "", [], True, 0.0) for i in range(20)
        ]
        s.append_turns("alice", t, drafts, "")
    s.create_thread("bob", "t1", "")
    yield s
    s.close()


def _recover(store: Store, monkeypatch: pytest.MonkeyPatch) -> tuple[Recovery, int, int]:
    passes = per_owner = 0
    check, lookup = store.check_keys, store.unreferenced_keys

    def counted_check() -> object:
        nonlocal passes
        passes += 1
        return check()

    def counted_lookup(owner: str) -> object:
        nonlocal per_owner
        per_owner += 1
        return lookup(owner)

    monkeypatch.setattr(store, "check_keys", counted_check)
    monkeypatch.setattr(store, "unreferenced_keys", counted_lookup)
    lifecycle = Lifecycle(store, Retriever(store, None), Metrics(), rotation_interval=0.0)
    return lifecycle.recover(), passes, per_owner


def test_a_clean_start_makes_one_pass(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = store.key_count()
    recovery, passes, per_owner = _recover(store, monkeypatch)
    assert (passes, per_owner) == (1, 0)
    assert recovery.stray_keys_destroyed == 0
    assert store.key_count() == keys


def test_stray_keys_go_and_named_keys_stay(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    Lifecycle(store, Retriever(store, None), Metrics(), rotation_interval=0.0).forget(
        "alice", ForgetTargets.of(turns=[("t1", 3)])
    )
    strays = [(RingRef("alice", "t1"), "stray-1"), (RingRef("bob", None), "stray-2")]
    store.keystore.create_record_keys(strays)
    before = set(store.keystore.list_record_keys())
    recovery, passes, per_owner = _recover(store, monkeypatch)
    assert (passes, per_owner) == (1, 0)
    assert recovery.stray_keys_destroyed == 2
    after = set(store.keystore.list_record_keys())
    assert before - after == set(strays)
    # The answer the owner-by-owner lookup gives agrees: nothing more is stray.
    assert store.unreferenced_keys("alice") == []
    assert store.unreferenced_keys("bob") == []
