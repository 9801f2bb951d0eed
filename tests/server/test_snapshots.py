"""Warm starts from index snapshots, in process on a real store and keystore.

A snapshot loaded in a new process holds exactly what the bundle it was saved
from held, and what a build from LMDB would hold: every leg's documents and
terms, vectors, contexts, sessions, times, memory versions. Rows written after
it was saved are replayed to the same result; a forget makes every earlier
snapshot unopenable, also one being written while it runs; a snapshot of rows a
restore rolled back, of another embedder, or a damaged one, is never used as it
stands.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from index import LexicalIndex, analyze, load_state
from server._metrics import Metrics
from server.lifecycle import Lifecycle
from server.retrieval import Retriever, _build
from server.retrieval._snapshot import bundle_of
from server.store import ForgetTargets, MemoryContent, MemoryDraft, Store, TurnDraft, TurnMeta

OWNER, D = "alice", 16
QUERIES = ["turn about apples", "the weather today", "zebra 17", "pears and plums 3", "fennel"]
WORDS = ["apples", "weather", "zebra", "pears", "plums", "today"]


class Parts:
    """A store, its retriever and its lifecycle on one data directory; reopened at will."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.open()

    def open(self) -> None:
        self.store = Store(self.path)
        self.retriever = Retriever(self.store, None)
        self.lifecycle = Lifecycle(self.store, self.retriever, Metrics(), rotation_interval=0.0)
        self.lifecycle.recover()

    def restart(self, *, save: bool = True) -> None:
        if save:
            self.lifecycle.save_snapshots_at_stop()
        self.store.close()
        self.open()

    @property
    def snapshot(self) -> Path:
        return self.path / "index" / f"{OWNER}.snapshot"


@pytest.fixture
def parts(tmp_path: Path, kek_env: str) -> Iterator[Parts]:
    p = Parts(tmp_path / "d")
    yield p
    p.store.close()


def _drafts(start: int, n: int, rng: np.random.Generator, commit: bool = True) -> list[TurnDraft]:
    out = []
    for i in range(start, start + n):
        vec = rng.standard_normal(D).astype(np.float32)
        text = f"turn {i} about {WORDS[i % 6]} and {WORDS[(i * 7) % 6]} {i % 23}"
        out.append(TurnDraft(1, "ann", text, 1.68e9 + 3000 * i, vec, "", [], commit, 3600.0))
    return out


def _append(p: Parts, thread: str, drafts: list[TurnDraft]) -> list[TurnMeta]:
    """What ``AppendTurns`` does: store the turns, hand them to the index."""
    removals = p.retriever.removals(OWNER)
    metas, _, _ = p.store.append_turns(OWNER, thread, drafts, "")
    p.retriever.on_write(OWNER, metas, None, removals)
    return metas


def _fact(p: Parts, memory_id: str, text: str) -> None:
    draft = MemoryDraft(kind="FACT", content=MemoryContent(text=text))
    view = p.store.create_memory(OWNER, memory_id, draft, commit=True, pending_ttl=3600.0)
    p.retriever.on_write(OWNER, [view.meta])


def _history(p: Parts) -> dict[str, list[TurnMeta]]:
    """Two threads of turns, pending ones, memories, a forget and a commit."""
    rng = np.random.default_rng(1)
    for thread in ("t1", "t2"):
        p.store.create_thread(OWNER, thread, "")
    t1 = _append(p, "t1", _drafts(1, 40, rng))
    t2 = _append(p, "t2", _drafts(41, 25, rng))
    pending = _append(p, "t1", _drafts(66, 6, rng, commit=False))
    _fact(p, "f1", "a fact about fennel and apples")
    _fact(p, "f2", "another fact about the zebra")
    p.retriever.owner_bundle(OWNER)  # loaded from here on: the upkeep follows
    p.lifecycle.forget(OWNER, ForgetTargets.of(turns=[("t1", 10), ("t2", 3)]))
    committed = p.store.commit_records([m.name for m in pending[1:4]], include_sources=False)
    p.retriever.on_write(OWNER, committed)
    return {"t1": t1, "t2": t2, "pending": pending}


