"""The change log and indexes that follow it: several processes over one data directory.

A store opened ``shared`` (``lethe serve --processes N``'s processes) keeps a
change log; a ``Retriever`` over it applies the log instead of its own upkeep.
Tested on real stores (LMDB, keystore) in this process and in a second real
process: what one process writes or forgets is in the other's indexes before
its next search, a forgotten record leaves the other's loaded indexes within
the follower's interval without any search, and the followed indexes equal a
build from LMDB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from index import analyze
from server._metrics import Metrics
from server.lifecycle import Lifecycle
from server.retrieval import Retriever
from server.store import ForgetTargets, Store, StoreLockedError, TurnDraft, TurnMeta, _changes
from server.store._store import acquire_primary

OWNER, THREAD, D = "alice", "t1", 16
QUERIES = ["turn about apples", "the weather today", "zebra 17", "quixotic"]


def _drafts(start: int, n: int, rng: np.random.Generator, commit: bool = True) -> list[TurnDraft]:
    words = ["apples", "weather", "zebra", "pears", "plums", "today"]
    out = []
    for i in range(start, start + n):
        vec = rng.standard_normal(D).astype(np.float32)
        text = f"turn {i} about {words[i % 6]} and {words[(i * 7) % 6]} {i % 23}"
        out.append(TurnDraft(1, "ann", text, None, vec, "", [], commit, 3600.0))
    return out


def _legs(retriever: Retriever) -> tuple[Any, ...]:
    """What the owner's bundle holds, leg by leg (quotes, lexical matches, vectors, legs' sizes).

    Lexical matches by id, not score: a BM25 leg scores its main segment with the
    statistics of its last rebuild (:mod:`index._lexical`), so an index that
    grew scores a little differently from one just built.
    """
    b = retriever.owner_bundle(OWNER)
    lex = tuple(
        tuple(sorted(r for r, _ in leg.search_terms(analyze(q), 500)))
        for leg in (b.plain, b.ctx)
        for q in QUERIES
    )
    ids = b.dense.ids()
    scores = b.dense.search(np.ones(D, np.float32), len(ids))
    return (
        sorted(b.ctx_prev.items()),
        lex,
        sorted(ids.tolist()),
        sorted((int(r), round(float(s), 4)) for r, s in scores),
        len(b.sessions),
        len(b.times),
    )


def _rebuilt(retriever: Retriever) -> tuple[Any, ...]:
    retriever.cache.evict(f"o/{OWNER}")
    return _legs(retriever)


@pytest.fixture
def shared(tmp_path: Path, kek_env: str) -> Iterator[tuple[Store, Retriever, Lifecycle]]:
    store = Store(tmp_path / "d", shared=True)
    retriever = Retriever(store, None)
    yield store, retriever, Lifecycle(store, retriever, Metrics(), rotation_interval=0.0)
    retriever.stop_following()
    store.close()


def test_the_directory_lock_is_shared_among_shared_stores_only(
    tmp_path: Path, kek_env: str
) -> None:
    first = Store(tmp_path / "d", shared=True)
    try:
        assert first.primary
        assert first.change_log
        with pytest.raises(StoreLockedError):
            Store(tmp_path / "d")  # one process alone: refused beside a shared one
        assert acquire_primary(first.data_dir) is None  # the role is held
    finally:
        first.close()
    fd = acquire_primary(tmp_path / "d")  # released with the store: a standby takes over
    assert fd is not None
    alone = Store(tmp_path / "d")
    try:
        assert alone.primary
        assert not alone.change_log
        alone.create_thread(OWNER, THREAD, "")
        alone.append_turns(OWNER, THREAD, _drafts(1, 3, np.random.default_rng(0)), "")
        assert alone.change_seq(OWNER) == 0  # one process keeps no log
    finally:
        alone.close()


def test_each_write_transaction_logs_the_rows_it_changed(
    shared: tuple[Store, Retriever, Lifecycle], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _, lifecycle = shared
    store.create_thread(OWNER, THREAD, "")
    metas, _, _ = store.append_turns(OWNER, THREAD, _drafts(1, 5, np.random.default_rng(0)), "")
    seq = store.change_seq(OWNER)
    assert seq == 1
    assert store.changes_since(OWNER, 0) == (1, {m.rid for m in metas})
    assert store.changes_since(OWNER, 1) == (1, set())
    lifecycle.forget(OWNER, ForgetTargets.of(turns=[(THREAD, 2)]))
    last, rids = store.changes_since(OWNER, seq)
    assert rids is not None
    assert metas[1].rid in rids
    assert last > seq
    assert store.owners_changed_since(0) == (last, {OWNER})
    lifecycle.forget(OWNER, ForgetTargets.of(threads=[THREAD]))
    assert store.changes_since(OWNER, last)[1] is None  # a whole thread: load again
    monkeypatch.setattr(_changes, "KEEP", 3)
    store.create_thread(OWNER, "t2", "")
    for i in range(5):
        store.append_turns(OWNER, "t2", _drafts(10 + i, 1, np.random.default_rng(i)), "")
    now = store.change_seq(OWNER)
    assert store.changes_since(OWNER, now - 3)[1] is not None
    assert store.changes_since(OWNER, now - 4)[1] is None  # no longer kept: load again


def test_followed_indexes_equal_a_build_from_lmdb(
    shared: tuple[Store, Retriever, Lifecycle],
) -> None:
    store, retriever, lifecycle = shared
    rng = np.random.default_rng(1)
    store.create_thread(OWNER, THREAD, "")
    store.append_turns(OWNER, THREAD, _drafts(1, 30, rng), "")
    retriever.owner_bundle(OWNER)
    for start, n in ((31, 40), (76, 10)):
        metas, _, _ = store.append_turns(OWNER, THREAD, _drafts(start, n, rng), "")
        retriever.on_write(OWNER, metas)
    pending, _, _ = store.append_turns(OWNER, THREAD, _drafts(71, 5, rng, commit=False), "")
    lifecycle.forget(OWNER, ForgetTargets.of(turns=[(THREAD, 80)]))
    store.append_turns(OWNER, THREAD, _drafts(86, 7, rng), "")  # no upkeep call: the log
    store.commit_records([m.name for m in pending[1:4]], include_sources=False)
    followed = _legs(retriever)
    assert len(followed[2]) == 30 + 40 + 10 - 1 + 7 + 3
    assert retriever.index_drift(OWNER) == 0
    assert followed == _rebuilt(retriever)


_OTHER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[2])
    from pathlib import Path
    from index import analyze
    from server.retrieval import Retriever
    from server.store import Store
    from test_change_log import OWNER, _legs, _rebuilt

    store = Store(Path(sys.argv[1]), shared=True)
    retriever = Retriever(store, None)
    retriever.follow(0.1)
    print(json.dumps({"primary": store.primary}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        if ask["do"] == "legs":
            legs = _legs(retriever)
            again = _rebuilt(retriever)
            out = {"legs": legs, "rebuilt": again == legs}
        elif ask["do"] == "held":  # what memory holds now, without a search catching up
            b = retriever.cache.peek(f"o/{OWNER}")
            rid = ask["rid"]
            out = {
                "loaded": b is not None,
                "dense": b is not None and rid in b.dense.ids().tolist(),
                "text": b is not None and (rid in b.plain or rid in b.ctx),
                "found": b is not None and bool(b.plain.search_terms(analyze(ask["q"]), 10)),
            }
        else:
            break
        print(json.dumps(out, default=list), flush=True)
    retriever.stop_following()
    store.close()
    """
)


