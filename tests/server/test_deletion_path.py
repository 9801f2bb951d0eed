"""Every cause of a deletion completes through one path, and each says when its shred completes.

``Forget``, ``ConcludeRepair``, a seal's mixed derivatives and the start-up
resumption of an interrupted forget each leave a completed deletion-log entry
whose ``shred_horizon_time`` is the next rotation (a KEK file is rotated every
``--rotation-interval``); ``lethe_deletion_latency_seconds`` counts the
deletions that were requested by a call (forget, conclude), not a seal's
derivatives nor a resumed entry. A seal and a resumed entry once reported a
shred horizon of 0, as if no rotation were needed to complete them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _helpers import append, create_thread
from conftest import Client, Lethe

from lethe.v1 import common_pb2, lifecycle_pb2, memories_pb2, repairs_pb2, threads_pb2
from server.store import ForgetTargets

OWNER = "owners/alice"
HOUR = 3600.0


def _receipts(c: Client) -> dict[str, common_pb2.DeletionReceipt]:
    page = c.lifecycle.ListDeletions(
        lifecycle_pb2.ListDeletionsRequest(parent=OWNER), metadata=tuple(c.md)
    )
    return {r.name: r for r in page.receipts}


def _horizon(receipt: common_pb2.DeletionReceipt) -> float:
    return receipt.shred_horizon_time.seconds + receipt.shred_horizon_time.nanos / 1e9


def _latency_count(lethe: Lethe) -> float:
    assert lethe.server is not None
    (family,) = lethe.server.metrics.deletion_latency.collect()
    return float(next(s.value for s in family.samples if s.name.endswith("_count")))


def _memory(c: Client, mid: str, sources: list[str]) -> memories_pb2.Memory:
    return c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=OWNER,
            memory_id=mid,
            memory=memories_pb2.Memory(
                kind=memories_pb2.Memory.SUMMARY,
                text=f"summary {mid}",
                sources=[common_pb2.SourceRef(name=n, version=1) for n in sources],
                state=common_pb2.COMMITTED,
            ),
        ),
        metadata=tuple(c.md),
    )


@pytest.fixture
def rotating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lethe:
    """A server whose KEK is a file, rotated every hour (no in-memory KEK)."""
    monkeypatch.delenv("LETHE_KEK", raising=False)
    return Lethe(
        tmp_path / "data", kek_file=tmp_path / "config" / "kek.json", rotation_interval=HOUR
    )


def test_every_cause_reports_the_next_rotation_as_its_shred_horizon(rotating: Lethe) -> None:
    lethe = rotating
    try:
        c = lethe.client("alice")
        thread = create_thread(c, "alice", "t1")
        turns = append(c, thread, [f"turn {i}" for i in range(1, 11)], commit=True)
        started = time.time()

        # Forget: requested, observed.
        before = _latency_count(lethe)
        receipt = c.lifecycle.Forget(
            lifecycle_pb2.ForgetRequest(names=[turns[0].name]), metadata=tuple(c.md)
        )
        assert started < _horizon(receipt) <= time.time() + HOUR
        assert _latency_count(lethe) == before + 1

        # A seal whose mixed derivative (sources on both sides) is deleted: not observed.
        mixed = _memory(c, "mixed", [turns[2].name, turns[7].name])
        before = _latency_count(lethe)
        repair = c.repairs.SealRepair(
            repairs_pb2.SealRepairRequest(thread=thread, from_seq=6), metadata=tuple(c.md)
        )
        sealed = [r for r in _receipts(c).values() if mixed.name in r.targets]
        assert len(sealed) == 1
        assert sealed[0].deleted == 1
        assert started < _horizon(sealed[0]) <= time.time() + HOUR
        assert _latency_count(lethe) == before

        # ConcludeRepair DESTROY: requested, observed.
        before = _latency_count(lethe)
        done = c.repairs.ConcludeRepair(
            repairs_pb2.ConcludeRepairRequest(
                name=repair.name, outcome=threads_pb2.RepairInfo.DESTROY
            ),
            metadata=tuple(c.md),
        )
        assert done.receipt.deleted == 5
        assert started < _horizon(done.receipt) <= time.time() + HOUR
        assert _latency_count(lethe) == before + 1

        # A forget planned (step 1 committed) but never finished, as a crash leaves
        # it: the next start resumes it, and it too waits for the next rotation.
        assert lethe.server is not None
        cut = lethe.server.store.plan_forget(
            "alice", ForgetTargets.of(turns=[("t1", 2)]), reason="FORGET", request_time=started
        )
        lethe.restart()
        c = lethe.client("alice")
        resumed = _receipts(c)[cut.name]
        assert resumed.complete_time.seconds > 0
        assert started < _horizon(resumed) <= time.time() + HOUR
        assert _latency_count(lethe) == 0  # a new process; the resumed entry is not a request
    finally:
        lethe.stop()


def test_an_in_memory_kek_reports_no_shred_horizon(lethe: Lethe) -> None:
    """``LETHE_KEK`` is never rotated: no horizon is promised."""
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turn = append(c, thread, ["only turn"], commit=True)[0]
    receipt = c.lifecycle.Forget(
        lifecycle_pb2.ForgetRequest(names=[turn.name]), metadata=tuple(c.md)
    )
    assert receipt.deleted == 1
    assert not receipt.HasField("shred_horizon_time")
