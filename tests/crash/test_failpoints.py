"""Every failpoint, on the real server process: arm it, reach it, die of SIGKILL, restart, converge.

Arm it, run the operation that reaches it, see the process die of SIGKILL,
restart on the same data directory, and check that the store converged — the
operation is wholly applied or wholly not (as the point's place decides), every
acknowledged write is readable, nothing forgotten comes back, and
``lethe audit`` is clean.

Each case runs three servers: a clean one for the set-up, an armed one that
dies, and a clean one for the checks. ``test_every_failpoint_has_a_case``
fails when a failpoint is declared without a case here.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from _harness import LETHE, OWNER, armed, audit, base_env, make_token, serving
from google.protobuf import field_mask_pb2

import server.cli  # noqa: F401  (declares the server's and the CLI's failpoints)
import shredder
from lethe._rpc import Stubs, reason_of
from lethe.v1 import (
    common_pb2,
    lifecycle_pb2,
    memories_pb2,
    repairs_pb2,
    retrieval_pb2,
    threads_pb2,
)
from server import token_digest
from server.edge import TOKEN_CACHE_SECONDS

M = memories_pb2.Memory
PARENT = f"owners/{OWNER}"
THREAD = f"{PARENT}/threads/t1"
State = dict[str, Any]


# ---------------------------------------------------------------------- calls


def _thread(s: Stubs, tid: str = "t1") -> str:
    return str(
        s.threads.CreateThread(
            threads_pb2.CreateThreadRequest(parent=PARENT, thread_id=tid), metadata=s.md
        ).name
    )


def _append(s: Stubs, texts: list[str], *, commit: bool = True, thread: str = THREAD) -> list[str]:
    resp = s.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=thread,
            turns=[
                threads_pb2.TurnInput(role=common_pb2.USER, text=t, commit=commit) for t in texts
            ],
        ),
        metadata=s.md,
    )
    return [t.name for t in resp.turns]


def _fact(s: Stubs, mid: str, text: str, sources: list[str], slot: str = "") -> M:
    return s.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=PARENT,
            memory_id=mid,
            memory=M(
                kind=M.FACT,
                text=text,
                slot=slot,
                state=common_pb2.COMMITTED,
                sources=[common_pb2.SourceRef(name=n, version=1) for n in sources],
            ),
        ),
        metadata=s.md,
    )


def _status(call: Callable[[], Any]) -> str:
    """``ok`` or ``CODE/REASON`` of a call."""
    try:
        call()
    except grpc.RpcError as err:
        return f"{err.code().name}/{reason_of(err)}"
    return "ok"


def _turn(s: Stubs, name: str) -> str:
    return _status(lambda: s.threads.GetTurn(threads_pb2.GetTurnRequest(name=name), metadata=s.md))


def _memory(s: Stubs, name: str) -> str:
    return _status(
        lambda: s.memories.GetMemory(memories_pb2.GetMemoryRequest(name=name), metadata=s.md)
    )


def _turns(s: Stubs, thread: str = THREAD) -> list[threads_pb2.Turn]:
    return list(
        s.threads.ListTurns(
            threads_pb2.ListTurnsRequest(parent=thread, page_size=1000), metadata=s.md
        ).turns
    )


def _memories(s: Stubs, **kw: Any) -> list[M]:
    return list(
        s.memories.ListMemories(
            memories_pb2.ListMemoriesRequest(parent=PARENT, page_size=1000, **kw), metadata=s.md
        ).memories
    )


def _repairs(s: Stubs) -> list[threads_pb2.Thread]:
    threads = s.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent=PARENT, include_repairs=True), metadata=s.md
    ).threads
    return [t for t in threads if t.kind == threads_pb2.Thread.REPAIR]


def _search(s: Stubs, text: str) -> list[str]:
    resp = s.retrieval.Search(
        retrieval_pb2.SearchRequest(
            parent=PARENT, query_text=text, top_k=20, mode=retrieval_pb2.SearchRequest.LEXICAL
        ),
        metadata=s.md,
    )
    return [h.turn.text for h in resp.hits if h.WhichOneof("record") == "turn"]


def _audit_rpc(s: Stubs) -> tuple[int, ...]:
    r = s.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent=PARENT), metadata=s.md)
    return (r.orphans, r.keys_without_record, r.records_without_key, r.index_drift)


# ---------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """A failpoint, the call that reaches it, and what must hold after the restart.

    ``setup`` runs on a clean server and returns the state the checks need;
    ``act`` runs on a server armed with ``point`` and must kill it; ``check``
    runs on a clean server on the same data.
    """

    point: str
    act: Callable[[Stubs, State], Any]
    check: Callable[[Stubs, State], None]
    setup: Callable[[Stubs], State] = field(default=lambda s: {})


def _with_thread(s: Stubs) -> State:
    _thread(s)
    return {}


def _with_turns(s: Stubs) -> State:
    _thread(s)
    names = _append(s, ["alpha harbour", "beta violin", "gamma orchard", "delta glacier"])
    fact = _fact(s, "f1", "fact from alpha", [names[0]])
    return {"turns": names, "fact": fact.name}


def _with_pending(s: Stubs) -> State:
    _thread(s)
    return {"turns": _append(s, ["pending lantern"], commit=False)}


def _with_seal(s: Stubs) -> State:
    state = _with_turns(s)
    repair = s.repairs.SealRepair(
        repairs_pb2.SealRepairRequest(thread=THREAD, from_seq=3), metadata=s.md
    )
    state["repair"] = repair.name
    return state


def _seal(s: Stubs, st: State) -> Any:
    return s.repairs.SealRepair(
        repairs_pb2.SealRepairRequest(thread=THREAD, from_seq=3), metadata=s.md
    )


def _forget_first(s: Stubs, st: State) -> Any:
    return s.lifecycle.Forget(lifecycle_pb2.ForgetRequest(names=[st["turns"][0]]), metadata=s.md)


def _check_forgotten(s: Stubs, st: State) -> None:
    assert _turn(s, st["turns"][0]) == "NOT_FOUND/RECORD_DELETED"
    assert _memory(s, st["fact"]) == "NOT_FOUND/RECORD_DELETED"
    assert [t.text for t in _turns(s)] == ["beta violin", "gamma orchard", "delta glacier"]
    assert _search(s, "alpha harbour") == []
    receipts = s.lifecycle.ListDeletions(
        lifecycle_pb2.ListDeletionsRequest(parent=PARENT), metadata=s.md
    ).receipts
    assert len(receipts) == 1
    assert all(d.done for d in receipts[0].destinations)


def _check_not_forgotten(s: Stubs, st: State) -> None:
    assert [_turn(s, n) for n in st["turns"]] == ["ok"] * 4
    assert _memory(s, st["fact"]) == "ok"
    assert _search(s, "alpha harbour")[0] == "alpha harbour"


def _check_not_sealed(s: Stubs, st: State) -> None:
    # The bug this suite was built for: a crash mid-seal destroyed the stretch.
    assert [_turn(s, n) for n in st["turns"]] == ["ok"] * 4
    assert _repairs(s) == []
    assert _search(s, "gamma orchard")[0] == "gamma orchard"
    _seal(s, st)  # and sealing it again works
    assert _turn(s, st["turns"][2]) == "FAILED_PRECONDITION/SEALED"


def _check_sealed(s: Stubs, st: State) -> None:
    assert [_turn(s, n) for n in st["turns"]] == ["ok", "ok", *["FAILED_PRECONDITION/SEALED"] * 2]
    (repair,) = _repairs(s)
    assert repair.repair.state == threads_pb2.RepairInfo.PAUSED
    opened = s.repairs.ReopenRepair(
        repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=s.md
    )
    assert [t.text for t in opened.turns] == ["gamma orchard", "delta glacier"]


def _conclude(s: Stubs, st: State) -> Any:
    return s.repairs.ConcludeRepair(
        repairs_pb2.ConcludeRepairRequest(
            name=st["repair"],
            outcome=threads_pb2.RepairInfo.DISTILL,
            lesson_text="ask before moving on",
        ),
        metadata=s.md,
    )


def _lessons(s: Stubs) -> list[str]:
    return [m.text for m in _memories(s, kinds=[M.LESSON])]


def _check_not_concluded(s: Stubs, st: State) -> None:
    (repair,) = _repairs(s)
    assert repair.repair.state == threads_pb2.RepairInfo.PAUSED
    assert _lessons(s) == []
    opened = s.repairs.ReopenRepair(
        repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=s.md
    )
    assert len(opened.turns) == 2
    _conclude(s, st)  # a retry concludes once
    assert _lessons(s) == ["ask before moving on"]


def _check_concluded(s: Stubs, st: State) -> None:
    (repair,) = _repairs(s)
    assert repair.repair.state == threads_pb2.RepairInfo.CONCLUDED
    assert _lessons(s) == ["ask before moving on"]
    assert [_turn(s, n) for n in st["turns"][2:]] == ["NOT_FOUND/RECORD_DELETED"] * 2


def _tagged_append(s: Stubs, st: State) -> Any:
    tag = M(kind=M.COMMITMENT, text="check the train times")
    return s.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=THREAD,
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT, text="I will check", commit=True, tags=[tag]
                ),
                threads_pb2.TurnInput(role=common_pb2.USER, text="thanks", commit=True),
            ],
        ),
        metadata=s.md,
    )


def _check_appended(applied: bool) -> Callable[[Stubs, State], None]:
    def check(s: Stubs, st: State) -> None:
        texts = [t.text for t in _turns(s)]
        candidates = [m.text for m in _memories(s)]
        if applied:
            assert texts == ["I will check", "thanks"]
            assert candidates == ["check the train times"]
        else:
            assert (texts, candidates) == ([], [])
            _tagged_append(s, st)  # the retry stores both
            assert len(_memories(s)) == 1

    return check


def _thread_exists(applied: bool) -> Callable[[Stubs, State], None]:
    def check(s: Stubs, st: State) -> None:
        got = _status(
            lambda: s.threads.GetThread(threads_pb2.GetThreadRequest(name=THREAD), metadata=s.md)
        )
        assert got == ("ok" if applied else "NOT_FOUND/NOT_FOUND")

    return check


def _commit(s: Stubs, st: State) -> Any:
    return s.lifecycle.Commit(lifecycle_pb2.CommitRequest(names=st["turns"]), metadata=s.md)


def _turn_state(state: int) -> Callable[[Stubs, State], None]:
    def check(s: Stubs, st: State) -> None:
        got = s.threads.GetTurn(threads_pb2.GetTurnRequest(name=st["turns"][0]), metadata=s.md)
        assert got.state == state

    return check


def _extend(s: Stubs, st: State) -> Any:
    st_ttl = lifecycle_pb2.ExtendPendingRequest(names=st["turns"])
    st_ttl.ttl.FromSeconds(3600 * 1000)
    return s.lifecycle.ExtendPending(st_ttl, metadata=s.md)


def _extended(applied: bool) -> Callable[[Stubs, State], None]:
    def check(s: Stubs, st: State) -> None:
        got = s.threads.GetTurn(threads_pb2.GetTurnRequest(name=st["turns"][0]), metadata=s.md)
        long = got.expire_time.seconds - got.create_time.seconds > 3600 * 500
        assert long == applied

    return check


def _retain_thread(s: Stubs, st: State) -> Any:
    request = lifecycle_pb2.SetRetentionRequest(names=[THREAD])
    request.ttl.FromSeconds(3600 * 1000)
    return s.lifecycle.SetRetention(request, metadata=s.md)


def _retained(applied: bool) -> Callable[[Stubs, State], None]:
    """The thread and every turn of it carry the retention, or none of them does."""

    def check(s: Stubs, st: State) -> None:
        thread = s.threads.GetThread(threads_pb2.GetThreadRequest(name=THREAD), metadata=s.md)
        assert thread.HasField("expire_time") == applied
        assert {t.HasField("expire_time") for t in _turns(s)} == {applied}

    return check


def _owner_default(s: Stubs, st: State) -> Any:
    request = lifecycle_pb2.SetRetentionRequest(names=[PARENT])
    request.ttl.FromSeconds(3600 * 1000)
    return s.lifecycle.SetRetention(request, metadata=s.md)


def _owner_default_set(applied: bool) -> Callable[[Stubs, State], None]:
    """A memory created after the restart carries the owner's default, or none."""

    def check(s: Stubs, st: State) -> None:
        made = _fact(s, "after-restart", "a fact made after the restart", [])
        assert made.HasField("expire_time") == applied

    return check


