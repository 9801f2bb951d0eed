"""Crash (SIGKILL) between the tombstone transaction and key destruction.

After a restart the deletion completes and the audit is clean.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import free_port as _free_port

from lethe._rpc import reason_of as _reason
from lethe.v1 import (
    common_pb2,
    lifecycle_pb2,
    lifecycle_pb2_grpc,
    memories_pb2,
    memories_pb2_grpc,
    threads_pb2,
    threads_pb2_grpc,
)


def _serve(data: Path, port: int, env: dict[str, str], processes: int = 1) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server.cli",
            "serve",
            "--data",
            str(data),
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            "off",
            "--embedder",
            "none",
            "--processes",
            str(processes),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert "serving" in proc.stdout.readline()
    return proc


@contextlib.contextmanager
def _killed_at_exit(proc: subprocess.Popen[str]) -> Iterator[None]:
    """Whatever happens in the block, the server process is gone afterwards."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_sigkill_between_tombstones_and_key_destruction_is_completed_at_restart(
    tmp_path: Path, kek_env: str
) -> None:
    data = tmp_path / "d"
    base = {**os.environ, "LETHE_KEK": kek_env}
    from server import Store, new_token, principal_record, token_digest

    token = new_token()
    store = Store(data, lock=False)
    store.put_token(token_digest(token), principal_record(["alice"], False))
    store.close()
    md = (("authorization", f"Bearer {token}"),)
    port = _free_port()
    crashing = _serve(data, port, {**base, "LETHE_FAILPOINTS": "forget.plan.after_commit=kill"})
    with _killed_at_exit(crashing), grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        turns = _plant(ch, md)
        with pytest.raises(grpc.RpcError) as err:
            lifecycle_pb2_grpc.LifecycleStub(ch).Forget(
                lifecycle_pb2.ForgetRequest(names=[turns[0].name]), metadata=md
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert crashing.wait(timeout=30) == -9
    port = _free_port()
    server = _serve(data, port, base)
    with _killed_at_exit(server), grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        _check_completed(ch, md, list(turns))


@pytest.mark.slow
def test_a_member_killed_between_tombstones_and_keys_is_completed_by_the_group_restart(
    tmp_path: Path, kek_env: str
) -> None:
    """``--processes 2``: the member that forgets is SIGKILLed after step 1.

    The supervisor starts the group again on the same port; the new primary's
    recovery completes the deletion before any member serves.
    """
    data = tmp_path / "d"
    from server import Store, new_token, principal_record, token_digest

    token = new_token()
    store = Store(data, lock=False)
    store.put_token(token_digest(token), principal_record(["alice"], False))
    store.close()
    md = (("authorization", f"Bearer {token}"),)
    port = _free_port()
    env = {**os.environ, "LETHE_KEK": kek_env, "LETHE_FAILPOINTS": "forget.plan.after_commit=kill"}
    group = _serve(data, port, env, processes=2)
    with _killed_at_exit(group):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            turns = _plant(ch, md)
            with pytest.raises(grpc.RpcError) as err:
                lifecycle_pb2_grpc.LifecycleStub(ch).Forget(
                    lifecycle_pb2.ForgetRequest(names=[turns[0].name]), metadata=md
                )
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        deadline = time.monotonic() + 120
        while True:  # the surviving member may answer first; then the restarted group
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                try:
                    _check_completed(ch, md, turns)
                    break
                except (grpc.RpcError, AssertionError):
                    if time.monotonic() > deadline:
                        raise
            time.sleep(0.2)
        assert group.poll() is None  # the supervisor kept the group going


def _plant(ch: grpc.Channel, md: tuple[tuple[str, str], ...]) -> list[Any]:
    """Thread ``t1`` of three committed turns and a memory derived from the first; the turns."""
    threads = threads_pb2_grpc.ThreadsStub(ch)
    threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent="owners/alice", thread_id="t1"), metadata=md
    )
    turns = threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent="owners/alice/threads/t1",
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.USER,
                    text=f"crash plant {i}",
                    commit=True,
                    embedding=[1.0, float(i)],
                )
                for i in range(3)
            ],
        ),
        metadata=md,
    ).turns
    memories_pb2_grpc.MemoriesStub(ch).CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent="owners/alice",
            memory_id="derived",
            memory=memories_pb2.Memory(
                kind=memories_pb2.Memory.FACT,
                text="derived from turn 1",
                sources=[common_pb2.SourceRef(name=turns[0].name, version=1)],
                state=common_pb2.COMMITTED,
                embedding=[0.5, 0.5],
            ),
        ),
        metadata=md,
    )
    return list(turns)


def _check_completed(ch: grpc.Channel, md: tuple[tuple[str, str], ...], turns: list[Any]) -> None:
    """The forget of ``turns[0]`` (and its derived memory) is complete; the audit is clean."""
    threads = threads_pb2_grpc.ThreadsStub(ch)
    lifecycle = lifecycle_pb2_grpc.LifecycleStub(ch)
    with pytest.raises(grpc.RpcError) as err:
        threads.GetTurn(threads_pb2.GetTurnRequest(name=turns[0].name), metadata=md)
    assert (err.value.code(), _reason(err.value)) == (
        grpc.StatusCode.NOT_FOUND,
        "RECORD_DELETED",
    )
    with pytest.raises(grpc.RpcError) as err:
        memories_pb2_grpc.MemoriesStub(ch).GetMemory(
            memories_pb2.GetMemoryRequest(name="owners/alice/memories/derived"),
            metadata=md,
        )
    assert _reason(err.value) == "RECORD_DELETED"
    receipts = lifecycle.ListDeletions(
        lifecycle_pb2.ListDeletionsRequest(parent="owners/alice"), metadata=md
    ).receipts
    assert len(receipts) == 1
    assert receipts[0].cascaded == 1
    assert {d.name: d.done for d in receipts[0].destinations} == {
        "lmdb": True,
        "index": True,
        "lexical": True,
        "keystore": True,
        "cache": True,
    }
    report = lifecycle.Audit(lifecycle_pb2.AuditRequest(parent="owners/alice"), metadata=md)
    assert (
        report.orphans,
        report.keys_without_record,
        report.records_without_key,
        report.index_drift,
    ) == (0, 0, 0, 0)
    assert report.checked == 2
    listed = threads.ListTurns(
        threads_pb2.ListTurnsRequest(parent="owners/alice/threads/t1"), metadata=md
    ).turns
    assert [t.text for t in listed] == ["crash plant 1", "crash plant 2"]
