"""A crash during the retention sweep converges: the expired record is forgotten once.

The sweeper forgets a committed turn past its retention through the normal
deletion path (plan, then keys and rows); a server killed at each step of that
deletion (the failpoints of ``forget.plan`` and ``forget.finish``, reached here
by the sweeper, not by a call) comes back with the turn unreadable — it expired
before the crash — and, once start-up resumed the deletion or the next sweep
ran it, forgotten exactly once: one receipt of reason ``RETENTION``, its key
destroyed, ``lethe audit`` clean.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from _harness import OWNER, armed, audit, base_env, make_token, serving

from lethe._rpc import Stubs, reason_of
from lethe.v1 import common_pb2, lifecycle_pb2, threads_pb2

PARENT = f"owners/{OWNER}"
THREAD = f"{PARENT}/threads/t1"


def _setup(s: Stubs) -> tuple[str, str]:
    s.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent=PARENT, thread_id="t1"), metadata=s.md
    )
    turns = s.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=THREAD,
            turns=[
                threads_pb2.TurnInput(role=common_pb2.USER, text=text, commit=True)
                for text in ("kept harbour", "expiring lantern")
            ],
        ),
        metadata=s.md,
    ).turns
    request = lifecycle_pb2.SetRetentionRequest(names=[turns[1].name])
    request.ttl.FromMilliseconds(500)
    s.lifecycle.SetRetention(request, metadata=s.md)
    return turns[0].name, turns[1].name


def _receipts(s: Stubs) -> list[common_pb2.DeletionReceipt]:
    return list(
        s.lifecycle.ListDeletions(
            lifecycle_pb2.ListDeletionsRequest(parent=PARENT), metadata=s.md
        ).receipts
    )


def _reason(s: Stubs, name: str) -> str:
    try:
        s.threads.GetTurn(threads_pb2.GetTurnRequest(name=name), metadata=s.md)
    except grpc.RpcError as err:
        return reason_of(err)
    return "ok"


@pytest.mark.parametrize(
    "point",
    [
        "forget.plan.after_keystore",
        "forget.plan.after_commit",
        "forget.finish.after_keystore",
        "forget.finish.after_commit",
    ],
)
def test_a_crash_in_the_retention_sweep_converges(point: str, tmp_path: Path, kek_env: str) -> None:
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        kept, expiring = _setup(clean.stubs(token))
    time.sleep(0.6)
    with serving(data, armed(env, point), "--sweep-interval", "200ms") as doomed:
        assert doomed.killed(), f"{point} was not reached by the sweep"
    with serving(data, env, "--sweep-interval", "200ms") as again:
        s = again.stubs(token)
        assert _reason(s, expiring) == "RECORD_DELETED"  # expired: never readable again
        deadline = time.monotonic() + 20
        while not _receipts(s) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # a second sweep: nothing more to forget
        receipts = _receipts(s)
        assert [(list(r.targets), r.reason) for r in receipts] == [([expiring], "RETENTION")]
        assert all(d.done for d in receipts[0].destinations)
        assert _reason(s, kept) == "ok"
        report = s.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent=PARENT), metadata=s.md)
        assert (report.orphans, report.keys_without_record, report.records_without_key) == (0, 0, 0)
    rc, out = audit(data, env)
    assert rc == 0, out