def _create_fact(s: Stubs, st: State) -> Any:
    return _fact(s, "f9", "a fact about lanterns", [])


def _fact_exists(applied: bool) -> Callable[[Stubs, State], None]:
    def check(s: Stubs, st: State) -> None:
        assert _memory(s, f"{PARENT}/memories/f9") == ("ok" if applied else "NOT_FOUND/NOT_FOUND")

    return check


def _update(s: Stubs, st: State) -> Any:
    return s.memories.UpdateMemory(
        memories_pb2.UpdateMemoryRequest(
            memory=M(name=f"{PARENT}/memories/q1", text="corrected"),
            update_mask=field_mask_pb2.FieldMask(paths=["text"]),
        ),
        metadata=s.md,
    )


def _upsert(name: str, text: str) -> Callable[[Stubs, State], Any]:
    """``UpdateMemory`` with ``allow_missing``: the create path or the update path, one op each."""

    def act(s: Stubs, st: State) -> Any:
        return s.memories.UpdateMemory(
            memories_pb2.UpdateMemoryRequest(
                memory=M(name=f"{PARENT}/memories/{name}", kind=M.FACT, text=text),
                update_mask=field_mask_pb2.FieldMask(paths=["text"]),
                allow_missing=True,
            ),
            metadata=s.md,
        )

    return act


