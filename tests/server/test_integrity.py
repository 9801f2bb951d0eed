"""Stored ciphertext that fails authentication while its key exists answers DATA_LOSS / INTEGRITY.

White-box: the data environment is edited directly while the server is stopped.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import lmdb
from _helpers import append, create_thread, expect_error, get_turn, open_data_env, rid_of
from conftest import Lethe

from lethe.v1 import common_pb2, threads_pb2

DATA_LOSS = grpc.StatusCode.DATA_LOSS
CONTENT = b"c"  # payload code of a turn's content (speaker and text)
EMBEDDING = b"e"


# Edits the stopped data environment: (write txn, payloads db, {seq: record key}).
Edit = Callable[["lmdb.Transaction[bytes]", "lmdb._Database", dict[int, bytes]], None]


def _two_turns(lethe: Lethe) -> list[threads_pb2.Turn]:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", thread_id="t1")
    turns = append(
        c, thread, ["first turn text", "second turn text"], commit=True, speaker="someone"
    )
    lethe.stop()
    return turns


def _edit(lethe: Lethe, fn: Edit) -> None:
    env = open_data_env(lethe.data_dir)
    try:
        payloads = env.open_db(b"payloads")
        rids = {seq: rid_of(env, "alice", "t1", seq) for seq in (1, 2)}
        with env.begin(write=True) as txn:
            fn(txn, payloads, rids)
    finally:
        env.close()
    lethe.start()


def test_ciphertext_copied_onto_another_turn_fails_integrity(lethe: Lethe) -> None:
    turns = _two_turns(lethe)

    def swap(
        txn: lmdb.Transaction[bytes], payloads: lmdb._Database, rids: dict[int, bytes]
    ) -> None:
        r1, r2 = rids[1], rids[2]
        ct1 = txn.get(r1 + CONTENT, db=payloads)
        assert ct1 is not None
        assert txn.get(r2 + CONTENT, db=payloads) is not None
        txn.put(r2 + CONTENT, ct1, db=payloads)

    _edit(lethe, swap)
    c = lethe.client("alice")
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=turns[1].name),
        c.md,
        DATA_LOSS,
        "INTEGRITY",
    )
    assert get_turn(c, turns[0].name).text == "first turn text"


def test_content_ciphertext_moved_onto_embedding_of_same_turn_fails_integrity(lethe: Lethe) -> None:
    """Same record key, different payload type: only the associated data differs."""
    turns = _two_turns(lethe)

    def move(
        txn: lmdb.Transaction[bytes], payloads: lmdb._Database, rids: dict[int, bytes]
    ) -> None:
        r1 = rids[1]
        assert txn.get(r1 + EMBEDDING, db=payloads) is not None
        content = txn.get(r1 + CONTENT, db=payloads)
        assert content is not None
        txn.put(r1 + EMBEDDING, content, db=payloads)

    _edit(lethe, move)
    c = lethe.client("alice")
    full = threads_pb2.GetTurnRequest(name=turns[0].name, view=common_pb2.FULL)
    expect_error(c.threads.GetTurn, full, c.md, DATA_LOSS, "INTEGRITY")
    # The content itself is intact.
    assert get_turn(c, turns[0].name).speaker == "someone"


def test_flipped_ciphertext_byte_fails_integrity(lethe: Lethe) -> None:
    turns = _two_turns(lethe)

    def flip(
        txn: lmdb.Transaction[bytes], payloads: lmdb._Database, rids: dict[int, bytes]
    ) -> None:
        r2 = rids[2]
        stored = txn.get(r2 + CONTENT, db=payloads)
        assert stored is not None
        ct = bytearray(stored)
        ct[len(ct) // 2] ^= 0x01
        txn.put(r2 + CONTENT, bytes(ct), db=payloads)

    _edit(lethe, flip)
    c = lethe.client("alice")
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=turns[1].name),
        c.md,
        DATA_LOSS,
        "INTEGRITY",
    )
    assert get_turn(c, turns[0].name).text == "first turn text"


def test_untouched_store_reopens_cleanly(lethe: Lethe) -> None:
    """Control: opening and closing the environment without edits breaks nothing."""
    turns = _two_turns(lethe)
    _edit(lethe, lambda txn, payloads, rids: None)
    c = lethe.client("alice")
    assert [get_turn(c, t.name).text for t in turns] == ["first turn text", "second turn text"]