def _docs(leg: LexicalIndex) -> dict[int, list[str]]:
    return leg.terms_of()


def _content(p: Parts) -> dict[str, Any]:
    """Everything the owner's loaded bundle holds, leg by leg, scores aside.

    BM25 scores depend on when each main segment was built; the documents and
    their terms do not.
    """
    b = p.retriever.owner_bundle(OWNER)
    probe = np.ones(D, np.float32)
    return {
        "ctx_prev": dict(b.ctx_prev),
        "versions": dict(b.versions),
        "watch": dict(b.watch),
        "plain": _docs(b.plain),
        "ctx": _docs(b.ctx),
        "dense": b.dense.search(probe, max(1, len(b.dense))),
        "sessions": b.sessions.sessions(),
        "session_terms": {r: b.sessions._unpack(c) for r, c in b.sessions._terms.items()},
        "times": {
            i: t
            for t, i in zip(
                b.times.to_state()[1]["times"].tolist(),
                b.times.to_state()[1]["ids"].tolist(),
                strict=True,
            )
        },
        "found": [
            sorted(r for r, _ in leg.search_terms(analyze(q), 500))
            for leg in (b.plain, b.ctx)
            for q in QUERIES
        ],
    }


def _scores(p: Parts) -> list[Any]:
    b = p.retriever.owner_bundle(OWNER)
    return [
        [(r, round(s, 6)) for r, s in leg.search_terms(analyze(q), 500)]
        for leg in (b.plain, b.ctx)
        for q in QUERIES
    ]


def _built(p: Parts) -> dict[str, Any]:
    """The content of a bundle built from LMDB now."""
    p.retriever.cache.evict(f"o/{OWNER}")
    p.retriever._first_use = p.retriever._timed_build  # type: ignore[method-assign]
    return _content(p)


def test_a_restart_loads_the_snapshot_and_answers_as_before(parts: Parts) -> None:
    _history(parts)
    assert parts.retriever.save_snapshot(OWNER) > 0
    before, scores = _content(parts), _scores(parts)
    assert parts.snapshot.exists()
    parts.restart(save=False)
    after = _content(parts)
    assert parts.retriever.loads == {"snapshot": 1, "replayed": 0, "built": 0}
    assert after == before
    assert _scores(parts) == scores  # the same main segments and deltas: the same scores
    assert parts.retriever.index_drift(OWNER) == 0
    assert after == _built(parts)