def _batch(s: Stubs, st: State) -> Any:
    """``BatchUpdateMemories``: an update of q1 and the creation of f9, one op."""
    requests = [
        memories_pb2.UpdateMemoryRequest(
            memory=M(name=f"{PARENT}/memories/{name}", kind=M.FACT, text=text),
            update_mask=field_mask_pb2.FieldMask(paths=["text"]),
            allow_missing=True,
        )
        for name, text in (("q1", "corrected"), ("f9", "a fact about lanterns"))
    ]
    return s.memories.BatchUpdateMemories(
        memories_pb2.BatchUpdateMemoriesRequest(parent=PARENT, requests=requests), metadata=s.md
    )


def _batch_applied(applied: bool) -> Callable[[Stubs, State], None]:
    """Both writes of :func:`_batch` landed, or neither did."""
    created, version = _fact_exists(applied), _fact_version(2 if applied else 1)

    def check(s: Stubs, st: State) -> None:
        created(s, st)
        version(s, st)

    return check


def _with_fact(s: Stubs) -> State:
    _fact(s, "q1", "original", [])
    return {}


def _fact_version(version: int) -> Callable[[Stubs, State], None]:
    def check(s: Stubs, st: State) -> None:
        got = s.memories.GetMemory(
            memories_pb2.GetMemoryRequest(name=f"{PARENT}/memories/q1"), metadata=s.md
        )
        assert (got.version, got.text) == (version, "corrected" if version == 2 else "original")

    return check


def _with_question(s: Stubs) -> State:
    s.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=PARENT,
            memory_id="oq",
            memory=M(kind=M.OPEN_QUESTION, text="which date?", state=common_pb2.COMMITTED),
        ),
        metadata=s.md,
    )
    return {}


def _transition(s: Stubs, st: State) -> Any:
    return s.memories.TransitionMemory(
        memories_pb2.TransitionMemoryRequest(name=f"{PARENT}/memories/oq", status=M.ANSWERED),
        metadata=s.md,
    )


def _question_status(status: int) -> Callable[[Stubs, State], None]:
    def check(s: Stubs, st: State) -> None:
        got = s.memories.GetMemory(
            memories_pb2.GetMemoryRequest(name=f"{PARENT}/memories/oq"), metadata=s.md
        )
        assert got.status == status

    return check


def _reopen(s: Stubs, st: State) -> Any:
    return s.repairs.ReopenRepair(repairs_pb2.ReopenRepairRequest(name=st["repair"]), metadata=s.md)


