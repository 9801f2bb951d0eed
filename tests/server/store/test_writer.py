"""The one writer's group commit, white-box on the real LMDB environment of a real store.

Ops queued together run as one group, and an op that raises is rolled back
alone while the others commit.
"""

from __future__ import annotations

import gc
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest

from server.store import Store, TurnDraft
from server.store._writer import WriteOp


def test_failing_op_is_rolled_back_alone_in_its_group(tmp_path: Path, kek_env: str) -> None:
    store = Store(tmp_path / "d")
    try:
        db = store.t.meta
        gate = threading.Event()

        def slow(txn: lmdb.Transaction) -> None:
            gate.wait(5)

        def good(key: bytes) -> WriteOp[bytes]:
            def apply(txn: lmdb.Transaction) -> bytes:
                txn.put(key, b"v", db=db)
                return key

            return WriteOp(apply)

        def bad(txn: lmdb.Transaction) -> None:
            txn.put(b"bad-key", b"v", db=db)
            raise RuntimeError("refused")

        blocker = store.writer.submit(WriteOp(slow))
        futures: list[Future[Any]] = [
            store.writer.submit(good(b"k1")),
            store.writer.submit(WriteOp(bad)),
            store.writer.submit(good(b"k2")),
        ]
        batches_before = store.writer.batches
        gate.set()
        blocker.result(5)
        assert futures[0].result(5) == b"k1"
        assert futures[2].result(5) == b"k2"
        with pytest.raises(RuntimeError, match="refused"):
            futures[1].result(5)
        # The three queued ops ran as one group after the blocker's group.
        assert store.writer.batches - batches_before <= 2
        with store.env.begin() as txn:
            assert txn.get(b"k1", db=db) == b"v"
            assert txn.get(b"k2", db=db) == b"v"
            assert txn.get(b"bad-key", db=db) is None
    finally:
        store.close()


def test_an_append_leaves_no_reference_cycle_holding_its_turns(
    tmp_path: Path, kek_env: str
) -> None:
    """Reference counting alone frees what an append held (its drafts, texts, vectors).

    ``append_turns``' ``apply`` refers to its own ``WriteOp`` (to list unused
    keys): the cycle kept every append's turns alive until the collector's
    next full pass, a pause of every thread that grew with them (the bug:
    ``bench/bench_overload.py --phases appends`` saw 50-65 ms passes finding
    thousands of ``TurnDraft`` and ``TurnMeta``).
    """
    store = Store(tmp_path / "d")
    try:
        store.create_thread("ann", "t1", "")
        rng = np.random.default_rng(0)
        drafts = [
            TurnDraft(
                1,
                "ann",
                f"turn {i}",
                None,
                rng.standard_normal(8).astype(np.float32),
                "",
                [],
                True,
                3600.0,
            )
            for i in range(5)
        ]
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            store.append_turns("ann", "t1", drafts, "req-1")
            store.create_thread("ann", "t2", "")  # the writer lets go of the append's group
            del drafts
            gc.collect()
            cyclic = sorted({type(o).__name__ for o in gc.garbage})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert not {"TurnDraft", "TurnMeta", "WriteOp"} & set(cyclic), cyclic
    finally:
        store.close()


def test_a_caller_waits_for_its_commit_inside_the_writers_waiting_context(
    tmp_path: Path, kek_env: str
) -> None:
    """``Writer.run`` waits inside ``waiting`` (the server lends the call's running slot there)."""
    import contextlib
    from collections.abc import Iterator

    store = Store(tmp_path / "d")
    seen: list[str] = []

    @contextlib.contextmanager
    def waiting() -> Iterator[None]:
        seen.append("enter")
        yield
        seen.append("exit")

    try:
        store.writer.waiting = waiting

        def apply(txn: lmdb.Transaction) -> str:
            seen.append("apply")
            return "done"

        assert store.writer.run(WriteOp(apply)) == "done"
    finally:
        store.close()
    assert sorted(seen) == ["apply", "enter", "exit"]  # apply may run before the wait begins
    assert seen[-1] == "exit"
