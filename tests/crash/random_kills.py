"""The crash harness: every mutating RPC against the real server, SIGKILLed at random moments.

A mixed load; after every kill the server is restarted and checked.

Each round starts ``lethe serve`` (with rotation running every second against a
KEK file), runs a client *process* that drives appends (committed and
pending), commits, memories derived from turns, corrections, forgets of turns,
memories and threads, seals, reopens and DESTROY conclusions, and logs every
call to a JSON-lines log — ``intent`` before, ``ack`` after. The parent kills
the server after a random delay, restarts it, and checks the log against the
store: every acknowledged write is there as it was acknowledged, everything
acknowledged as forgotten (with what was derived from it) answers
``RECORD_DELETED``, every acknowledged seal holds, and ``Lifecycle.Audit`` is
clean. A call in flight at the kill (an intent without an ack) may have gone
either way, but wholly: the parent observes which (``settle``), fails on a
partial effect, and records the outcome, so nothing stays undecided. At the
end the offline ``lethe audit`` must exit 0.

Rotation is killed with the rest (it runs every second), so every round also
copies the data directory — the data and the keystore, as an old backup and a
keystore snapshot would hold them (the last :data:`COPIES` are kept). At the
end one more ``lethe rotate`` completes every shred, and then no file in the
KEK's directory may open, in any of those copies, a turn acknowledged as
forgotten (a temporary KEK file a killed rotation left behind once did).

With ``--processes N`` the server is ``lethe serve --processes N`` and the
client spreads its calls over 4 connections (which the kernel spreads over the
N processes); each kill SIGKILLs every process, at the random moment, while
several of them write.

Short form (CI): ``tests/crash/test_random_kills.py`` runs 10 kills, and 5
with ``--processes 2``. Full form::

    .venv/bin/python tests/crash/random_kills.py --kills 100 [--processes 2]

prints the figures (kills survived, acknowledged operations checked).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import field_mask_pb2

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

from _harness import LETHE, OWNER, Server, audit, make_token  # noqa: E402

from lethe._rpc import Stubs, reason_of  # noqa: E402
from lethe.v1 import (  # noqa: E402
    common_pb2,
    lifecycle_pb2,
    memories_pb2,
    repairs_pb2,
    threads_pb2,
)

M = memories_pb2.Memory
PARENT = f"owners/{OWNER}"
WORDS = ["harbour", "violin", "orchard", "glacier", "lantern", "meadow", "compass", "saffron"]


# ---------------------------------------------------------------------- the client process


class Log:
    """The client's JSON-lines log: one ``intent`` before each call, one ``ack`` after its reply.

    The ``ack`` names its intent. Flushed per line.
    """

    def __init__(self, path: Path) -> None:
        self.n = len(path.read_text().splitlines()) if path.exists() else 0
        self.f = path.open("a")

    def write(self, kind: str, op: str, **body: Any) -> int:
        self.n += 1
        self.f.write(json.dumps({"id": self.n, "kind": kind, "op": op, **body}) + "\n")
        self.f.flush()
        return self.n

    def close(self) -> None:
        self.f.close()


class _Rotating:
    """Stubs on several connections, a different one for each attribute read (each call)."""

    def __init__(self, stubs: list[Stubs]) -> None:
        self._stubs = stubs
        self._n = 0

    def __getattr__(self, name: str) -> Any:
        self._n += 1
        return getattr(self._stubs[self._n % len(self._stubs)], name)

    def close(self) -> None:
        for stubs in self._stubs:
            stubs.close()


def client_main(port: int, token: str, log_path: Path, seed: int, connections: int = 1) -> int:
    """Drive the mixed load until the server dies; exit 0.

    With ``connections`` above 1 each call goes over the next of that many
    connections of their own (so over the processes of a ``--processes`` group).
    """
    rng = random.Random(seed)
    own = [("grpc.use_local_subchannel_pool", 1)]
    target = f"127.0.0.1:{port}"
    s: Any = Stubs.insecure(target, token)
    if connections > 1:
        channels = [grpc.insecure_channel(target, own) for _ in range(connections)]
        s = _Rotating([Stubs(channel, token) for channel in channels])
    log = Log(log_path)
    state = replay(log_path)
    tag = f"r{seed}"

    def call(
        op: str,
        body: dict[str, Any],
        rpc: Callable[..., Any],
        request: Any,
        ack: Callable[[Any], dict[str, Any]] = lambda r: {},
    ) -> None:
        intent = log.write("intent", op, **body)
        try:
            reply = rpc(request, metadata=s.md)
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise _ServerGone from None
            raise RuntimeError(f"{op} {body} failed: {err.code().name} {reason_of(err)}") from None
        extra = ack(reply)
        log.write("ack", op, of=intent, **body, **extra)
        state.apply_ack({"op": op, **body, **extra})

    try:
        for n in range(1, 1_000_000):
            step = rng.random()
            turns, memories = state.committed_turns(), state.live_memories()
            if step < 0.25 or not turns:
                tid = f"{tag}-t{n}"
                call(
                    "thread",
                    {"thread": tid},
                    s.threads.CreateThread,
                    threads_pb2.CreateThreadRequest(parent=PARENT, thread_id=tid),
                )
                texts = [f"{tag} {n} {rng.choice(WORDS)} {i}" for i in range(4)]
                inputs = [
                    threads_pb2.TurnInput(role=common_pb2.USER, text=t, commit=i < 3)
                    for i, t in enumerate(texts)
                ]
                call(
                    "append",
                    {"thread": tid, "texts": texts},
                    s.threads.AppendTurns,
                    threads_pb2.AppendTurnsRequest(parent=f"{PARENT}/threads/{tid}", turns=inputs),
                    lambda r: {"names": [t.name for t in r.turns]},
                )
            elif step < 0.40:
                turn, mid = rng.choice(turns), f"{tag}-m{n}"
                fact = M(
                    kind=M.FACT,
                    text=f"fact {mid}",
                    state=common_pb2.COMMITTED,
                    sources=[common_pb2.SourceRef(name=turn, version=1)],
                )
                call(
                    "memory",
                    {"memory": mid, "text": fact.text, "source": turn},
                    s.memories.CreateMemory,
                    memories_pb2.CreateMemoryRequest(parent=PARENT, memory_id=mid, memory=fact),
                )
            elif step < 0.50 and memories:
                name, text = rng.choice(memories), f"corrected {tag} {n}"
                call(
                    "update",
                    {"memory": name, "text": text},
                    s.memories.UpdateMemory,
                    memories_pb2.UpdateMemoryRequest(
                        memory=M(name=name, text=text),
                        update_mask=field_mask_pb2.FieldMask(paths=["text"]),
                    ),
                    lambda r: {"version": r.version},
                )
            elif step < 0.58 and state.pending_turns():
                name = rng.choice(state.pending_turns())
                call(
                    "commit",
                    {"names": [name]},
                    s.lifecycle.Commit,
                    lifecycle_pb2.CommitRequest(names=[name]),
                )
            elif step < 0.75:
                target = rng.choice(turns + memories + state.live_threads())
                call(
                    "forget",
                    {"names": [target]},
                    s.lifecycle.Forget,
                    lifecycle_pb2.ForgetRequest(names=[target]),
                )
            elif step < 0.85 and state.sealable():
                thread = rng.choice(state.sealable())
                call(
                    "seal",
                    {"thread": thread},
                    s.repairs.SealRepair,
                    repairs_pb2.SealRepairRequest(thread=thread, from_seq=2),
                    lambda r: {"repair": r.name},
                )
            elif state.open_repairs():
                repair = rng.choice(state.open_repairs())
                if rng.random() < 0.5:
                    call(
                        "reopen",
                        {"repair": repair},
                        s.repairs.ReopenRepair,
                        repairs_pb2.ReopenRepairRequest(name=repair),
                    )
                else:
                    call(
                        "destroy",
                        {"repair": repair},
                        s.repairs.ConcludeRepair,
                        repairs_pb2.ConcludeRepairRequest(
                            name=repair, outcome=threads_pb2.RepairInfo.DESTROY
                        ),
                    )
    except _ServerGone:
        return 0
    finally:
        log.close()
        s.close()
    return 0


class _ServerGone(Exception):
    pass


# ---------------------------------------------------------------------- the model


@dataclass
class State:
    """What the acknowledged log says the store holds."""

    threads: dict[str, bool] = field(default_factory=dict)  # thread name -> live
    turns: dict[str, dict[str, Any]] = field(default_factory=dict)
    memories: dict[str, dict[str, Any]] = field(default_factory=dict)
    repairs: dict[str, dict[str, Any]] = field(default_factory=dict)
    uncertain: set[str] = field(default_factory=set)
    acked: int = 0

    def apply_ack(self, e: dict[str, Any]) -> None:
        op = e["op"]
        self.acked += 1
        if op == "reopen":
            return
        if op == "thread":
            self.threads[f"{PARENT}/threads/{e['thread']}"] = True
        elif op == "append":
            for i, (name, text) in enumerate(zip(e["names"], e["texts"], strict=True)):
                self.turns[name] = {
                    "text": text,
                    "state": "COMMITTED" if i < 3 else "PENDING",
                    "status": "ok",
                }
        elif op == "commit":
            for name in e["names"]:
                if self.turns.get(name, {}).get("status") == "ok":
                    self.turns[name]["state"] = "COMMITTED"
        elif op == "memory":
            self.memories[f"{PARENT}/memories/{e['memory']}"] = {
                "text": e["text"],
                "source": e["source"],
                "status": "ok",
                "version": 1,
            }
        elif op == "update":
            m = self.memories[e["memory"]]
            m["text"], m["version"] = e["text"], e["version"]
        elif op == "forget":
            self._gone(e["names"][0])
        elif op == "seal":
            self.repairs[e["repair"]] = {"thread": e["thread"], "open": True}
            for name, t in self.turns.items():
                in_stretch = name.startswith(e["thread"] + "/turns/") and _seq(name) >= 2
                if in_stretch and t["status"] == "ok":
                    t["status"] = "sealed"
                    t["repair"] = e["repair"]
            self._cascade()
        elif op == "destroy":
            self.repairs[e["repair"]]["open"] = False
            for t in self.turns.values():
                if t.get("repair") == e["repair"]:
                    t["status"] = "deleted"
            self._cascade()

    def apply_intent(self, e: dict[str, Any]) -> None:
        """A call without an ack: what it touches may have gone either way."""
        op = e["op"]
        if op in ("forget",):
            self._uncertain(e["names"][0])
        elif op == "seal":
            self.uncertain |= {n for n in self.turns if n.startswith(e["thread"] + "/turns/")}
            self.uncertain.add(e["thread"])
        elif op == "destroy":
            self.uncertain |= {n for n, t in self.turns.items() if t.get("repair") == e["repair"]}
            self.uncertain.add(e["repair"])
        elif op == "update":
            self.uncertain.add(e["memory"])
        elif op == "commit":
            self.uncertain |= set(e["names"])
        self._spread_uncertainty()

    def _uncertain(self, name: str) -> None:
        self.uncertain.add(name)
        if name in self.threads:
            self.uncertain |= {n for n in self.turns if n.startswith(name + "/turns/")}

    def _spread_uncertainty(self) -> None:
        for name, m in self.memories.items():
            if m["source"] in self.uncertain:
                self.uncertain.add(name)

    def _gone(self, name: str) -> None:
        if name in self.threads:
            self.threads[name] = False
            for n, t in self.turns.items():
                if n.startswith(name + "/turns/"):
                    t["status"] = "deleted"
        elif name in self.turns:
            self.turns[name]["status"] = "deleted"
        elif name in self.memories:
            self.memories[name]["status"] = "deleted"
        self._cascade()

    def _cascade(self) -> None:
        """A fact goes with its source turn: deleted with it, sealed with it."""
        for m in self.memories.values():
            source = self.turns.get(m["source"], {})
            if m["status"] in ("ok", "sealed") and source.get("status") == "deleted":
                m["status"] = "deleted"
            elif m["status"] == "ok" and source.get("status") == "sealed":
                m["status"] = "sealed"

    # choices for the load
    def committed_turns(self) -> list[str]:
        return sorted(
            n
            for n, t in self.turns.items()
            if t["status"] == "ok" and t["state"] == "COMMITTED" and n not in self.uncertain
        )

    def pending_turns(self) -> list[str]:
        return sorted(
            n
            for n, t in self.turns.items()
            if t["status"] == "ok" and t["state"] == "PENDING" and n not in self.uncertain
        )

    def live_memories(self) -> list[str]:
        return sorted(
            n for n, m in self.memories.items() if m["status"] == "ok" and n not in self.uncertain
        )

    def live_threads(self) -> list[str]:
        return sorted(n for n, live in self.threads.items() if live and n not in self.uncertain)

    def sealable(self) -> list[str]:
        return [
            n
            for n in self.live_threads()
            if all(
                t["status"] == "ok" for k, t in self.turns.items() if k.startswith(n + "/turns/")
            )
            and any(k.startswith(n + "/turns/") for k in self.turns)
            and not any(r["thread"] == n for r in self.repairs.values())
        ]

    def open_repairs(self) -> list[str]:
        return sorted(n for n, r in self.repairs.items() if r["open"] and n not in self.uncertain)


def _seq(name: str) -> int:
    return int(name.rsplit("/", 1)[-1])


def replay(path: Path) -> State:
    """The model of everything the log acknowledges.

    What a call without an ack touched is marked uncertain.
    """
    state = State()
    if not path.exists():
        return state
    intents: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == "intent":
            intents[e["id"]] = e
        else:
            intents.pop(e["of"], None)
            if e["kind"] == "ack":
                state.apply_ack(e)
    for e in intents.values():
        state.apply_intent(e)
    return state


def unsettled(path: Path) -> list[dict[str, Any]]:
    """Intents of the log with neither an ack nor a void: calls a kill cut."""
    intents: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        e = json.loads(line)
        if e["kind"] == "intent":
            intents[e["id"]] = e
        else:
            intents.pop(e["of"], None)
    return list(intents.values())


def settle(s: Stubs, path: Path) -> int:
    """Observe what each call the kill cut did — all of it, or none of it — and log it.

    It is recorded in the log as an observed ack or a void, so nothing stays
    undecided. Returns how many calls were settled.

    Raises:
        AssertionError: a call was applied in part (a broken all-or-nothing).
    """
    cut = unsettled(path)
    log = Log(path)
    try:
        for e in cut:
            state = replay(path)
            body = {k: v for k, v in e.items() if k not in ("id", "kind", "op")}
            extra = _observe(s, e, state)
            if extra is None:
                log.write("void", e["op"], of=e["id"])
            else:
                log.write("ack", e["op"], of=e["id"], observed=True, **body, **extra)
    finally:
        log.close()
    return len(cut)


def _observe(s: Stubs, e: dict[str, Any], state: State) -> dict[str, Any] | None:
    """What a cut call did: the ack's extra fields if it was applied, None if not."""
    op = e["op"]
    if op == "thread":
        got = _get(
            s.threads.GetThread,
            threads_pb2.GetThreadRequest(name=f"{PARENT}/threads/{e['thread']}"),
            s.md,
        )
        return {} if not isinstance(got, str) else None
    if op == "append":
        got = _get(
            s.threads.ListTurns,
            threads_pb2.ListTurnsRequest(parent=f"{PARENT}/threads/{e['thread']}"),
            s.md,
        )
        turns = [] if isinstance(got, str) else list(got.turns)
        assert [t.text for t in turns] in ([], e["texts"]), ("partial append", e, turns)
        return {"names": [t.name for t in turns]} if turns else None
    if op == "memory":
        got = _get(
            s.memories.GetMemory,
            memories_pb2.GetMemoryRequest(name=f"{PARENT}/memories/{e['memory']}"),
            s.md,
        )
        return {} if not isinstance(got, str) else None
    if op == "update":
        got = _get(s.memories.GetMemory, memories_pb2.GetMemoryRequest(name=e["memory"]), s.md)
        assert not isinstance(got, str), (e, got)
        before = state.memories[e["memory"]]["version"]
        assert got.version in (before, before + 1), ("version jumped", e, got.version)
        return {"version": got.version} if got.version == before + 1 else None
    if op == "commit":
        got = _get(s.threads.GetTurn, threads_pb2.GetTurnRequest(name=e["names"][0]), s.md)
        assert not isinstance(got, str), (e, got)
        return {} if got.state == common_pb2.COMMITTED else None
    if op == "forget":
        target = e["names"][0]
        if "/memories/" in target:
            got = _get(s.memories.GetMemory, memories_pb2.GetMemoryRequest(name=target), s.md)
        elif "/turns/" in target:
            got = _get(s.threads.GetTurn, threads_pb2.GetTurnRequest(name=target), s.md)
        else:
            got = _get(s.threads.GetThread, threads_pb2.GetThreadRequest(name=target), s.md)
        return {} if got == "NOT_FOUND/RECORD_DELETED" else None
    if op == "seal":
        threads = s.threads.ListThreads(
            threads_pb2.ListThreadsRequest(parent=PARENT, include_repairs=True, page_size=1000),
            metadata=s.md,
        ).threads
        made = [t.name for t in threads if t.repair.source_thread == e["thread"]]
        assert len(made) <= 1, made
        return {"repair": made[0]} if made else None
    if op == "destroy":
        got = _get(s.threads.GetThread, threads_pb2.GetThreadRequest(name=e["repair"]), s.md)
        concluded = (
            not isinstance(got, str) and got.repair.state == threads_pb2.RepairInfo.CONCLUDED
        )
        return {} if concluded else None
    return None  # reopen: nothing to decide