def _repair_state(state: int) -> Callable[[Stubs, State], None]:
    def check(s: Stubs, st: State) -> None:
        (repair,) = _repairs(s)
        assert repair.repair.state == state

    return check


def _slotted(s: Stubs, st: State) -> Any:
    return _fact(s, "s1", "guests: 40", [], slot="event.guests")


def _slot_holder(applied: bool) -> Callable[[Stubs, State], None]:
    def check(s: Stubs, st: State) -> None:
        assert _memory(s, f"{PARENT}/memories/s1") == ("ok" if applied else "NOT_FOUND/NOT_FOUND")
        if not applied:
            _slotted(s, st)
        clash = _status(lambda: _fact(s, "s2", "guests: 50", [], slot="event.guests"))
        assert clash == "ALREADY_EXISTS/SLOT_CONFLICT"

    return check


def _with_slot(s: Stubs) -> State:
    _fact(s, "s1", "guests: 40", [], slot="event.guests")
    return {}


def _conflict(s: Stubs, st: State) -> Any:
    return _fact(s, "s2", "guests: 50", [], slot="event.guests")


def _one_holder(s: Stubs, st: State) -> None:
    assert _memory(s, f"{PARENT}/memories/s1") == "ok"
    assert _memory(s, f"{PARENT}/memories/s2") == "NOT_FOUND/NOT_FOUND"


def _assemble(s: Stubs, st: State) -> Any:
    return s.retrieval.AssembleContext(
        retrieval_pb2.AssembleContextRequest(thread=THREAD, query_text="harbour"), metadata=s.md
    )


def _intact(s: Stubs, st: State) -> None:
    _check_not_forgotten(s, st)


def _applied_and_not(
    point: str,
    act: Callable[[Stubs, State], Any],
    applied: Callable[[Stubs, State], None],
    not_applied: Callable[[Stubs, State], None],
    setup: Callable[[Stubs], State] = lambda s: {},
) -> list[Case]:
    """The op's two points: the keystore commit (no data applied) and the data commit (all applied).

    After the keystore commit nothing of the data is applied; after the data
    commit all of it is.
    """
    return [
        Case(f"{point}.after_keystore", act, not_applied, setup),
        Case(f"{point}.after_commit", act, applied, setup),
    ]


CASES: list[Case] = [
    *_applied_and_not(
        "thread.create", lambda s, st: _thread(s), _thread_exists(True), _thread_exists(False)
    ),
    *_applied_and_not(
        "append", _tagged_append, _check_appended(True), _check_appended(False), _with_thread
    ),
    *_applied_and_not(
        "commit",
        _commit,
        _turn_state(common_pb2.COMMITTED),
        _turn_state(common_pb2.PENDING),
        _with_pending,
    ),
    *_applied_and_not("extend", _extend, _extended(True), _extended(False), _with_pending),
    *_applied_and_not(
        "retention.set", _retain_thread, _retained(True), _retained(False), _with_turns
    ),
    *_applied_and_not(
        "retention.owner",
        _owner_default,
        _owner_default_set(True),
        _owner_default_set(False),
        _with_thread,
    ),
    *_applied_and_not("memory.create", _create_fact, _fact_exists(True), _fact_exists(False)),
    *_applied_and_not("memory.update", _update, _fact_version(2), _fact_version(1), _with_fact),
    # An upsert is one of those two ops, whichever path it takes.
    *_applied_and_not(
        "memory.create", _upsert("f9", "upserted"), _fact_exists(True), _fact_exists(False)
    ),
    *_applied_and_not(
        "memory.update",
        _upsert("q1", "corrected"),
        _fact_version(2),
        _fact_version(1),
        _with_fact,
    ),
    *_applied_and_not(
        "memory.batch", _batch, _batch_applied(True), _batch_applied(False), _with_fact
    ),
    *_applied_and_not(
        "memory.transition",
        _transition,
        _question_status(M.ANSWERED),
        _question_status(M.OPEN),
        _with_question,
    ),
    *_applied_and_not("slot.key", _slotted, _slot_holder(False), _slot_holder(False)),
    *_applied_and_not("event", _conflict, _one_holder, _one_holder, _with_slot),
    *_applied_and_not("manifest", _assemble, _intact, _intact, _with_turns),
    Case("forget.plan.after_keystore", _forget_first, _check_not_forgotten, _with_turns),
    # Once step 1 committed the forget is decided: every later crash completes it.
    Case("forget.plan.after_commit", _forget_first, _check_forgotten, _with_turns),
    Case("forget.finish.after_keystore", _forget_first, _check_forgotten, _with_turns),
    Case("forget.finish.after_commit", _forget_first, _check_forgotten, _with_turns),
    *_applied_and_not("seal", _seal, _check_sealed, _check_not_sealed, _with_turns),
    *_applied_and_not(
        "repair.state",
        _reopen,
        _repair_state(threads_pb2.RepairInfo.CONTINUED),
        _repair_state(threads_pb2.RepairInfo.PAUSED),
        _with_seal,
    ),
    *_applied_and_not(
        "repair.conclude", _conclude, _check_concluded, _check_not_concluded, _with_seal
    ),
    Case("writer.before_commit", _forget_first, _check_not_forgotten, _with_turns),
]