def test_a_build_in_groups_of_threads_and_runs_of_a_long_thread_equals_one_in_one_piece(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build indexes a few turns at a time (t1 is cut into runs): the same bundle."""
    _history(parts)
    whole = _built(parts)
    scores = _scores(parts)
    monkeypatch.setattr(_build, "BUILD_CHUNK", 7)
    assert _built(parts) == whole
    assert _scores(parts) == scores


def test_an_unchanged_snapshot_is_not_written_again(parts: Parts) -> None:
    _history(parts)
    parts.restart()
    stamp = parts.snapshot.stat().st_mtime_ns
    parts.retriever.owner_bundle(OWNER)
    assert parts.retriever.loads["snapshot"] == 1
    assert parts.retriever.save_snapshot(OWNER) == 0
    parts.restart()
    assert parts.snapshot.stat().st_mtime_ns == stamp


def test_rows_written_after_the_snapshot_are_replayed_to_a_build(parts: Parts) -> None:
    rows = _history(parts)
    parts.restart()  # the snapshot is saved at the stop
    rng = np.random.default_rng(2)
    # Written while the owner's bundle is not loaded: the snapshot does not follow.
    _append(parts, "t1", _drafts(100, 5, rng))  # after t1's last turn
    parts.store.create_thread(OWNER, "t3", "")
    _append(parts, "t3", _drafts(200, 4, rng))
    parts.store.commit_records([rows["pending"][4].name], include_sources=False)
    _fact(parts, "f3", "a third fact about plums")
    draft = MemoryDraft(kind="FACT", content=MemoryContent(text="the fennel fact, corrected"))
    parts.store.update_memory(OWNER, "f1", draft, {"text"}, 0, 3600.0)
    parts.restart(save=False)
    replayed = _content(parts)
    assert parts.retriever.loads == {"snapshot": 0, "replayed": 1, "built": 0}
    assert parts.retriever.index_drift(OWNER) == 0
    assert replayed == _built(parts)
    assert replayed["versions"][max(replayed["versions"])] == 1  # f3
    assert 2 in replayed["versions"].values()  # f1 at its new version


def test_a_forget_makes_every_earlier_snapshot_unopenable(parts: Parts, tmp_path: Path) -> None:
    rows = _history(parts)
    parts.restart()
    copy = tmp_path / "before-forget.snapshot"
    shutil.copy(parts.snapshot, copy)
    doomed = rows["t1"][5]
    # Forgotten while the bundle is not loaded: the snapshot's key goes all the same.
    parts.lifecycle.forget(OWNER, ForgetTargets.of(turns=[(doomed.thread, doomed.seq)]))
    assert not parts.snapshot.exists()
    shutil.copy(copy, parts.snapshot)  # a copy put back in place does not open
    assert parts.store.read_snapshot(OWNER) is None
    built = _content(parts)
    assert parts.retriever.loads == {"snapshot": 0, "replayed": 0, "built": 1}
    assert doomed.rid not in built["plain"]
    # The next snapshot holds nothing of the forgotten turn.
    parts.restart()
    opened = parts.store.read_snapshot(OWNER)
    assert opened is not None
    raw = bytes(opened[1])
    bundle, _, rows_seen = bundle_of(load_state(bytearray(raw)))
    assert doomed.rid not in bundle.plain.ids().tolist()
    assert doomed.rid not in rows_seen
    assert doomed.rid not in bundle.ctx_prev.values()
    assert b"turn 6 about" not in raw


def test_a_forget_of_a_loaded_owner_leaves_no_snapshot_to_open(parts: Parts) -> None:
    rows = _history(parts)
    parts.retriever.save_snapshot(OWNER)
    assert parts.snapshot.exists()
    doomed = rows["t2"][7]
    parts.lifecycle.forget(OWNER, ForgetTargets.of(turns=[(doomed.thread, doomed.seq)]))
    assert not parts.snapshot.exists()
    assert parts.retriever.snapshot_due(OWNER, 0.0)
    assert parts.retriever.save_snapshot(OWNER) > 0
    parts.restart(save=False)
    assert doomed.rid not in _content(parts)["plain"]
    assert parts.retriever.loads["snapshot"] == 1


def _race(
    p: Parts, monkeypatch: pytest.MonkeyPatch, method: str, doomed: TurnMeta
) -> Callable[..., Any]:
    """Make ``store.<method>`` run a forget of ``doomed`` first (during a save)."""
    original = getattr(p.store, method)

    def racing(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(p.store, method, original)
        if method == "stage_snapshot":
            staged = original(*args, **kwargs)
            p.lifecycle.forget(OWNER, ForgetTargets.of(turns=[(doomed.thread, doomed.seq)]))
            return staged
        p.lifecycle.forget(OWNER, ForgetTargets.of(turns=[(doomed.thread, doomed.seq)]))
        return original(*args, **kwargs)

    monkeypatch.setattr(p.store, method, racing)
    return racing


@pytest.mark.parametrize("moment", ["snapshot_rows", "stage_snapshot"])
def test_a_snapshot_saved_while_a_forget_runs_is_never_put_in_place(
    parts: Parts, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """A forget between reading the legs and the rename: the save is dropped.

    ``snapshot_rows``: after the legs were read, before the rows; the key the
    save makes then is new. ``stage_snapshot``: the snapshot is sealed and
    synced, the forget destroys its key before the rename.
    """
    rows = _history(parts)
    doomed = rows["t1"][20]
    _race(parts, monkeypatch, moment, doomed)
    assert parts.retriever.save_snapshot(OWNER) == 0
    assert not parts.snapshot.exists()
    assert not parts.snapshot.with_name("alice.snapshot.tmp").exists()
    assert parts.store.snapshot_strays() == 0  # nor the key the save made for itself
    assert parts.retriever.save_snapshot(OWNER) > 0  # the next one holds the forget
    parts.restart(save=False)
    assert doomed.rid not in _content(parts)["plain"]


def test_a_snapshot_whose_vectors_change_while_they_are_sealed_is_dropped(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write to the vector leg between two pieces of its vectors abandons the save.

    The vectors are copied a piece at a time as they are sealed: no file, no
    temporary file is left.
    """
    _history(parts)
    bundle = parts.retriever.owner_bundle(OWNER)
    original = parts.store.stage_snapshot

    def staging(owner: str, size: int, chunks: Iterable[Any]) -> Any:
        def racing() -> Iterator[Any]:
            stream = iter(chunks)
            yield next(stream)  # the container's header: the vectors come next
            bundle.dense.remove([bundle.dense.ids()[0]])
            yield from stream

        monkeypatch.setattr(parts.store, "stage_snapshot", original)
        return original(owner, size, racing())

    monkeypatch.setattr(parts.store, "stage_snapshot", staging)
    assert parts.retriever.save_snapshot(OWNER) == 0
    assert not parts.snapshot.exists()
    assert not parts.snapshot.with_name("alice.snapshot.tmp").exists()
    assert parts.store.snapshot_strays() == 0  # nor the key the save made for itself


def test_a_first_snapshot_that_fails_to_write_leaves_no_key(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk as the temporary file is synced: the error reaches the caller; no key stays."""
    import os

    _history(parts)
    parts.retriever.owner_bundle(OWNER)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="injected"):
        parts.retriever.save_snapshot(OWNER)
    monkeypatch.undo()
    assert not parts.snapshot.exists()
    assert parts.store.snapshot_strays() == 0  # the key the save made went with it
    assert parts.retriever.save_snapshot(OWNER) > 0  # the next pass saves


def test_a_staged_snapshot_keeps_its_key_from_another_save_dropping_it(parts: Parts) -> None:
    """Between a save's staging and its rename, a failed save's key drop leaves the key."""
    _history(parts)
    payload = b"x" * 1000
    staged = parts.store.stage_snapshot(OWNER, len(payload), [payload])
    assert not parts.store.drop_unused_snapshot_key(OWNER)  # the temporary file holds it
    assert staged.publish()
    assert parts.snapshot.exists()
    assert parts.store.snapshot_strays() == 0
    assert not parts.store.drop_unused_snapshot_key(OWNER)  # now the file in place does


def test_a_full_store_still_destroys_an_unused_snapshot_key(tmp_path: Path, kek_env: str) -> None:
    """At the store's ceiling, the drop of a key no snapshot uses goes on (it only deletes)."""
    from server.errors import StoreFull

    store = Store(tmp_path / "full", max_size=4 << 20)
    try:
        rng = np.random.default_rng(5)
        store.create_thread(OWNER, "t1", "")
        store.append_turns(OWNER, "t1", _drafts(0, 5, rng), "")
        staged = store.stage_snapshot(OWNER, 10, [b"0123456789"])
        staged.discard()  # a first save that put nothing in place: its key is unused
        big = [TurnDraft(1, "ann", "x" * 60_000, 1.7e9, None, "", [], True, 3600.0)] * 50
        full = None
        for _ in range(100):  # 3 MB a batch: the 4 MiB ceiling within a few
            try:
                store.append_turns(OWNER, "t1", big, "")
            except StoreFull as exc:
                full = exc
                break
        assert full is not None
        assert store.snapshot_strays() == 1
        assert store.drop_unused_snapshot_key(OWNER)
        assert store.snapshot_strays() == 0
    finally:
        store.close()


def test_a_snapshot_of_rows_a_restore_rolled_back_is_replayed(parts: Parts, tmp_path: Path) -> None:
    """Record numbers come back after a restore; the snapshot's rows do not pass for them."""
    from shredder import backup_environment, restore_environment

    _history(parts)
    backup = tmp_path / "backup"
    backup_environment(parts.path / "data", backup, parts.store.store_id, env=parts.store.env)
    rng = np.random.default_rng(3)
    gone = _append(parts, "t2", _drafts(300, 5, rng))  # after the backup: rolled back
    parts.retriever.save_snapshot(OWNER)
    parts.store.close()
    restore_environment(backup, parts.path / "data", parts.store.store_id)
    parts.open()
    again = _append(parts, "t1", [*_drafts(400, 5, rng)])  # the same record numbers
    assert [m.rid for m in again] == [m.rid for m in gone]
    replayed = _content(parts)
    assert parts.retriever.loads == {"snapshot": 0, "replayed": 1, "built": 0}
    assert replayed == _built(parts)
    assert not any("300" in " ".join(t) for t in replayed["plain"].values())


def test_a_snapshot_of_another_embedder_is_not_used(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    _history(parts)
    parts.restart()
    monkeypatch.setattr(parts.store, "owner_embedder", lambda owner: "another-model")
    parts.retriever.owner_bundle(OWNER)
    assert parts.retriever.loads == {"snapshot": 0, "replayed": 0, "built": 1}


def test_a_damaged_snapshot_is_rebuilt(parts: Parts) -> None:
    _history(parts)
    parts.restart()
    raw = bytearray(parts.snapshot.read_bytes())
    raw[100] ^= 0xFF
    parts.snapshot.write_bytes(bytes(raw))
    content = _content(parts)
    assert parts.retriever.loads == {"snapshot": 0, "replayed": 0, "built": 1}
    assert not parts.snapshot.exists()
    assert content == _built(parts)


def test_a_snapshot_that_fails_to_load_never_fails_the_search(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    _history(parts)
    parts.restart()

    def broken(owner: str) -> dict[int, int]:
        raise OSError(5, "injected read error")

    monkeypatch.setattr(parts.store, "row_digests", broken)
    content = _content(parts)
    assert parts.retriever.loads == {"snapshot": 0, "replayed": 0, "built": 1}
    assert not parts.snapshot.exists()
    assert content == _built(parts)


def test_start_up_removes_stray_snapshots_and_the_audit_counts_them(parts: Parts) -> None:
    _history(parts)
    parts.restart()
    stray = parts.snapshot.with_name("alice.snapshot.tmp")
    stray.write_bytes(b"a write cut short")
    parts.lifecycle.periodic_audit()
    assert parts.lifecycle.metrics.index_snapshot_strays._value.get() == 1
    recovery = parts.lifecycle.recover()
    assert recovery.stray_snapshots_removed == 1
    assert recovery.changed()
    assert "1 stray index snapshots removed" in recovery.summary()
    assert not stray.exists()
    assert parts.snapshot.exists()
    parts.lifecycle.periodic_audit()
    assert parts.lifecycle.metrics.index_snapshot_strays._value.get() == 0


def test_a_snapshot_ranked_with_other_bm25_parameters_is_not_used(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    import server.retrieval._snapshot as snapshot

    _history(parts)
    parts.restart()

    class Retuned(LexicalIndex):
        def __init__(self, k1: float = 1.5, b: float = 0.4) -> None:
            super().__init__(k1, b)

    monkeypatch.setattr(snapshot, "LexicalIndex", Retuned)  # a version with another k1
    parts.retriever.owner_bundle(OWNER)
    assert parts.retriever.loads == {"snapshot": 0, "replayed": 0, "built": 1}