# ---------------------------------------------------------------------- the checks


def check(s: Stubs, state: State) -> int:
    """Assert the store against the model; returns how many records were judged."""
    judged = 0
    for name, t in state.turns.items():
        if name in state.uncertain:
            continue
        got = _get(s.threads.GetTurn, threads_pb2.GetTurnRequest(name=name), s.md)
        if t["status"] == "ok":
            assert not isinstance(got, str), (name, got)
            assert got.text == t["text"], (name, got.text, t)
            want = common_pb2.COMMITTED if t["state"] == "COMMITTED" else common_pb2.PENDING
            assert got.state == want, (name, got.state, t)
        elif t["status"] == "sealed":
            assert got == "FAILED_PRECONDITION/SEALED", (name, got)
        else:
            assert got == "NOT_FOUND/RECORD_DELETED", (name, got)
        judged += 1
    for name, m in state.memories.items():
        if name in state.uncertain:
            continue
        got = _get(s.memories.GetMemory, memories_pb2.GetMemoryRequest(name=name), s.md)
        if m["status"] == "ok":
            assert not isinstance(got, str), (name, got)
            assert (got.text, got.version) == (m["text"], m["version"]), (name, got, m)
        elif m["status"] == "sealed":
            assert got == "FAILED_PRECONDITION/SEALED", (name, got)
        else:
            assert got == "NOT_FOUND/RECORD_DELETED", (name, got)
        judged += 1
    report = s.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent=PARENT), metadata=s.md)
    counts = (
        report.orphans,
        report.keys_without_record,
        report.records_without_key,
        report.unreadable_records,
        report.index_drift,
    )
    assert counts == (0, 0, 0, 0, 0), report
    return judged


