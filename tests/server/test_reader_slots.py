"""Reads that fail give their LMDB reader slot back at once.

py-lmdb ends a read transaction by resetting it (``mdb_txn_reset``): under
``MDB_NOTLS`` its slot in the lock table stays taken until the Python
``Transaction`` object is freed. A read that raises (a deleted, sealed or
missing record) leaves its ``txn`` local in a frame of the exception's
traceback, and on its way to the client the exception is caught in reference
cycles (asyncio and grpc.aio futures, the abort chain) that only the cyclic
GC frees. The crash harness's check phase — hundreds of ``GetTurn`` on
deleted and sealed turns right after a restart — filled the 126 slots before
a full collection came round, and the next read answered ``INTERNAL`` with
``MDB_READERS_FULL``.

The cyclic GC is switched off while the calls run, so the count does not
depend on when it happens to run: each slot must be back when the call ends.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from conftest import Client, Lethe

from lethe.v1 import common_pb2, lifecycle_pb2, memories_pb2, repairs_pb2, threads_pb2

PARENT = "owners/alice"
CALLS = 40
"""Failing calls of each kind (all kinds together exceed LMDB's default 126 slots)."""
SPARE = 4
"""Slots that may stay taken with nothing running: py-lmdb keeps a spare reset
transaction per environment; a little slack beyond that."""


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _thread(c: Client, tid: str) -> list[str]:
    c.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent=PARENT, thread_id=tid), metadata=c.md
    )
    reply = c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=f"{PARENT}/threads/{tid}",
            turns=[
                threads_pb2.TurnInput(role=common_pb2.USER, text=f"{tid} {i}", commit=True)
                for i in range(4)
            ],
        ),
        metadata=c.md,
    )
    return [t.name for t in reply.turns]


def _failing_reads(c: Client) -> dict[str, tuple[Callable[..., Any], Any, grpc.StatusCode]]:
    """The reads of what is gone, sealed or never existed that the crash harness checks.

    Reads of a deleted turn, a sealed turn, a turn that never existed, a turn
    of a forgotten thread, the forgotten thread, a forgotten memory and a
    listing of the forgotten thread.
    """
    kept, sealed, gone = _thread(c, "kept"), _thread(c, "sealed"), _thread(c, "gone")
    m = memories_pb2.Memory
    c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=PARENT,
            memory_id="m1",
            memory=m(
                kind=m.FACT,
                text="a fact",
                state=common_pb2.COMMITTED,
                sources=[common_pb2.SourceRef(name=kept[0], version=1)],
            ),
        ),
        metadata=c.md,
    )
    for name in (kept[1], f"{PARENT}/threads/gone", f"{PARENT}/memories/m1"):
        c.lifecycle.Forget(lifecycle_pb2.ForgetRequest(names=[name]), metadata=c.md)
    c.repairs.SealRepair(
        repairs_pb2.SealRepairRequest(thread=f"{PARENT}/threads/sealed", from_seq=2),
        metadata=c.md,
    )
    t, nf = c.threads, grpc.StatusCode.NOT_FOUND
    return {
        "deleted turn": (t.GetTurn, threads_pb2.GetTurnRequest(name=kept[1]), nf),
        "sealed turn": (
            t.GetTurn,
            threads_pb2.GetTurnRequest(name=sealed[2]),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        "missing turn": (
            t.GetTurn,
            threads_pb2.GetTurnRequest(name=f"{PARENT}/threads/kept/turns/99"),
            nf,
        ),
        "turn of a forgotten thread": (t.GetTurn, threads_pb2.GetTurnRequest(name=gone[0]), nf),
        "forgotten thread": (
            t.GetThread,
            threads_pb2.GetThreadRequest(name=f"{PARENT}/threads/gone"),
            nf,
        ),
        "forgotten memory": (
            c.memories.GetMemory,
            memories_pb2.GetMemoryRequest(name=f"{PARENT}/memories/m1"),
            nf,
        ),
        "listing of a forgotten thread": (
            t.ListTurns,
            threads_pb2.ListTurnsRequest(parent=f"{PARENT}/threads/gone"),
            nf,
        ),
    }


def test_failing_reads_free_their_reader_slots(lethe: Lethe, no_cyclic_gc: None) -> None:
    c = lethe.client("alice")
    reads = _failing_reads(c)
    assert lethe.server is not None
    store = lethe.server.store
    before = store.reader_slots()
    assert before <= SPARE, store.env.readers()
    taken: dict[str, int] = {}
    for label, (rpc, request, code) in reads.items():
        for _ in range(CALLS):
            with pytest.raises(grpc.RpcError) as err:
                rpc(request, metadata=c.md)
            assert err.value.code() == code, (label, err.value.details())
        taken[label] = store.reader_slots()
    assert max(taken.values()) <= SPARE, (taken, store.env.readers())
