"""The echo sweep and the echo guard killed at each step, on the real server process.

A forget with an echo action sweeps before its plan (``echo.sweep.after_read``:
nothing written yet), makes its guard bucket's key if it is the bucket's first
(``echo.key.after_keystore``: a key no row names; ``echo.key.after_commit``:
the key and its row, no forget), sets its guard in the plan
(``forget.plan.after_keystore``: not decided; ``forget.plan.after_commit``:
decided), and the bucket ends in two steps (``echo.expire.after_keystore``: key
destroyed, rows left; ``echo.expire.after_commit``: both). After each kill the
next start converges: the forget is wholly applied or wholly not, a guard
stands with its key or is wholly gone with its key in the shred log, and
``lethe audit`` is clean (a guard key is no stray key while its row stands).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from _harness import OWNER, Server, armed, audit, base_env, make_token, serving

from lethe._rpc import Stubs, reason_of
from lethe.v1 import common_pb2, lifecycle_pb2, memories_pb2, threads_pb2
from shredder import RingRef

PARENT = f"owners/{OWNER}"
THREAD = f"{PARENT}/threads/t1"
FACT = (
    "My grandmother's violin was made in Cremona in 1873 and it still carries her initials inside"
)
State = dict[str, Any]


def _setup(s: Stubs) -> State:
    s.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent=PARENT, thread_id="t1"), metadata=s.md
    )
    turns = s.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=THREAD,
            turns=[
                threads_pb2.TurnInput(role=common_pb2.USER, text=FACT, commit=True),
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT, text=f"Lovely: {FACT}", commit=True
                ),
            ],
        ),
        metadata=s.md,
    ).turns
    return {"said": turns[0].name, "echo": turns[1].name}


def _forget(s: Stubs, st: State, guard: float = 3600.0) -> common_pb2.DeletionReceipt:
    request = lifecycle_pb2.ForgetRequest(names=[st["said"]], echoes=common_pb2.TAINT)
    request.echo_guard.FromNanoseconds(int(guard * 1e9))
    return s.lifecycle.Forget(request, metadata=s.md)


def _turn(s: Stubs, name: str) -> threads_pb2.Turn | str:
    try:
        return s.threads.GetTurn(threads_pb2.GetTurnRequest(name=name), metadata=s.md)
    except grpc.RpcError as err:
        return reason_of(err)


def _summary(s: Stubs) -> str:
    """``ok`` or the reason a sourceless summary holding the fact gets."""
    try:
        s.memories.CreateMemory(
            memories_pb2.CreateMemoryRequest(
                parent=PARENT,
                memory=memories_pb2.Memory(
                    kind=memories_pb2.Memory.SUMMARY, text=f"Summary. {FACT}."
                ),
            ),
            metadata=s.md,
        )
    except grpc.RpcError as err:
        return reason_of(err)
    return "ok"


def _clean(s: Stubs) -> None:
    r = s.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent=PARENT), metadata=s.md)
    assert (r.orphans, r.keys_without_record, r.records_without_key, r.index_drift) == (0,) * 4


def _offline(data: Path, env: dict[str, str], keys: Sequence[str] = ()) -> tuple[list[str], int]:
    """(key ids of the standing guards, how many of ``keys`` the shred log has), read offline."""
    from server import Store

    saved = os.environ.get("LETHE_KEK")
    os.environ["LETHE_KEK"] = env["LETHE_KEK"]
    try:
        store = Store(data, lock=False)
        try:
            ring = RingRef(OWNER, None)
            shredded = sum(1 for k in keys if store.keystore.shredded_at(ring, k) is not None)
            return [g.key_id for g in store.echo_guards(OWNER)], shredded
        finally:
            store.close()
    finally:
        if saved is None:
            os.environ.pop("LETHE_KEK", None)
        else:
            os.environ["LETHE_KEK"] = saved


def _killed_forget(
    tmp_path: Path, kek_env: str, point: str
) -> tuple[Path, dict[str, str], str, State]:
    """Set up, then a forget on a server armed with ``point``, which dies; the store and state."""
    data, env = tmp_path / "d", base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        state = _setup(clean.stubs(token))
    with serving(data, armed(env, point)) as doomed:
        with pytest.raises(grpc.RpcError):
            _forget(doomed.stubs(token), state)
        assert doomed.killed(), f"{point} was not reached"
    return data, env, token, state


def _nothing_happened_and_a_retry_does_it_all(
    data: Path, env: dict[str, str], token: str, state: State
) -> None:
    """The forget is wholly not applied, no guard stands; the retry applies it whole."""
    with serving(data, env) as again:
        s = again.stubs(token)
        said, echo = _turn(s, state["said"]), _turn(s, state["echo"])
        assert isinstance(said, threads_pb2.Turn)
        assert isinstance(echo, threads_pb2.Turn)
        assert not echo.tainted
        assert _summary(s) == "ok"  # no guard stands
        _clean(s)
        assert _forget(s, state).echoes_found == 1
        _clean(s)
    assert audit(data, env)[0] == 0


def test_a_kill_during_the_sweep_leaves_nothing_to_converge(tmp_path: Path, kek_env: str) -> None:
    data, env, token, state = _killed_forget(tmp_path, kek_env, "echo.sweep.after_read")
    assert _offline(data, env)[0] == []
    _nothing_happened_and_a_retry_does_it_all(data, env, token, state)


@pytest.mark.parametrize("moment", ["after_keystore", "after_commit"])
def test_a_kill_while_the_guard_key_is_made_converges(
    moment: str, tmp_path: Path, kek_env: str
) -> None:
    # after_keystore: a key no row names, destroyed at start-up; after_commit: the
    # bucket's key and its row, which stand until the bucket ends. No forget either way.
    data, env, token, state = _killed_forget(tmp_path, kek_env, f"echo.key.{moment}")
    _nothing_happened_and_a_retry_does_it_all(data, env, token, state)


@pytest.mark.parametrize("moment", ["after_keystore", "after_commit"])
def test_a_kill_in_the_plan_that_sets_a_guard_converges(
    moment: str, tmp_path: Path, kek_env: str
) -> None:
    data, env, token, state = _killed_forget(tmp_path, kek_env, f"forget.plan.{moment}")
    with serving(data, env) as again:
        s = again.stubs(token)
        echo = _turn(s, state["echo"])
        assert isinstance(echo, threads_pb2.Turn)
        if moment == "after_keystore":  # not decided: the bucket's key waits for its end
            assert isinstance(_turn(s, state["said"]), threads_pb2.Turn)
            assert not echo.tainted
            assert _summary(s) == "ok"
        else:  # decided: resumed, the echo tainted, the guard stands
            assert _turn(s, state["said"]) == "RECORD_DELETED"
            assert echo.tainted
            assert _summary(s) == "ECHOES_FORGOTTEN"
        _clean(s)
    assert len(_offline(data, env)[0]) == (1 if moment == "after_commit" else 0)
    assert audit(data, env)[0] == 0


@pytest.mark.parametrize("moment", ["after_keystore", "after_commit"])
def test_a_kill_while_a_guard_ends_converges(moment: str, tmp_path: Path, kek_env: str) -> None:
    data, env = tmp_path / "d", base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        s = clean.stubs(token)
        state = _setup(s)
        _forget(s, state, guard=0.5)
    keys, _ = _offline(data, env)
    assert len(keys) == 1
    time.sleep(1.6)  # a 0.5 s window ends at the next whole second
    # Start-up ends the guards whose window passed: the armed start dies there.
    with pytest.raises(RuntimeError, match="exit -9"):
        Server(data, armed(env, f"echo.expire.{moment}"))
    standing, shredded = _offline(data, env, keys)
    assert shredded == 1  # the key is destroyed at both moments (the keystore goes first)
    assert standing == (keys if moment == "after_keystore" else [])
    with serving(data, env) as again:  # the next start deletes what the kill left
        s = again.stubs(token)
        assert _summary(s) == "ok"
        _clean(s)
    assert _offline(data, env, keys) == ([], 1)
    assert audit(data, env)[0] == 0