def _get(rpc: Callable[..., Any], request: Any, md: Any) -> Any:
    try:
        return rpc(request, metadata=md)
    except grpc.RpcError as err:
        return f"{err.code().name}/{reason_of(err)}"


# ---------------------------------------------------------------------- the parent


@dataclass
class Report:
    kills: int = 0
    acknowledged: int = 0
    judged: int = 0
    settled: int = 0
    forgotten_checked: int = 0
    seconds: float = 0.0


COPIES = 3
"""Copies of the data directory (data and keystore) kept for the final check."""


def _forgotten_openers(copy: Path, kek_dir: Path, names: list[str]) -> list[str]:
    """``file: turn`` for every file in ``kek_dir`` that opens a turn of ``names`` in ``copy``."""
    from server.store import Store

    found = []
    for candidate in sorted(p for p in kek_dir.iterdir() if p.is_file()):
        store = None
        with contextlib.suppress(Exception):  # not a KEK file, or one of another store
            store = Store(copy, kek_file=candidate, lock=False)
        if store is None:
            continue
        try:
            for name in names:
                _, thread, _, seq = name.removeprefix(f"{PARENT}/").split("/")
                metas = [m for m in store.thread_turns(OWNER, thread) if m.seq == int(seq)]
                for meta, cts in store.fetch([m.rid for m in metas]).values():
                    with contextlib.suppress(Exception):  # a key that does not open: right
                        store.turn_view(meta, cts, with_embedding=False)  # type: ignore[arg-type]
                        found.append(f"{candidate.name}: {name}")
        finally:
            store.close()
    return found


