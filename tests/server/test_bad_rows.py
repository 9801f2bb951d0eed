"""One bad record stays one bad record: named DATA_LOSS, skipped by bulk reads, never fatal.

A row whose ciphertext fails to open answers DATA_LOSS / INTEGRITY by name and
is skipped — counted and logged by id — by every call that returns many
records; it never fails a whole call, and never shifts which id a vector maps
to (white-box: the stopped data environment is edited directly, then the real
server is started on it).
"""

from __future__ import annotations

import grpc
import pytest
from _helpers import append, create_thread, expect_error, open_data_env, rid_of, run_cli
from conftest import Lethe

from lethe.v1 import common_pb2, lifecycle_pb2, memories_pb2, retrieval_pb2, threads_pb2

THREAD = "owners/alice/threads/t1"
TEXTS = [
    "the lighthouse keeper paints every spring",
    "my sister collects antique maps of norway",
    "we adopted a grey cat called pepper",
]
MODES = [
    retrieval_pb2.SearchRequest.HYBRID,
    retrieval_pb2.SearchRequest.DENSE,
    retrieval_pb2.SearchRequest.LEXICAL,
]


def _corrupt(lethe: Lethe, seq: int, code: bytes) -> None:
    """Flip one byte of payload ``code`` (c: content, e: vector) of turn ``seq``."""
    lethe.stop()
    env = open_data_env(lethe.data_dir)
    try:
        payloads = env.open_db(b"payloads")
        key = rid_of(env, "alice", "t1", seq) + code
        with env.begin(write=True) as txn:
            stored = txn.get(key, db=payloads)
            assert stored is not None
            ct = bytearray(stored)
            ct[len(ct) // 2] ^= 0x01
            txn.put(key, bytes(ct), db=payloads)
    finally:
        env.close()
    lethe.start()


def _search(
    lethe: Lethe, query: str, mode: retrieval_pb2.SearchRequest.Mode.ValueType
) -> list[str]:
    c = lethe.client("alice")
    resp = c.retrieval.Search(
        retrieval_pb2.SearchRequest(parent="owners/alice", query_text=query, top_k=10, mode=mode),
        metadata=c.md,
    )
    return [h.turn.text for h in resp.hits]


def _audit(lethe: Lethe) -> lifecycle_pb2.AuditReport:
    c = lethe.client("alice")
    return c.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent="owners/alice"), metadata=c.md)


@pytest.fixture
def three(lethe: Lethe) -> list[threads_pb2.Turn]:
    c = lethe.client("alice")
    create_thread(c, "alice", "t1")
    return append(c, THREAD, TEXTS, commit=True)


def test_a_corrupt_turn_is_data_loss_by_name_and_skipped_by_every_bulk_read(
    lethe: Lethe, three: list[threads_pb2.Turn]
) -> None:
    _corrupt(lethe, 2, b"c")
    c = lethe.client("alice")
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=three[1].name),
        c.md,
        grpc.StatusCode.DATA_LOSS,
        "INTEGRITY",
    )
    listed = c.threads.ListTurns(threads_pb2.ListTurnsRequest(parent=THREAD), metadata=c.md)
    assert [t.text for t in listed.turns] == [TEXTS[0], TEXTS[2]]
    for mode in MODES:
        found = _search(lethe, "antique maps of norway lighthouse cat", mode)
        assert TEXTS[1] not in found, mode
        assert TEXTS[0] in found or TEXTS[2] in found, mode
    bundle = c.retrieval.AssembleContext(
        retrieval_pb2.AssembleContextRequest(thread=THREAD, query_text="maps"), metadata=c.md
    )
    assert [t.text for t in bundle.recent_turns] == [TEXTS[0], TEXTS[2]]
    report = _audit(lethe)
    assert report.unreadable_records == 1
    assert (report.orphans, report.records_without_key, report.keys_without_record) == (0, 0, 0)
    assert lethe.server is not None
    lethe.server.lifecycle.refresh_gauges()
    assert lethe.server.metrics.unreadable_records._value.get() == 1
    lethe.stop()
    assert run_cli(["audit", "--data", str(lethe.data_dir)]) == 1  # a broken invariant


def test_a_corrupt_vector_is_skipped_and_shifts_no_other_vector(
    lethe: Lethe, three: list[threads_pb2.Turn]
) -> None:
    _corrupt(lethe, 2, b"e")  # the index is built afresh at the first search
    for text in (TEXTS[0], TEXTS[2]):
        hits = _search(lethe, text, retrieval_pb2.SearchRequest.DENSE)
        assert hits[0] == text  # each vector still maps to its own turn
    assert TEXTS[1] not in _search(lethe, TEXTS[1], retrieval_pb2.SearchRequest.DENSE)
    # Its content is intact: by name it reads; lexically it is found.
    c = lethe.client("alice")
    got = c.threads.GetTurn(threads_pb2.GetTurnRequest(name=three[1].name), metadata=c.md)
    assert got.text == TEXTS[1]
    assert _search(lethe, "antique maps", retrieval_pb2.SearchRequest.LEXICAL)[0] == TEXTS[1]
    full = threads_pb2.GetTurnRequest(name=three[1].name, view=common_pb2.FULL)
    expect_error(c.threads.GetTurn, full, c.md, grpc.StatusCode.DATA_LOSS, "INTEGRITY")
    assert _audit(lethe).unreadable_records == 1


def test_a_corrupt_memory_is_skipped_by_listings_and_context(lethe: Lethe) -> None:
    c = lethe.client("alice")
    create_thread(c, "alice", "t1")
    for mid, text in (("m1", "pepper likes tuna"), ("m2", "pepper hates the vet")):
        c.memories.CreateMemory(
            memories_pb2.CreateMemoryRequest(
                parent="owners/alice",
                memory_id=mid,
                memory=memories_pb2.Memory(
                    kind=memories_pb2.Memory.FACT, text=text, state=common_pb2.COMMITTED
                ),
            ),
            metadata=c.md,
        )
    lethe.stop()
    env = open_data_env(lethe.data_dir)
    try:
        ids, memories, mpayloads = (
            env.open_db(n) for n in (b"memory_ids", b"memories", b"mpayloads")
        )
        with env.begin(write=True) as txn:
            rk = txn.get(b"alice\x00m1", db=ids)
            assert rk is not None
            assert txn.get(rk, db=memories) is not None
            key = rk + (1).to_bytes(8, "big") + b"m"
            stored = txn.get(key, db=mpayloads)
            assert stored is not None
            txn.put(key, stored[:-3], db=mpayloads)  # a truncated value
    finally:
        env.close()
    lethe.start()
    c = lethe.client("alice")
    expect_error(
        c.memories.GetMemory,
        memories_pb2.GetMemoryRequest(name="owners/alice/memories/m1"),
        c.md,
        grpc.StatusCode.DATA_LOSS,
        "INTEGRITY",
    )
    listed = c.memories.ListMemories(
        memories_pb2.ListMemoriesRequest(parent="owners/alice"), metadata=c.md
    )
    assert [m.text for m in listed.memories] == ["pepper hates the vet"]
    bundle = c.retrieval.AssembleContext(
        retrieval_pb2.AssembleContextRequest(thread=THREAD, query_text="pepper"), metadata=c.md
    )
    assert [h.memory.text for h in bundle.memories] == ["pepper hates the vet"]
    resp = c.retrieval.Search(
        retrieval_pb2.SearchRequest(parent="owners/alice", query_text="pepper", top_k=10),
        metadata=c.md,
    )
    assert [h.memory.text for h in resp.hits] == ["pepper hates the vet"]
    assert _audit(lethe).unreadable_records == 1