def _run(case: Case, tmp_path: Path, kek_env: str) -> None:
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        state = case.setup(clean.stubs(token))
    with serving(data, armed(env, case.point)) as doomed:
        with pytest.raises(grpc.RpcError) as err:
            case.act(doomed.stubs(token), state)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert doomed.killed(), f"{case.point} was not reached"
    with serving(data, env) as again:
        s = again.stubs(token)
        case.check(s, state)
        assert _audit_rpc(s) == (0, 0, 0, 0)
    rc, out = audit(data, env)
    assert rc == 0, out


@pytest.mark.parametrize("case", CASES, ids=[c.point for c in CASES])
def test_crash_at_failpoint_converges(case: Case, tmp_path: Path, kek_env: str) -> None:
    _run(case, tmp_path, kek_env)


# ---------------------------------------------------------------------- the sweeper's writes


def _with_expiring(s: Stubs) -> State:
    _thread(s)
    inp = threads_pb2.TurnInput(role=common_pb2.USER, text="expiring soon")
    inp.pending_ttl.FromSeconds(1800)  # inside the default 1 h PENDING_EXPIRING window
    resp = s.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(parent=THREAD, turns=[inp]), metadata=s.md
    )
    return {"turns": [resp.turns[0].name]}


def _with_due(s: Stubs) -> State:
    mem = M(kind=M.COMMITMENT, text="call back", state=common_pb2.COMMITTED)
    mem.due_time.FromSeconds(1)
    s.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(parent=PARENT, memory_id="c1", memory=mem), metadata=s.md
    )
    return {}


def _still_pending(s: Stubs, st: State) -> None:
    got = s.threads.GetTurn(threads_pb2.GetTurnRequest(name=st["turns"][0]), metadata=s.md)
    assert got.state == common_pb2.PENDING


def _commitment_open(s: Stubs, st: State) -> None:
    got = s.memories.GetMemory(
        memories_pb2.GetMemoryRequest(name=f"{PARENT}/memories/c1"), metadata=s.md
    )
    assert got.status == M.OPEN


SWEEPER_CASES = [
    (f"{op}.{moment}", setup, check)
    for op, setup, check in (
        ("expiry.warn", _with_expiring, _still_pending),
        ("commitments.due", _with_due, _commitment_open),
        ("events.prune", _with_expiring, _still_pending),
    )
    for moment in ("after_keystore", "after_commit")
]


@pytest.mark.parametrize(
    ("point", "setup", "check"), SWEEPER_CASES, ids=[c[0] for c in SWEEPER_CASES]
)
def test_crash_in_a_sweeper_write_converges(
    point: str,
    setup: Callable[[Stubs], State],
    check: Callable[[Stubs, State], None],
    tmp_path: Path,
    kek_env: str,
) -> None:
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        state = setup(clean.stubs(token))
    with serving(data, armed(env, point), "--sweep-interval", "200ms") as doomed:
        assert doomed.killed(), f"{point} was not reached"
    with serving(data, env) as again:
        s = again.stubs(token)
        check(s, state)
        assert _audit_rpc(s) == (0, 0, 0, 0)
    assert audit(data, env)[0] == 0


# ---------------------------------------------------------------------- start-up recovery


@pytest.mark.parametrize("moment", ["after_keystore", "after_commit"])
def test_crash_while_relocating_keys_at_start_converges(
    moment: str, tmp_path: Path, kek_env: str
) -> None:
    """A seal cut after its keystore commit, then a killed start-up: the next start finishes it.

    The cut seal leaves keys in the repair's ring; the start-up that moves them
    back is itself killed; the next start finishes the job and the stretch is
    intact.
    """
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        state = _with_turns(clean.stubs(token))
    with serving(data, armed(env, "seal.after_keystore")) as doomed:
        with pytest.raises(grpc.RpcError):
            _seal(doomed.stubs(token), state)
        assert doomed.killed()
    with (
        pytest.raises(RuntimeError, match="exit -9"),
        serving(data, armed(env, f"keys.relocate.{moment}")),
    ):
        pass  # it dies during recovery, before it serves
    with serving(data, env) as again:
        s = again.stubs(token)
        _check_not_sealed(s, state)
        assert _audit_rpc(s) == (0, 0, 0, 0)
    assert audit(data, env)[0] == 0


@pytest.mark.parametrize("moment", ["after_keystore", "after_commit"])
def test_crash_while_destroying_stray_keys_at_start_converges(
    moment: str, tmp_path: Path, kek_env: str
) -> None:
    """A key no record uses, then a killed start-up: the next start destroys it.

    CreateThread cut after its keystore commit leaves a key no record uses;
    the start-up that destroys it is killed.
    """
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, armed(env, "thread.create.after_keystore")) as doomed:
        with pytest.raises(grpc.RpcError):
            _thread(doomed.stubs(token))
        assert doomed.killed()
    with (
        pytest.raises(RuntimeError, match="exit -9"),
        serving(data, armed(env, f"keys.destroy_stray.{moment}")),
    ):
        pass
    with serving(data, env) as again:
        s = again.stubs(token)
        _thread_exists(False)(s, {})
        assert _audit_rpc(s) == (0, 0, 0, 0)
    assert audit(data, env)[0] == 0


# ---------------------------------------------------------------------- rotation, backup, restore


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LETHE, *args], env=env, capture_output=True, text=True)


def _kek_versions(path: Path) -> int:
    import json

    return len(json.loads(path.read_text())["keys"])


