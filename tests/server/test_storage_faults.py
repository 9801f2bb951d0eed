"""Storage faults fail closed and whole.

A write that does not fit under ``--max-store-size`` is refused with
RESOURCE_EXHAUSTED / STORE_FULL, leaving no partial batch and no stray keys; a
disk error (a real full filesystem, or an injected EIO, in
``tests/crash/test_failpoints.py``) answers UNAVAILABLE, never INTERNAL; reads
keep working and the store reopens consistent.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from _helpers import create_thread, error_reason, run_cli, turn_input
from conftest import Client, Lethe

from lethe.v1 import common_pb2, lifecycle_pb2, repairs_pb2, retrieval_pb2, threads_pb2

THREAD = "owners/alice/threads/t1"


def _fill(c: Client, batches: int = 400) -> tuple[int, grpc.RpcError]:
    """Append batches of 20 turns of ~2 KiB until one is refused.

    Returns (batches acknowledged, the refusal).
    """
    for i in range(batches):
        texts = [f"batch {i} turn {j} " + "payload words to fill pages " * 70 for j in range(20)]
        try:
            c.threads.AppendTurns(
                threads_pb2.AppendTurnsRequest(
                    parent=THREAD, turns=[turn_input(t, commit=True) for t in texts]
                ),
                metadata=c.md,
            )
        except grpc.RpcError as err:
            return i, err
    raise AssertionError("the store never filled")


def _count(c: Client) -> int:
    n, token = 0, ""
    while True:
        page = c.threads.ListTurns(
            threads_pb2.ListTurnsRequest(parent=THREAD, page_size=1000, page_token=token),
            metadata=c.md,
        )
        n += len(page.turns)
        token = page.next_page_token
        if not token:
            return n


def _audit(c: Client) -> tuple[int, int, int]:
    r = c.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent="owners/alice"), metadata=c.md)
    return r.orphans, r.keys_without_record, r.records_without_key


def test_a_full_store_refuses_whole_writes_and_keeps_serving_reads(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    lethe = lethe_at(tmp_path / "d", embedder="none", max_store_size=3 << 20)
    c = lethe.client("alice")
    create_thread(c, "alice", "t1")
    acked, err = _fill(c)
    assert acked > 5
    assert error_reason(err) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "STORE_FULL")
    assert _count(c) == 20 * acked  # no partial batch
    assert _audit(c) == (0, 0, 0)  # no stray keys of the refused batch
    first = c.threads.GetTurn(threads_pb2.GetTurnRequest(name=f"{THREAD}/turns/1"), metadata=c.md)
    assert first.text.startswith("batch 0 turn 0 ")
    hits = c.retrieval.Search(
        retrieval_pb2.SearchRequest(parent="owners/alice", query_text="batch 3 turn 7"),
        metadata=c.md,
    ).hits
    assert hits
    assert lethe.server is not None
    lethe.server.lifecycle.refresh_gauges()
    assert lethe.server.metrics.store_fill_ratio._value.get() > 0.9
    # The operator raises the ceiling: the same data serves, and writes fit again.
    lethe.stop()
    lethe.config["max_store_size"] = 16 << 20
    lethe.start()
    c = lethe.client("alice")
    c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(parent=THREAD, turns=[turn_input("fits now", commit=True)]),
        metadata=c.md,
    )
    assert _count(c) == 20 * acked + 1
    lethe.stop()
    assert run_cli(["audit", "--data", str(tmp_path / "d")]) == 0


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB tmpfs (needs the right to mount: skipped without it)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        why = f"cannot mount a tmpfs here: {done.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI must run the full-disk test")
        pytest.skip(why)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_unavailable_and_the_store_stays_consistent(
    small_filesystem: Path, lethe_at: Callable[..., Lethe]
) -> None:
    data = small_filesystem / "d"
    lethe = lethe_at(data, embedder="none")  # map ceiling 64 GiB: the disk fills first
    c = lethe.client("alice")
    create_thread(c, "alice", "t1")
    acked, err = _fill(c)
    assert acked > 2
    code, reason = error_reason(err)
    assert code == grpc.StatusCode.UNAVAILABLE, (code, reason, err.details())
    assert reason == "STORAGE_UNAVAILABLE"
    assert _count(c) == 20 * acked  # reads keep working; nothing partial
    lethe.stop()
    lethe.start()  # reopens on the full disk (clean-up that needs space waits)
    c = lethe.client("alice")
    assert _count(c) == 20 * acked
    orphans, _, keyless = _audit(c)
    assert (orphans, keyless) == (0, 0)
    lethe.stop()
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_filesystem)], check=True)
    lethe.start()  # with room again, start-up finishes what it deferred
    c = lethe.client("alice")
    assert _count(c) == 20 * acked
    assert _audit(c) == (0, 0, 0)


def test_cleanup_a_full_disk_left_undone_is_done_when_space_returns(
    small_filesystem: Path, lethe_at: Callable[..., Lethe]
) -> None:
    """Keys made for a batch refused on a full disk go once space returns.

    The scheduler retries their clean-up: the audit is healthy again without a restart.
    """
    lethe = lethe_at(small_filesystem / "d", embedder="none", sweep_interval=0.2)
    c = lethe.client("alice")
    create_thread(c, "alice", "t1")
    acked, err = _fill(c)
    assert error_reason(err)[1] == "STORAGE_UNAVAILABLE"
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_filesystem)], check=True)
    deadline = time.monotonic() + 10.0
    while _audit(c) != (0, 0, 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _audit(c) == (0, 0, 0)
    assert _count(c) == 20 * acked
    lethe.stop()


def _fill_to_the_last_turn(c: Client) -> int:
    """After :func:`_fill`: single turns until even one is refused; returns how many fit."""
    for n in range(10_000):
        try:
            c.threads.AppendTurns(
                threads_pb2.AppendTurnsRequest(
                    parent=THREAD, turns=[turn_input(f"last {n} " + "words " * 300, commit=True)]
                ),
                metadata=c.md,
            )
        except grpc.RpcError:
            return n
    raise AssertionError("the store never filled")


def _forget(c: Client, names: list[str]) -> common_pb2.DeletionReceipt:
    receipt: common_pb2.DeletionReceipt = c.lifecycle.Forget(
        lifecycle_pb2.ForgetRequest(names=names), metadata=c.md
    )
    return receipt


def test_a_full_store_still_forgets_and_concludes_a_repair(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    """At ``--max-store-size`` writes that add data are refused; erasing goes on.

    A forget and a repair concluded with DESTROY succeed. A forget at the ceiling
    once answered STORE_FULL: the operation that frees space was the one refused.
    """
    lethe = lethe_at(tmp_path / "d", embedder="none", max_store_size=3 << 20)
    c = lethe.client("alice")
    create_thread(c, "alice", "sore")
    sore = "owners/alice/threads/sore"
    c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=sore, turns=[turn_input(f"painful {i}", commit=True) for i in range(6)]
        ),
        metadata=c.md,
    )
    repair = c.repairs.SealRepair(
        repairs_pb2.SealRepairRequest(thread=sore, from_seq=3), metadata=c.md
    )
    create_thread(c, "alice", "t1")
    acked, err = _fill(c)
    assert error_reason(err) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "STORE_FULL")
    _fill_to_the_last_turn(c)
    receipt = _forget(c, [f"{THREAD}/turns/1", f"{THREAD}/turns/2"])
    assert receipt.deleted == 2
    done = c.repairs.ConcludeRepair(
        repairs_pb2.ConcludeRepairRequest(name=repair.name, outcome=threads_pb2.RepairInfo.DESTROY),
        metadata=c.md,
    )
    assert done.receipt.deleted == 4
    assert _forget(c, [THREAD]).deleted >= 20 * acked - 2
    # What the forgets freed is room for writes again.
    create_thread(c, "alice", "t1-again")
    c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent="owners/alice/threads/t1-again", turns=[turn_input("fits again", commit=True)]
        ),
        metadata=c.md,
    )
    assert _audit(c) == (0, 0, 0)
    lethe.stop()
    assert run_cli(["audit", "--data", str(tmp_path / "d")]) == 0


def test_a_full_disk_still_forgets_on_the_disk_reserve(
    small_filesystem: Path, lethe_at: Callable[..., Lethe]
) -> None:
    """On a full filesystem a forget frees the disk reserve and goes on.

    The sweeper allocates the reserve again once there is room. A forget on a full
    disk once answered UNAVAILABLE.
    """
    data = small_filesystem / "d"
    lethe = lethe_at(data, embedder="none", disk_reserve=1 << 20, sweep_interval=0.2)
    reserve = data / "reserve.bin"
    assert reserve.stat().st_size == 1 << 20
    c = lethe.client("alice")
    create_thread(c, "alice", "t1")
    acked, err = _fill(c)
    assert error_reason(err)[1] == "STORAGE_UNAVAILABLE"
    _fill_to_the_last_turn(c)
    receipt = _forget(c, [THREAD])
    assert receipt.deleted >= 20 * acked
    assert not reserve.exists()  # spent on the forget
    assert _audit(c)[0] == 0
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_filesystem)], check=True)
    deadline = time.monotonic() + 10.0
    while not reserve.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert reserve.stat().st_size == 1 << 20
    lethe.stop()