def run(
    root: Path,
    kills: int,
    seed: int = 0,
    out: Callable[[str], None] = print,
    processes: int = 1,
) -> Report:
    """Kill the server ``kills`` times under load; check after each restart.

    ``processes`` is ``lethe serve --processes`` (see the module docstring).

    Raises:
        AssertionError: the store disagrees with an acknowledged operation, or
            the audit is not clean.
    """
    rng = random.Random(seed)
    data, log = root / "data", root / "acks.jsonl"
    kek = root / "config" / "kek.json"
    env = {
        k: v
        for k, v in __import__("os").environ.items()
        if k not in ("LETHE_KEK", "LETHE_FAILPOINTS")
    }
    env["TEST_KEK_FILE"] = str(kek)
    token = make_token(data, env, OWNER)
    report = Report()
    started = time.perf_counter()
    for k in range(kills):
        group = ("--processes", str(processes))
        server = Server(data, env, "--rotation-interval", "1s", "--sweep-interval", "1s", *group)
        client = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "client",
                "--port",
                str(server.port),
                "--token",
                token,
                "--log",
                str(log),
                "--seed",
                str(seed * 100_000 + k),
                "--connections",
                "1" if processes == 1 else "4",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        before = len(log.read_text().splitlines()) if log.exists() else 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and client.poll() is None:  # the load has begun
            if log.exists() and len(log.read_text().splitlines()) > before:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.05, 1.2))  # a random moment of the load
        server.crash()
        server.stop()
        _, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        again = Server(data, env, "--sweep-interval", "1h", *group)
        try:
            with again.stubs(token) as s:
                report.settled += settle(s, log)  # all-or-nothing of the cut calls
                state = replay(log)
                assert not state.uncertain, state.uncertain
                try:
                    judged = check(s, state)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\nserver log:\n{again.stderr()[-6000:]}") from None
        finally:
            again.stop()
        copy = root / "copies" / f"after-kill-{k + 1}"
        shutil.copytree(data, copy, ignore=shutil.ignore_patterns("lethe.lock", "reserve.bin"))
        for old in sorted((root / "copies").iterdir(), key=lambda p: p.stat().st_mtime)[:-COPIES]:
            shutil.rmtree(old)
        report.kills += 1
        report.acknowledged = state.acked
        report.judged += judged
        out(
            f"kill {k + 1}/{kills}: {state.acked} acknowledged operations so far, "
            f"{judged} records checked, {report.settled} cut calls settled (all or nothing)"
        )
    rc, text = audit(data, env)
    assert rc == 0, text
    rotated = subprocess.run(
        [*LETHE, "rotate", "--data", str(data), "--kek-file", str(kek)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert rotated.returncode == 0, rotated.stderr
    forgotten = sorted(n for n, t in state.turns.items() if t["status"] == "deleted")
    for copy in sorted((root / "copies").iterdir()):
        opened = _forgotten_openers(copy, kek.parent, forgotten)
        assert opened == [], f"{copy.name}: {opened}"
    report.forgotten_checked = len(forgotten)
    report.seconds = time.perf_counter() - started
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    client = sub.add_parser("client")
    client.add_argument("--port", type=int, required=True)
    client.add_argument("--token", required=True)
    client.add_argument("--log", type=Path, required=True)
    client.add_argument("--seed", type=int, default=0)
    client.add_argument("--connections", type=int, default=1)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "client":
        return client_main(args.port, args.token, args.log, args.seed, args.connections)
    with tempfile.TemporaryDirectory(prefix="lethe-kills-") as tmp:
        r = run(Path(tmp), args.kills, args.seed, processes=args.processes)
    print(
        f"{r.kills} kills survived; {r.acknowledged} acknowledged operations; "
        f"{r.judged} record checks; {r.seconds:.0f} s; lethe audit clean; "
        f"{r.forgotten_checked} forgotten turns open in no copy taken before the last "
        "rotation, with any file of the KEK's directory"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