@pytest.mark.parametrize(
    "point",
    [
        "rotation.after_keystore",
        "rotation.after_commit",
        "keystore.rotate.after_kek",
        "keystore.rotate.after_rewrap",
    ],
)
def test_crash_mid_rotation_converges(point: str, tmp_path: Path) -> None:
    """``lethe rotate`` killed at each step: the store opens and nothing kept or forgotten changes.

    Everything kept is readable, nothing forgotten comes back, and the next
    start leaves at most the KEK versions that still wrap a ring key.
    """
    data = tmp_path / "d"
    kek = tmp_path / "config" / "kek.json"
    env = {k: v for k, v in base_env("").items() if k != "LETHE_KEK"}
    env["TEST_KEK_FILE"] = str(kek)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        s = clean.stubs(token)
        state = _with_turns(s)
        _forget_first(s, state)
    done = _cli(armed(env, point), "rotate", "--data", str(data), "--kek-file", str(kek))
    assert done.returncode == -9, done.stderr
    with serving(data, env) as again:
        s = again.stubs(token)
        _check_forgotten(s, state)
        assert _audit_rpc(s) == (0, 0, 0, 0)
    assert audit(data, env)[0] == 0
    assert _kek_versions(kek) <= 2
    assert _cli(env, "rotate", "--data", str(data), "--kek-file", str(kek)).returncode == 0
    assert _kek_versions(kek) == 1


def _opens_forgotten(copy: Path, kek_file: Path, name: str) -> bool:
    """Whether ``copy``'s data and keystore, with ``kek_file`` as the KEK, open a turn.

    ``name`` is the turn's name, ``owners/{o}/threads/{t}/turns/{seq}``.
    """
    from server.store import Store

    parts = name.split("/")
    thread, seq = parts[3], int(parts[5])
    try:
        store = Store(copy, kek_file=kek_file, lock=False)
    except Exception:  # not a KEK file, or one that opens nothing of this store
        return False
    try:
        metas = [m for m in store.thread_turns(OWNER, thread) if m.seq == seq]
        rows = store.fetch([m.rid for m in metas])
        for meta, cts in rows.values():
            with contextlib.suppress(Exception):  # a key that does not open: not this one
                store.turn_view(meta, cts, with_embedding=False)  # type: ignore[arg-type]
                return True
        return False
    finally:
        store.close()


@pytest.mark.parametrize(
    ("point", "action"),
    [
        ("keystore.rotate.after_kek", "kill"),
        ("keystore.rotate.after_rewrap", "kill"),
        ("kek.write.after_temp", "kill"),  # adding the new KEK version
        ("kek.write.after_temp", "kill@2"),  # destroying the old versions
        ("kek.write.after_replace", "kill"),
        ("kek.write.after_replace", "kill@2"),
    ],
)
def test_no_file_left_by_a_killed_rotation_opens_a_pre_forget_copy(
    point: str, action: str, tmp_path: Path
) -> None:
    """No file a killed rotation leaves in the KEK's directory opens a pre-forget copy.

    ``lethe rotate`` is killed at each step of the rotation and of each KEK file
    write, then the store is started and rotated again: no file in the KEK's
    directory, stray temporary KEK files included, opens the forgotten turn in a
    copy of the data and the keystore taken before the forget (as an old backup
    and a keystore snapshot would hold it). A temporary KEK file a kill left once
    held the old KEK version after the rotation that destroyed it.
    """
    data = tmp_path / "d"
    kek = tmp_path / "config" / "kek.json"
    env = {k: v for k, v in base_env("").items() if k != "LETHE_KEK"}
    env["TEST_KEK_FILE"] = str(kek)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        state = _with_turns(clean.stubs(token))
    copy = tmp_path / "before-forget"
    shutil.copytree(data, copy, ignore=shutil.ignore_patterns("lethe.lock"))
    forgotten = state["turns"][0]
    assert _opens_forgotten(copy, kek, forgotten)  # the copy is a real one
    with serving(data, env) as again:
        _forget_first(again.stubs(token), state)
    done = _cli(
        {**env, "LETHE_FAILPOINTS": f"{point}={action}"},
        "rotate",
        "--data",
        str(data),
        "--kek-file",
        str(kek),
    )
    assert done.returncode == -9, done.stderr
    with serving(data, env) as again:  # start-up removes what the kill left
        _check_forgotten(again.stubs(token), state)
    assert _cli(env, "rotate", "--data", str(data), "--kek-file", str(kek)).returncode == 0
    left = sorted(p for p in kek.parent.iterdir() if p.is_file())
    opening = [p.name for p in left if _opens_forgotten(copy, p, forgotten)]
    assert opening == []
    assert left == [kek]
    assert audit(data, env)[0] == 0


def test_the_audit_counts_a_stray_kek_file_and_the_next_start_removes_it(
    tmp_path: Path,
) -> None:
    """A stray temporary KEK file fails ``lethe audit`` until the next start removes it.

    The rotation is killed with its temporary KEK file written; ``lethe audit``
    (server stopped) reports it and exits 1.
    """
    data = tmp_path / "d"
    kek = tmp_path / "config" / "kek.json"
    env = {k: v for k, v in base_env("").items() if k != "LETHE_KEK"}
    env["TEST_KEK_FILE"] = str(kek)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        _forget_first(clean.stubs(token), _with_turns(clean.stubs(token)))
    killed = _cli(
        armed(env, "kek.write.after_temp"), "rotate", "--data", str(data), "--kek-file", str(kek)
    )
    assert killed.returncode == -9, killed.stderr
    strays = [p for p in kek.parent.iterdir() if p.name.endswith(".tmp")]
    assert len(strays) == 1
    assert strays[0].stat().st_mode & 0o777 == 0o600
    status, output = audit(data, env)
    assert status == 1
    assert "stray_key_files: 1" in output
    with serving(data, env):
        pass
    assert [p for p in kek.parent.iterdir() if p.name.endswith(".tmp")] == []
    assert audit(data, env)[0] == 0


