"""Rotation completes a shred against forensic reads.

A copy of the keystore taken before a forget (as a free page or a snapshot
would keep it) opens the forgotten turn before rotation, and nothing after it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _helpers import append, create_thread, forget, run_cli
from conftest import Lethe

from lethe.v1 import threads_pb2
from server import Store


def _read_forgotten(data_dir: Path, kek_file: Path, seq: int) -> str | None:
    """Open turn ``seq`` of alice/t1 straight from a copy of the store's files."""
    store = Store(data_dir, kek_file=kek_file, lock=False)
    try:
        metas = [m for m in store.thread_turns("alice", "t1") if m.seq == seq]
        if not metas:
            return None
        rows = store.fetch([metas[0].rid])
        meta, cts = rows[metas[0].rid]
        try:
            return store.turn_view(meta, cts, with_embedding=False).text  # type: ignore[arg-type]
        except Exception:
            return None
    finally:
        store.close()


def test_rotation_makes_a_pre_forget_copy_useless(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LETHE_KEK", raising=False)
    kek_file = tmp_path / "config" / "kek.json"
    data = tmp_path / "d"
    lethe = Lethe(data, kek_file=kek_file)
    try:
        c = lethe.client("alice")
        thread = create_thread(c, "alice", "t1")
        turns = append(c, thread, ["the forensic plant is fennelwick", "kept"], commit=True)
        lethe.stop()
        copy = tmp_path / "copy"  # the whole directory as it was before the forget
        shutil.copytree(data, copy, ignore=shutil.ignore_patterns("lethe.lock"))
        lethe.start()
        c = lethe.client("alice")
        receipt = forget(c, turns[0].name)
        assert receipt.HasField("shred_horizon_time")
        lethe.stop()
        # Before rotation: the old copy opens with the live KEK (the gap rotation closes).
        assert _read_forgotten(copy, kek_file, 1) == "the forensic plant is fennelwick"
        assert run_cli(["rotate", "--data", str(data), "--kek-file", str(kek_file)]) == 0
        assert _read_forgotten(copy, kek_file, 1) is None
        lethe.start()
        c = lethe.client("alice")
        listed = c.threads.ListTurns(
            threads_pb2.ListTurnsRequest(parent=thread),
            metadata=tuple(c.md),
        )
        assert [t.text for t in listed.turns] == ["kept"]
    finally:
        lethe.stop()


def test_rotate_refuses_while_the_server_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LETHE_KEK", raising=False)
    kek_file = tmp_path / "config" / "kek.json"
    lethe = Lethe(tmp_path / "d", kek_file=kek_file)
    try:
        assert run_cli(["rotate", "--data", str(tmp_path / "d"), "--kek-file", str(kek_file)]) == 2
    finally:
        lethe.stop()
