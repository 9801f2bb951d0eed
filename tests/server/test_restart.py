"""Restart and expiry: committed data survive a restart; pending expiry holds on every read.

Committed data are searchable after a restart (indexes rebuilt from LMDB);
pending expiry holds on every read, with or without the sweeper, across
restarts.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from _helpers import (
    append,
    create_thread,
    expect_error,
    get_turn,
    list_texts,
    open_data_env,
    rid_of,
    search_texts,
    unique,
)
from conftest import Lethe

from lethe.v1 import common_pb2, lifecycle_pb2, threads_pb2

NOT_FOUND = grpc.StatusCode.NOT_FOUND


def test_committed_turns_survive_restart_and_are_searchable(lethe: Lethe) -> None:
    c = lethe.client("alice")
    title = f"title {unique()}"
    thread = create_thread(c, "alice", title=title)
    texts = [f"remember {unique()}" for _ in range(3)]
    turns = append(c, thread, texts, commit=True, speaker="ana")
    assert texts[0] in search_texts(c, "alice", texts[0])  # index loaded before restart
    lethe.restart()
    c = lethe.client("alice")
    for text in texts:
        assert search_texts(c, "alice", text)[0] == text
    assert list_texts(c, thread) == texts
    got = get_turn(c, turns[1].name)
    assert (got.text, got.speaker, got.state) == (texts[1], "ana", common_pb2.COMMITTED)
    t = c.threads.GetThread(threads_pb2.GetThreadRequest(name=thread), metadata=tuple(c.md))
    assert (t.title, t.last_seq) == (title, 3)
    # Appending continues the numbering.
    (nxt,) = append(c, thread, ["after restart"], commit=True)
    assert nxt.seq == 4


def test_forgotten_turn_stays_forgotten_after_restart(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    texts = [f"x {unique()}", f"y {unique()}"]
    turns = append(c, thread, texts, commit=True)
    c.lifecycle.Forget(lifecycle_pb2.ForgetRequest(names=[turns[0].name]), metadata=tuple(c.md))
    lethe.restart()
    c = lethe.client("alice")
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=turns[0].name),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )
    assert texts[0] not in search_texts(c, "alice", texts[0])
    assert list_texts(c, thread) == [texts[1]]


def test_expired_pending_turn_is_unreadable_after_restart_without_sweeper(lethe: Lethe) -> None:
    assert lethe.config.get("sweep_interval", 0.0) == 0.0
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    short = f"short lived {unique()}"
    long = f"long lived {unique()}"
    started = time.time()
    (t_short,) = append(c, thread, [short], ttl=1.0)
    (t_long,) = append(c, thread, [long], ttl=600)
    assert search_texts(c, "alice", short, thread=thread, include_pending=True)[0] == short
    lethe.restart()
    c = lethe.client("alice")
    time.sleep(max(0.0, started + 1.2 - time.time()))
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=t_short.name),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )
    assert list_texts(c, thread) == [long]
    found = search_texts(c, "alice", short, thread=thread, include_pending=True)
    assert short not in found
    assert long in found
    assert get_turn(c, t_long.name).state == common_pb2.PENDING
    # An expired turn can no longer be committed.
    expect_error(
        c.lifecycle.Commit,
        lifecycle_pb2.CommitRequest(names=[t_short.name]),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )


def test_expired_pending_turn_is_unreadable_before_any_sweep(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    text = f"fleeting {unique()}"
    (turn,) = append(c, thread, [text], ttl=0.5)
    assert get_turn(c, turn.name).text == text
    time.sleep(0.7)
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=turn.name),
        c.md,
        NOT_FOUND,
        "RECORD_DELETED",
    )
    assert list_texts(c, thread) == []
    assert search_texts(c, "alice", text, thread=thread, include_pending=True) == []


def test_sweeper_tombstones_and_purges_expired_pending_turn(tmp_path: Path, kek_env: str) -> None:
    server = Lethe(tmp_path / "d", sweep_interval=0.2)
    try:
        c = server.client("alice")
        thread = create_thread(c, "alice", thread_id="swept")
        text = f"swept away {unique()}"
        kept = f"committed {unique()}"
        (turn,) = append(c, thread, [text], ttl=0.5)
        (keep,) = append(c, thread, [kept], commit=True)
        assert server.server is not None
        store = server.server.store
        deadline = time.time() + 2.5
        while time.time() < deadline and store.expired(time.time() + 3600):
            time.sleep(0.05)
        expect_error(
            c.threads.GetTurn,
            threads_pb2.GetTurnRequest(name=turn.name),
            c.md,
            NOT_FOUND,
            "RECORD_DELETED",
        )
        assert get_turn(c, keep.name).text == kept
        server.stop()
        env = open_data_env(server.data_dir)
        try:
            payloads, turns_db = env.open_db(b"payloads"), env.open_db(b"turns")
            tombstones = env.open_db(b"tombstones")
            keep_rid = rid_of(env, "alice", "swept", 2)
            with env.begin() as txn:
                # Turn 1 is purged: its seq row, metadata and ciphertext are gone.
                seqs = env.open_db(b"seqs", txn=txn, create=False)
                seq1 = b"alice\x00swept\x00" + (1).to_bytes(8, "big")
                assert txn.get(seq1, db=seqs) is None
                assert txn.get(turn.name.encode(), db=tombstones) is not None
                rids = [k for k in txn.cursor(db=turns_db).iternext(values=False)]
                assert rids == [keep_rid]
                keys = list(txn.cursor(db=payloads).iternext(values=False))
                assert keys
                assert all(k[:8] == keep_rid for k in keys)
        finally:
            env.close()
    finally:
        server.stop()
