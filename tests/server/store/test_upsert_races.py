"""``upsert_memory`` when the id changes hands between its read and its write, on a real store.

The interleavings a server under load produces now and then are forced here:
another writer creates the id, or a forget purges it, exactly between the
upsert's choice and its transaction. The upsert chooses again and lands.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _one_thread import one_thread_store

from server.store import ForgetTargets, MemoryContent, MemoryDraft, MemoryView, Store

NAME = "owners/alice/memories/up"


@pytest.fixture
def store(tmp_path: Path, kek_env: str) -> Iterator[Store]:
    s = one_thread_store(tmp_path / "d", 1)
    yield s
    s.close()


def _draft(text: str) -> MemoryDraft:
    return MemoryDraft("FACT", MemoryContent(text))


def _upsert(store: Store, text: str) -> MemoryView:
    return store.upsert_memory("alice", "up", _draft(text), {"text"}, 0, 3600.0, commit=True)


def _forget(store: Store) -> None:
    targets = ForgetTargets.of(memories=["up"])
    entry = store.plan_forget("alice", targets, reason="FORGET", request_time=0.0)
    store.finish_forget(entry, 0.0)


def test_an_id_created_then_purged_under_the_upserts_create_is_created(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix the upsert answered ``ALREADY_EXISTS``.

    Its create found the id taken (another writer created it after the
    upsert read it missing), and a forget purged it before the upsert looked
    again: the id was free, and the upsert gave up instead of choosing again.
    """
    real = store.create_memory
    calls = 0

    def interleaved(*args: Any, **kwargs: Any) -> MemoryView:
        nonlocal calls
        calls += 1
        if calls == 1:
            real("alice", "up", _draft("another writer's"), commit=True, pending_ttl=3600.0)
            try:
                return real(*args, **kwargs)  # ALREADY_EXISTS: the id is taken
            finally:
                _forget(store)  # ... and free again before the upsert looks
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "create_memory", interleaved)
    view = _upsert(store, "mine")
    assert (view.content.text, view.version) == ("mine", 2)  # created over the purged id
    assert store.get_memory("alice", "up", 0).content.text == "mine"


def test_an_id_purged_under_the_upserts_update_is_created(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _upsert(store, "first")
    real = store.update_memory

    def interleaved(*args: Any, **kwargs: Any) -> MemoryView:
        _forget(store)  # deleted and purged between the upsert's read and its update
        monkeypatch.setattr(store, "update_memory", real)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "update_memory", interleaved)
    view = _upsert(store, "second")
    assert (view.content.text, view.version) == ("second", 2)