def _token_cli(env: dict[str, str], data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _cli(env, "token", *args, "--data", str(data))


def _refused(s: Stubs) -> bool:
    try:
        _turns(s)
    except grpc.RpcError as err:
        return reason_of(err) == "INVALID_TOKEN"
    return False


@pytest.mark.parametrize("point", ["token.revoke.after_keystore", "token.revoke.after_commit"])
def test_a_revocation_killed_midway_holds_at_once_and_after_a_restart(
    point: str, tmp_path: Path, kek_env: str
) -> None:
    """``lethe token revoke`` killed after the keystore's ledger took the revocation.

    The running server refuses the token within its token cache's period
    (``TOKEN_CACHE_SECONDS``: it reads the ledger), and after a restart the
    data's copy agrees.
    """
    data = tmp_path / "d"
    env = base_env(kek_env)
    admin = make_token(data, env)
    token = make_token(data, env, OWNER)
    token_id = token_digest(token)[:8].hex()
    with serving(data, env) as live:
        _with_turns(live.stubs(token))
        done = _token_cli(armed(env, point), data, "revoke", token_id)
        assert done.returncode == -9, done.stderr
        time.sleep(TOKEN_CACHE_SECONDS)  # the row the last call cached answers until then
        assert _refused(live.stubs(token))
        assert not _refused(live.stubs(admin))
    with serving(data, env) as again:
        assert _refused(again.stubs(token))
    listed = json.loads(_token_cli(env, data, "list", "--json").stdout)["tokens"]
    assert {t["id"]: t["state"] for t in listed}[token_id] == "revoked"
    assert audit(data, env)[0] == 0


@pytest.mark.parametrize("point", ["token.create.after_keystore", "token.create.after_commit"])
def test_a_token_creation_killed_midway_converges(point: str, tmp_path: Path, kek_env: str) -> None:
    """``lethe token create`` killed before it printed the token converges.

    The store opens and agrees with its ledger; the unprinted token is one nobody holds.
    """
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    done = _token_cli(armed(env, point), data, "create", "--owner", OWNER)
    assert done.returncode == -9, done.stderr
    assert "lethe_" not in done.stdout  # never printed
    with serving(data, env) as again:
        assert not _refused(again.stubs(token))
    listed = json.loads(_token_cli(env, data, "list", "--json").stdout)["tokens"]
    assert len(listed) == 2  # the one made above, and the unprinted one the ledger took
    assert audit(data, env)[0] == 0


@pytest.mark.parametrize(
    "point", ["tokens.reconcile.after_keystore", "tokens.reconcile.after_commit"]
)
def test_a_restore_killed_while_it_reconciles_tokens_converges(
    point: str, tmp_path: Path, kek_env: str
) -> None:
    """``lethe restore`` killed while it reconciles the tokens: the next start finishes it.

    The restored copy of the tokens is brought in line with the ledger; revoked
    stays revoked.
    """
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        _with_turns(clean.stubs(token))
    out = tmp_path / "backup"
    assert _cli(env, "backup", "--data", str(data), "--out", str(out)).returncode == 0
    token_id = token_digest(token)[:8].hex()
    assert _token_cli(env, data, "revoke", token_id).returncode == 0
    done = _cli(armed(env, point), "restore", "--backup", str(out), "--data", str(data))
    assert done.returncode == -9, done.stderr
    with serving(data, env) as again:
        assert _refused(again.stubs(token))
    listed = json.loads(_token_cli(env, data, "list", "--json").stdout)["tokens"]
    assert {t["id"]: t["state"] for t in listed}[token_id] == "revoked"
    assert audit(data, env)[0] == 0


def test_crash_mid_backup_leaves_a_backup_that_restore_refuses(
    tmp_path: Path, kek_env: str
) -> None:
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        state = _with_turns(clean.stubs(token))
    out = tmp_path / "backup"
    done = _cli(armed(env, "backup.after_copy"), "backup", "--data", str(data), "--out", str(out))
    assert done.returncode == -9, done.stderr
    assert (out / "data.mdb").exists()
    assert not (out / "MANIFEST.json").exists()
    refused = _cli(env, "restore", "--backup", str(out), "--data", str(data))
    assert refused.returncode == 2
    assert "not a lethe backup" in refused.stderr
    with serving(data, env) as again:
        _check_not_forgotten(again.stubs(token), state)
    assert audit(data, env)[0] == 0


def test_crash_mid_restore_is_finished_by_the_next_start(tmp_path: Path, kek_env: str) -> None:
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        state = _with_turns(clean.stubs(token))
    out = tmp_path / "backup"
    assert _cli(env, "backup", "--data", str(data), "--out", str(out)).returncode == 0
    with serving(data, env) as clean:
        _forget_first(clean.stubs(token), state)
    done = _cli(
        armed(env, "restore.after_replace"), "restore", "--backup", str(out), "--data", str(data)
    )
    assert done.returncode == -9, done.stderr
    with serving(data, env) as again:
        s = again.stubs(token)
        # The backup holds the forgotten turn; its key was shredded on purpose.
        assert _turn(s, state["turns"][0]) == "NOT_FOUND/RECORD_DELETED"
        assert [t.text for t in _turns(s)] == ["beta violin", "gamma orchard", "delta glacier"]
        assert _audit_rpc(s) == (0, 0, 0, 0)
    assert audit(data, env)[0] == 0


def test_an_injected_disk_error_is_unavailable_and_applies_nothing(
    tmp_path: Path, kek_env: str
) -> None:
    """``writer.before_commit=eio``: every write fails UNAVAILABLE before its data commit.

    Never INTERNAL; the process keeps serving reads; a restart without the
    fault finds exactly what was acknowledged.
    """
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        state = _with_turns(clean.stubs(token))
    with serving(data, armed(env, "writer.before_commit", "eio")) as faulty:
        s = faulty.stubs(token)
        for call in (lambda: _forget_first(s, state), lambda: _thread(s, "t2")):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert (err.value.code(), reason_of(err.value)) == (
                grpc.StatusCode.UNAVAILABLE,
                "STORAGE_UNAVAILABLE",
            )
        _check_not_forgotten(s, state)  # reads keep working
        assert faulty.proc.poll() is None
    with serving(data, env) as again:
        s = again.stubs(token)
        _check_not_forgotten(s, state)
        assert (
            _status(
                lambda: s.threads.GetThread(
                    threads_pb2.GetThreadRequest(name=f"{PARENT}/threads/t2"), metadata=s.md
                )
            )
            == "NOT_FOUND/NOT_FOUND"
        )
        assert _audit_rpc(s) == (0, 0, 0, 0)
    assert audit(data, env)[0] == 0


def test_a_disk_error_between_the_keystore_and_the_data_fails_that_write_alone(
    tmp_path: Path, kek_env: str
) -> None:
    """``thread.create.after_keystore=eio``: that write fails, the writer goes on.

    The bug (found by a probe): an error raised between a group's keystore
    transactions and its data transaction escaped the writer thread, which
    died; every later write hung and SIGTERM no longer stopped the server.
    Now the group fails as a data-phase storage error (``UNAVAILABLE``), its
    record keys are destroyed, and other writes still commit.
    """
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        state = _with_turns(clean.stubs(token))
    with serving(data, armed(env, "thread.create.after_keystore", "eio")) as faulty:
        s = faulty.stubs(token)
        with pytest.raises(grpc.RpcError) as err:
            _thread(s, "t2")
        assert (err.value.code(), reason_of(err.value)) == (
            grpc.StatusCode.UNAVAILABLE,
            "STORAGE_UNAVAILABLE",
        )
        _forget_first(s, state)  # another write: the writer thread is alive
        assert faulty.proc.poll() is None
    with serving(data, env) as again:  # the armed server stopped on SIGTERM
        s = again.stubs(token)
        assert (
            _status(
                lambda: s.threads.GetThread(
                    threads_pb2.GetThreadRequest(name=f"{PARENT}/threads/t2"), metadata=s.md
                )
            )
            == "NOT_FOUND/NOT_FOUND"
        )
        assert _turn(s, state["turns"][0]) == "NOT_FOUND/RECORD_DELETED"
        assert _audit_rpc(s) == (0, 0, 0, 0)
    assert audit(data, env)[0] == 0


# ---------------------------------------------------------------------- coverage


COVERED = (
    {c.point for c in CASES}
    | {c[0] for c in SWEEPER_CASES}
    | {
        "keys.relocate.after_keystore",
        "keys.relocate.after_commit",
        "keys.destroy_stray.after_keystore",
        "keys.destroy_stray.after_commit",
        "rotation.after_keystore",
        "rotation.after_commit",
        "keystore.rotate.after_kek",
        "keystore.rotate.after_rewrap",
        "kek.write.after_temp",
        "kek.write.after_replace",
        "token.create.after_keystore",
        "token.create.after_commit",
        "token.revoke.after_keystore",
        "token.revoke.after_commit",
        "tokens.reconcile.after_keystore",
        "tokens.reconcile.after_commit",
        "backup.after_copy",
        "restore.after_replace",
    }
    # tests/crash/test_echo_crash.py: a forget's echo sweep and the end of its guard.
    | {"echo.sweep.after_read", "echo.key.after_keystore", "echo.key.after_commit"}
    | {"echo.expire.after_keystore", "echo.expire.after_commit"}
    # tests/crash/test_reembed_crash.py: a change of embedder killed at each step.
    | {
        "embedder.record.after_keystore",
        "embedder.record.after_commit",
        "reembed.batch",
        "reembed.after_keystore",
        "reembed.after_commit",
    }
    # tests/crash/test_snapshot_crash.py: an index snapshot's write killed at each step.
    | {
        "snapshot.key.after_keystore",
        "snapshot.key.after_commit",
        "snapshot.after_temp",
        "snapshot.after_rename",
    }
    # tests/test_owner_move.py: an owner move killed at each step, then run again.
    | {
        "move.export.after_marker",
        "move.import.after_marker",
        "move.import.after_keys",
        "owner.import.after_keystore",
        "owner.import.after_commit",
        "move.import.after_rows",
        "move.release.after_marker",
        "move.release.after_keys",
        "owner.purge.after_keystore",
        "owner.purge.after_commit",
    }
)
# The test-only unnamed op of tests/server/store/test_writer.py.
NOT_IN_THE_SERVER = {"write.after_keystore", "write.after_commit"}


def test_every_failpoint_has_a_case() -> None:
    assert set(shredder.POINTS) - NOT_IN_THE_SERVER - COVERED == set()
    assert COVERED - set(shredder.POINTS) == set()
