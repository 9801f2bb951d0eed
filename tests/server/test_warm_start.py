"""Warm starts through the real server: a restart answers from the owner's snapshot.

The server writes the snapshots of loaded owners at a clean stop and, with a
sweeper, once an owner's writes settle; a restart's first search loads the
snapshot and answers exactly as before; a snapshot is never in a backup.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _helpers import append, create_thread, forget, run_cli, unique
from conftest import Client, Lethe

from lethe.v1 import retrieval_pb2

MODES = (
    retrieval_pb2.SearchRequest.HYBRID,
    retrieval_pb2.SearchRequest.LEXICAL,
    retrieval_pb2.SearchRequest.DENSE,
)


def _answers(c: Client, queries: list[str]) -> list[list[tuple[str, float]]]:
    out = []
    for mode in MODES:
        for q in queries:
            got = c.search("owners/alice", query_text=q, top_k=20, mode=mode)
            out.append([(h.turn.name or h.memory.name, round(h.score, 5)) for h in got.hits])
    return out


def _filled(lethe: Lethe) -> tuple[Client, list[str], list[str]]:
    c = lethe.client("alice")
    texts = [f"we talked about {w} {unique()}" for w in ("sailing", "violins", "orchards")]
    for tid in ("t1", "t2"):
        thread = create_thread(c, "alice", tid)
        names = [t.name for t in append(c, thread, texts, commit=True)]
    return c, texts, names


def test_a_restart_answers_from_the_snapshot_exactly_as_before(lethe: Lethe) -> None:
    c, texts, _ = _filled(lethe)
    queries = [*texts, "sailing", "violins orchards"]
    before = _answers(c, queries)
    lethe.restart()
    snapshot = lethe.data_dir / "index" / "alice.snapshot"
    assert snapshot.exists()
    c = lethe.client("alice")
    assert _answers(c, queries) == before
    assert lethe.server is not None
    assert lethe.server.retriever.loads == {"snapshot": 1, "replayed": 0, "built": 0}


def test_a_forgotten_turn_stays_out_of_a_warm_restart(lethe: Lethe) -> None:
    c, texts, names = _filled(lethe)
    c.search("owners/alice", query_text="sailing")  # loaded
    lethe.restart()  # a snapshot holding the turn
    c = lethe.client("alice")
    forget(c, names[0])
    assert not (lethe.data_dir / "index" / "alice.snapshot").exists()
    lethe.restart()
    c = lethe.client("alice")
    hits = c.search("owners/alice", query_text=texts[0], top_k=20).hits
    assert names[0] not in [h.turn.name for h in hits]
    assert lethe.server is not None
    assert lethe.server.lifecycle.audit("alice").index_drift == 0


def _waits_for(check: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_the_sweeper_writes_the_snapshot_once_writes_settle(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    lethe = lethe_at(tmp_path / "d", sweep_interval=0.1)  # settles after 10 sweeps: 1 s
    c, _, _ = _filled(lethe)
    c.search("owners/alice", query_text="sailing")
    snapshot = tmp_path / "d" / "index" / "alice.snapshot"
    assert _waits_for(snapshot.exists, 30.0)
    written = snapshot.stat().st_mtime_ns
    time.sleep(1.5)
    assert snapshot.stat().st_mtime_ns == written  # unchanged: not written again


def test_a_backup_carries_no_snapshot(lethe: Lethe, tmp_path: Path) -> None:
    c, _, _ = _filled(lethe)
    c.search("owners/alice", query_text="sailing")
    lethe.restart()
    assert (lethe.data_dir / "index" / "alice.snapshot").exists()
    out = tmp_path / "backup"
    assert run_cli(["backup", "--data", str(lethe.data_dir), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["MANIFEST.json", "data.mdb"]


def _opens_snapshot(data_dir: Path, kek_file: Path) -> bool:
    """Whether a copy of a data directory (keystore included) opens alice's snapshot in it."""
    from server import Store

    store = Store(data_dir, kek_file=kek_file, lock=False)
    try:
        return store.read_snapshot("alice") is not None
    except Exception:
        return False
    finally:
        store.close()


def test_rotation_makes_a_pre_forget_copy_of_a_snapshot_useless(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As tests/server/test_rotation.py for a turn, for the index snapshot.

    A copy of the whole directory (snapshot and keystore) taken before a
    forget still opens the snapshot with the live KEK until the next rotation,
    and never after it; the live directory holds none from before the forget.
    """
    monkeypatch.delenv("LETHE_KEK", raising=False)
    kek_file = tmp_path / "config" / "kek.json"
    data = tmp_path / "d"
    lethe = Lethe(data, kek_file=kek_file)
    try:
        c, _, names = _filled(lethe)
        c.search("owners/alice", query_text="sailing")
        lethe.stop()  # writes the snapshot
        copy = tmp_path / "copy"
        shutil.copytree(data, copy, ignore=shutil.ignore_patterns("lethe.lock"))
        assert _opens_snapshot(copy, kek_file)
        lethe.start()
        forget(lethe.client("alice"), names[0])
        lethe.stop()
        assert not (data / "index" / "alice.snapshot").exists()
        assert _opens_snapshot(copy, kek_file)  # the gap rotation closes
        assert run_cli(["rotate", "--data", str(data), "--kek-file", str(kek_file)]) == 0
        assert not _opens_snapshot(copy, kek_file)
    finally:
        lethe.stop()
