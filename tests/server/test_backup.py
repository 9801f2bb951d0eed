"""Backup → forget → restore beside the keystore: the forgotten thread stays forgotten.

The rest comes back intact.
"""

from __future__ import annotations

import stat
from pathlib import Path

import grpc
from _helpers import (
    append,
    create_thread,
    expect_error,
    forget,
    get_turn,
    list_texts,
    run_cli,
    search_texts,
    unique,
)
from conftest import Lethe

from lethe.v1 import threads_pb2

NOT_FOUND = grpc.StatusCode.NOT_FOUND


def test_restore_after_forget_keeps_forgotten_thread_unreadable(
    lethe: Lethe, tmp_path: Path
) -> None:
    c = lethe.client("alice")
    doomed = create_thread(c, "alice", title=unique("doomed"))
    kept = create_thread(c, "alice", title="kept")
    doomed_texts = [f"doomed {unique()}" for _ in range(3)]
    kept_texts = [f"kept {unique()}" for _ in range(3)]
    doomed_turns = append(c, doomed, doomed_texts, commit=True)
    kept_turns = append(c, kept, kept_texts, commit=True)

    out = tmp_path / "backup"
    assert run_cli(["backup", "--data", str(lethe.data_dir), "--out", str(out)]) == 0
    forget(c, doomed)
    lethe.stop()
    assert run_cli(["restore", "--backup", str(out), "--data", str(lethe.data_dir)]) == 0
    lethe.start()
    c = lethe.client("alice")

    for turn in doomed_turns:
        err = expect_error(
            c.threads.GetTurn,
            threads_pb2.GetTurnRequest(name=turn.name),
            c.md,
            NOT_FOUND,
            "RECORD_DELETED",
        )
        assert err.code() == NOT_FOUND
    expect_error(
        c.threads.GetThread,
        threads_pb2.GetThreadRequest(name=doomed),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )
    for text in doomed_texts:
        assert text not in search_texts(c, "alice", text)

    assert list_texts(c, kept) == kept_texts
    for turn, text in zip(kept_turns, kept_texts, strict=True):
        assert get_turn(c, turn.name).text == text
        assert text in search_texts(c, "alice", text)
    assert c.threads.GetThread(
        threads_pb2.GetThreadRequest(name=kept), metadata=tuple(c.md)
    ).title == ("kept")
    listed = c.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent="owners/alice"), metadata=tuple(c.md)
    )
    assert [t.name for t in listed.threads] == [kept]


def test_restore_after_forgetting_one_turn_keeps_that_turn_unreadable(
    lethe: Lethe, tmp_path: Path
) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    texts = [f"line {i} {unique()}" for i in range(3)]
    turns = append(c, thread, texts, commit=True)
    out = tmp_path / "backup"
    assert run_cli(["backup", "--data", str(lethe.data_dir), "--out", str(out)]) == 0
    forget(c, turns[1].name)
    lethe.stop()
    assert run_cli(["restore", "--backup", str(out), "--data", str(lethe.data_dir)]) == 0
    lethe.start()
    c = lethe.client("alice")
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=turns[1].name),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )
    assert list_texts(c, thread) == [texts[0], texts[2]]
    assert texts[1] not in search_texts(c, "alice", texts[1])
    assert texts[0] in search_texts(c, "alice", texts[0])


def test_backup_into_data_dir_is_refused(lethe: Lethe) -> None:
    out = lethe.data_dir / "inside"
    assert run_cli(["backup", "--data", str(lethe.data_dir), "--out", str(out)]) == 2
    assert not (out / "data.mdb").exists()


def test_backup_files_are_private(lethe: Lethe, tmp_path: Path) -> None:
    c = lethe.client("alice")
    create_thread(c, "alice", "t1")
    out = tmp_path / "backup"
    assert run_cli(["backup", "--data", str(lethe.data_dir), "--out", str(out)]) == 0
    for name in ("data.mdb", "MANIFEST.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600