class _Other:
    """A second real process with the same data directory open, its own indexes following."""

    def __init__(self, data_dir: Path) -> None:
        here = str(Path(__file__).parent)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _OTHER, str(data_dir), here],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.hello = self._read()

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the other process ended"
        return json.loads(line)

    def ask(self, **what: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(what) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


def test_another_process_sees_each_write_and_forget_before_its_next_search(
    shared: tuple[Store, Retriever, Lifecycle],
) -> None:
    store, retriever, lifecycle = shared
    rng = np.random.default_rng(4)
    store.create_thread(OWNER, THREAD, "")
    store.append_turns(OWNER, THREAD, _drafts(1, 30, rng), "")
    other = _Other(store.data_dir)
    try:
        assert other.hello == {"primary": False}  # this process holds the role
        first = other.ask(do="legs")
        assert len(first["legs"][2]) == 30
        assert first["rebuilt"]
        drafts = _drafts(31, 10, rng)
        drafts[3].text = "the quixotic zebra password"
        metas, _, _ = store.append_turns(OWNER, THREAD, drafts, "")
        retriever.on_write(OWNER, metas)
        secret = metas[3]
        after_write = other.ask(do="legs")  # asked at once: no waiting for the follower
        assert len(after_write["legs"][2]) == 40
        assert after_write["rebuilt"]
        assert after_write["legs"] == json.loads(json.dumps(_legs(retriever), default=list))
        assert other.ask(do="held", rid=secret.rid, q="quixotic")["found"]
        lifecycle.forget(OWNER, ForgetTargets.of(turns=[(THREAD, secret.seq)]))
        after_forget = other.ask(do="legs")
        assert len(after_forget["legs"][2]) == 39
        assert after_forget["rebuilt"]
        assert all(secret.rid not in leg for leg in after_forget["legs"][1])
        # Without a search: the follower drops a forgotten turn from memory within its bound.
        gone: TurnMeta = metas[6]
        lifecycle.forget(OWNER, ForgetTargets.of(turns=[(THREAD, gone.seq)]))
        time.sleep(0.1 * 5)
        held = other.ask(do="held", rid=gone.rid, q="quixotic")
        assert held == {"loaded": True, "dense": False, "text": False, "found": False}
    finally:
        other.close()


def test_the_follower_drops_pending_bundles_and_forgets_owners_no_longer_loaded(
    shared: tuple[Store, Retriever, Lifecycle],
) -> None:
    store, retriever, _ = shared
    rng = np.random.default_rng(5)
    store.create_thread(OWNER, THREAD, "")
    store.append_turns(OWNER, THREAD, _drafts(1, 3, rng), "")
    retriever.owner_bundle(OWNER)
    retriever.pending_bundle(OWNER, THREAD)
    assert retriever.follow_once() == [OWNER]
    assert retriever.cache.peek(f"p/{OWNER}/{THREAD}") is not None  # nothing new since
    store.append_turns(OWNER, THREAD, _drafts(4, 2, rng, commit=False), "")
    assert retriever.follow_once() == [OWNER]
    assert retriever.cache.peek(f"p/{OWNER}/{THREAD}") is None  # rebuilt on its next use
    assert OWNER in retriever._applied
    retriever.cache.evict(f"o/{OWNER}")
    assert retriever.follow_once() == []
    assert OWNER not in retriever._applied  # nothing of it loaded: nothing noted
    assert OWNER not in retriever._pending_seen


def test_a_snapshot_saved_while_another_process_forgets_is_never_put_in_place(
    shared: tuple[Store, Retriever, Lifecycle], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forget through another process between a save's rows and its rename: dropped.

    The forget destroys no snapshot key (there was no snapshot yet) and returns;
    the save then makes a new key and must not put the forgotten turn in place
    under it.
    """
    store, retriever, _ = shared
    other = Retriever(store, None)  # another process's indexes over the same data
    forgetter = Lifecycle(store, other, Metrics(), rotation_interval=0.0)
    store.create_thread(OWNER, THREAD, "")
    metas, _, _ = store.append_turns(OWNER, THREAD, _drafts(1, 30, np.random.default_rng(5)), "")
    retriever.owner_bundle(OWNER)
    doomed = metas[5]
    original = store.snapshot_rows

    def racing(owner: str, sink: Any) -> dict[int, int]:
        digests = original(owner, sink)
        monkeypatch.setattr(store, "snapshot_rows", original)
        forgetter.forget(OWNER, ForgetTargets.of(turns=[(THREAD, doomed.seq)]))
        return digests

    monkeypatch.setattr(store, "snapshot_rows", racing)
    assert retriever.save_snapshot(OWNER) == 0
    assert not store.has_snapshot(OWNER)
    assert retriever.save_snapshot(OWNER) > 0  # the next one holds the forget
    assert doomed.rid not in retriever.owner_bundle(OWNER).plain


def test_a_standby_store_never_takes_the_primary_role(tmp_path: Path, kek_env: str) -> None:
    """A member joining a running group (``--standby``) leaves the role free even if it is."""
    standby = Store(tmp_path / "d", shared=True, standby=True)
    try:
        assert not standby.primary
        assert standby.change_log
        fd = acquire_primary(standby.data_dir)  # still free for a group's new primary
        assert fd is not None
        os.close(fd)
    finally:
        standby.close()
