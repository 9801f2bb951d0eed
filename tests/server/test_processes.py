"""``lethe serve --processes 2``: one port, one data directory, two real serving processes.

Each new connection lands on one member (``SO_REUSEPORT``); which one is read
from ``/proc`` (the member process holding the server side of each
connection). A write or a forget made through one member is in every search
of the other, asked at once; a ``Watch`` stream on one member sees events
written through the other; a member killed with SIGKILL makes the supervisor
start the group again, and every acknowledged write is there afterwards.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from _helpers import wait_for
from _served import LETHE, Served
from conftest import Client

from server.cli._supervise import _member_argv

OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
"""A channel of its own connection: gRPC shares one per target and options otherwise."""
OWNER = "owners/alice"
THREAD = f"{OWNER}/threads/t1"


def _member_of(pids: Sequence[int], port: int) -> dict[int, int]:
    """Server-side established connections on ``port`` per member pid."""
    inodes: dict[int, int] = {}
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[int(target[8:-1])] = pid
    counts: dict[int, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in rows.readlines()[1:]:
                f = row.split()
                if f[3] == "01" and int(f[1].rpartition(":")[2], 16) == port:
                    owner = inodes.get(int(f[9]))
                    if owner is not None:
                        counts[owner] = counts.get(owner, 0) + 1
    return counts


def _on_each_member(served: Served, token: str) -> list[Client]:
    """One client per member (new connections until each member holds one)."""
    found: dict[int, Client] = {}
    for _ in range(64):
        before = _member_of(served.pids, served.port)
        client = served.client(token=token, options=OWN_CONNECTION)
        client.search(OWNER, query_text="hello", include_turns=True)  # connects
        after = _member_of(served.pids, served.port)
        grew = [p for p in after if after[p] > before.get(p, 0)]
        if len(grew) == 1 and grew[0] not in found:
            found[grew[0]] = client
        if len(found) == len(served.pids):
            return [found[p] for p in served.pids]
    raise AssertionError(f"no connection reached every member: {sorted(found)}")


@pytest.fixture
def group(tmp_path: Path, kek_env: str) -> Iterator[Served]:
    served = Served(tmp_path / "d", processes=2)
    yield served
    served.stop(grace=30)


def _texts(client: Client, query: str) -> list[str]:
    reply = client.search(OWNER, query_text=query, include_turns=True, top_k=100)
    return sorted(h.turn.text for h in reply.hits)


@pytest.mark.slow
def test_each_member_sees_every_write_and_forget_made_through_the_other(group: Served) -> None:
    assert len(group.pids) == 2
    token = group.token("alice")
    first, second = _on_each_member(group, token)
    first.create_thread(OWNER, thread_id="t1")
    written = []
    for i, (by, other) in enumerate([(first, second), (second, first)] * 3):
        reply = by.append_turns(THREAD, [{"role": "USER", "text": f"quixotic {i}", "commit": True}])
        written.append((reply.turns[0].name, f"quixotic {i}"))
        want = sorted(text for _, text in written)
        assert _texts(other, "quixotic") == want  # asked at once, on the other member
        assert _texts(by, "quixotic") == want
    gone_name, gone_text = written[2]
    second.forget([gone_name])
    left = sorted(text for name, text in written if name != gone_name)
    assert _texts(first, "quixotic") == left
    assert gone_text not in _texts(second, "quixotic")


@pytest.mark.slow
def test_each_member_sees_every_memory_of_a_batch_written_through_the_other(
    group: Served,
) -> None:
    """``BatchUpdateMemories`` notes every row it writes in the change log, as single writes do."""
    token = group.token("alice")
    first, second = _on_each_member(group, token)

    def found(client: Client) -> list[str]:
        reply = client.search(OWNER, query_text="zanzibar", kinds=["FACT"], top_k=100)
        return sorted(h.memory.text for h in reply.hits)

    def upsert(memory_id: str, text: str) -> dict[str, object]:
        memory = {"name": f"{OWNER}/memories/{memory_id}", "kind": "FACT", "text": text}
        return {"memory": {**memory, "state": "COMMITTED"}, "allow_missing": True}

    assert found(second) == []  # the owner's index loaded before the batch
    first.batch_update_memories(OWNER, [upsert(f"m{i}", f"zanzibar {i}") for i in range(5)])
    assert found(second) == [f"zanzibar {i}" for i in range(5)]  # asked at once, on the other
    second.batch_update_memories(OWNER, [upsert("m0", "zanzibar zero"), upsert("m5", "zanzibar 5")])
    assert found(first) == sorted([*(f"zanzibar {i}" for i in range(1, 6)), "zanzibar zero"])


@pytest.mark.slow
def test_searches_hammering_one_member_never_return_what_the_other_forgot(
    group: Served,
) -> None:
    """Searches run on B in a loop while A forgets: none begun after the forget returns it."""
    token = group.token("alice")
    first, second = _on_each_member(group, token)
    first.create_thread(OWNER, thread_id="t1")
    turns = [{"role": "USER", "text": f"quixotic {i}", "commit": True} for i in range(20)]
    names = [t.name for t in first.append_turns(THREAD, turns).turns]
    gone = set(names[5:15])
    seen: list[tuple[float, bool]] = []  # (when the search began, whether it held a gone turn)
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            began = time.monotonic()
            reply = second.search(OWNER, query_text="quixotic", include_turns=True, top_k=100)
            seen.append((began, any(h.turn.name in gone for h in reply.hits)))

    worker = threading.Thread(target=hammer)
    worker.start()
    try:
        time.sleep(0.5)
        for name in sorted(gone):
            first.forget([name])
        forgotten_at = time.monotonic()
        time.sleep(1.0)
    finally:
        stop.set()
        worker.join(timeout=60)
    before = [held for began, held in seen if began < forgotten_at]
    after = [held for began, held in seen if began > forgotten_at]
    assert any(before)  # the loop saw the turns while they lived
    assert after
    assert not any(after)


@pytest.mark.slow
def test_the_connect_listener_is_shared_by_the_members_too(group: Served) -> None:
    """``--http-listen``: one port, every member answering Connect calls on it."""
    token = group.token("alice")
    writer = group.client(token=token)
    writer.create_thread(OWNER, thread_id="t1")
    writer.append_turns(THREAD, [{"role": "USER", "text": "I adopted a puppy", "commit": True}])
    body = json.dumps({"parent": OWNER, "queryText": "puppy"})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    connections = [http.client.HTTPConnection("127.0.0.1", group.http_port) for _ in range(16)]
    try:
        for conn in connections:  # each a TCP connection of its own, kept open
            conn.request("POST", "/lethe.v1.Retrieval/Search", body, headers)
            reply = conn.getresponse()
            assert reply.status == 200
            assert [h["turn"]["text"] for h in json.loads(reply.read())["hits"]] == [
                "I adopted a puppy"
            ]
        assert sorted(_member_of(group.pids, group.http_port)) == sorted(group.pids)
    finally:
        for conn in connections:
            conn.close()


@pytest.mark.slow
def test_a_watch_on_one_member_sees_events_written_through_the_other(group: Served) -> None:
    token = group.token("alice")
    first, second = _on_each_member(group, token)
    first.create_thread(OWNER, thread_id="t1")
    turns = [{"role": "USER", "text": f"to forget {i}", "commit": True} for i in range(2)]
    names = [t.name for t in first.append_turns(THREAD, turns).turns]
    stream = iter(second.watch(OWNER, types=["RECORD_DELETED"], timeout=10))
    own = second.forget([names[0]])
    assert next(stream).receipt.name == own.name  # the stream is open and caught up
    start = time.monotonic()
    receipt = first.forget([names[1]])  # through the other member: only the follower tells
    event = next(stream)
    assert event.receipt.name == receipt.name
    assert time.monotonic() - start < 5  # the follower wakes it within about 0.5 s


def _committed(client: Client, texts: Sequence[str]) -> list[str]:
    """Thread t1 of alice with ``texts`` appended one at a time, committed; their names."""
    client.create_thread(OWNER, thread_id="t1")
    return [
        client.append_turns(THREAD, [{"role": "USER", "text": t, "commit": True}]).turns[0].name
        for t in texts
    ]


@pytest.mark.slow
def test_a_killed_member_restarts_the_group_and_no_acknowledged_write_is_lost(
    group: Served,
) -> None:
    token = group.token("alice")
    _committed(group.client(token=token), [f"kept {i}" for i in range(20)])
    victim = group.pids[1]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            fresh = group.client(token=token, options=OWN_CONNECTION)
            got = _texts(fresh, "kept")
            break
        except Exception:
            time.sleep(0.5)
    else:
        raise AssertionError("the group did not serve again")
    assert got == sorted(f"kept {i}" for i in range(20))
    assert group.proc.poll() is None  # the supervisor kept running


def test_each_member_gets_the_group_addresses_and_a_metrics_port_of_its_own() -> None:
    words = ("serve", "--data", "d", "--processes", "4")
    argv = _member_argv(words, "127.0.0.1:5000", "127.0.0.1:8080", "127.0.0.1:9464", 2)
    assert argv[: len(words)] == list(words)  # the operator's command line, then the fixes
    fixed = argv[len(words) :]
    assert fixed[fixed.index("--listen") + 1] == "127.0.0.1:5000"
    assert fixed[fixed.index("--processes") + 1] == "1"
    assert "--member" in fixed
    assert fixed[fixed.index("--http-listen") + 1] == "127.0.0.1:8080"
    assert fixed[fixed.index("--metrics-listen") + 1] == "127.0.0.1:9466"
    off = _member_argv(words, "127.0.0.1:5000", None, None, 1)
    assert off[off.index("--metrics-listen") + 1] == "off"
    assert "--http-listen" not in off[len(words) :]
    any_port = _member_argv(words, "127.0.0.1:5000", None, "127.0.0.1:0", 3)
    assert any_port[any_port.index("--metrics-listen") + 1] == "127.0.0.1:0"


@pytest.mark.slow
def test_a_group_and_a_single_process_refuse_each_others_data_directory(
    group: Served, tmp_path: Path
) -> None:
    alone = subprocess.run(
        [*LETHE, "serve", "--data", str(group.data_dir), "--listen", "127.0.0.1:0",
         "--metrics-listen", "off", "--embedder", "none"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert alone.returncode != 0
    assert "in use by another lethe process" in alone.stderr
    group.stop(grace=30)
    single = Served(tmp_path / "one")
    try:
        second = subprocess.run(
            [*LETHE, "serve", "--data", str(single.data_dir), "--listen", "127.0.0.1:0",
             "--metrics-listen", "off", "--embedder", "none", "--processes", "2"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert second.returncode != 0
        assert "in use by another lethe process" in second.stderr
    finally:
        single.stop()


@pytest.mark.slow
def test_each_member_serves_its_own_metrics_on_the_port_it_reports(
    tmp_path: Path, kek_env: str
) -> None:
    """``--metrics-listen 127.0.0.1:0`` with two members: two bound ports, both scraped."""
    served = Served(tmp_path / "d", processes=2, metrics_listen="127.0.0.1:0")
    try:
        listens = served.ready["metrics_listens"]
        assert len(listens) == 2
        assert served.ready["metrics_listen"] == listens[0]
        ports = [int(str(listen).rpartition(":")[2]) for listen in listens]
        assert len(set(ports)) == 2
        assert 0 not in ports
        for port in ports:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/metrics")
            reply = conn.getresponse()
            assert reply.status == 200
            assert b"lethe_" in reply.read()
            conn.close()
    finally:
        served.stop(grace=30)


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (the supervisor's members), from ``/proc``."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return sorted(found)


def _joined(group: Served) -> int:
    """The pid of the member the supervisor last said joined, once it has (its log)."""
    log = group.data_dir.parent / f"{group.data_dir.name}.log"
    found: list[str] = []

    def said() -> bool:
        found[:] = re.findall(r"member \d+ \(pid (\d+)\) joined", log.read_text())
        return bool(found)

    wait_for(said, "a member joined", 60)
    return int(found[-1])


def _serves(client: Client) -> bool:
    try:
        client.search(OWNER, query_text="zebra")
    except Exception:
        return False
    return True


def test_sigttin_starts_a_member_beside_the_running_ones_and_sigttou_stops_it(
    group: Served,
) -> None:
    """Scaling a running group: no member stops, and the new one sees every write at once."""
    token = group.token("alice")
    _committed(group.client(token=token), [f"zebra {i}" for i in range(5)])
    running = _children(group.proc.pid)
    assert running == sorted(group.pids)
    os.kill(group.proc.pid, signal.SIGTTIN)
    joined = _joined(group)
    group.pids = [*group.pids, joined]
    clients = _on_each_member(group, token)  # raises unless a connection reaches each member
    third = clients[2]
    assert _texts(third, "zebra") == sorted(f"zebra {i}" for i in range(5))
    reply = third.append_turns(THREAD, [{"role": "USER", "text": "zebra 5", "commit": True}])
    for client in clients:
        assert _texts(client, "zebra") == sorted(f"zebra {i}" for i in range(6))
    clients[0].forget([reply.turns[0].name])
    assert "zebra 5" not in _texts(third, "zebra")
    assert all(os.path.exists(f"/proc/{p}") for p in running)  # nobody was restarted
    os.kill(joined, signal.SIGKILL)  # a group restart keeps the group's size
    wait_for(
        lambda: (
            len(_children(group.proc.pid)) == 3
            and not set(_children(group.proc.pid)) & {*running, joined}
        ),
        "the group of three started again",
        timeout=120,
    )
    os.kill(group.proc.pid, signal.SIGTTOU)
    wait_for(lambda: len(_children(group.proc.pid)) == 2, "the third member gone", 60)
    os.kill(group.proc.pid, signal.SIGTTOU)
    os.kill(group.proc.pid, signal.SIGTTOU)  # the primary is never stopped alone
    wait_for(lambda: len(_children(group.proc.pid)) == 1, "one member left", 60)
    time.sleep(1.0)
    (primary,) = _children(group.proc.pid)
    group.pids = [primary]
    fresh = group.client(token=token, options=OWN_CONNECTION)
    wait_for(lambda: _serves(fresh), "the primary serving again", 60)
    assert _texts(fresh, "zebra") == sorted(f"zebra {i}" for i in range(5))
    assert group.proc.poll() is None


def test_sigttin_to_a_single_process_is_ignored_not_a_suspension(
    tmp_path: Path, kek_env: str
) -> None:
    """SIGTTIN's default action would stop (suspend) a plain ``lethe serve``; it serves on."""
    served = Served(tmp_path / "d")
    try:
        token = served.token("alice")
        os.kill(served.proc.pid, signal.SIGTTIN)
        os.kill(served.proc.pid, signal.SIGTTOU)
        time.sleep(0.5)
        with open(f"/proc/{served.proc.pid}/stat") as f:
            assert f.read().rpartition(")")[2].split()[0] != "T"  # not stopped
        client = served.client(token=token)
        client.create_thread(OWNER, thread_id="t1")
        assert client.search(OWNER, query_text="zebra").hits == []
    finally:
        served.stop(grace=10)


def test_sigttou_for_a_member_that_died_restarts_the_group(group: Served) -> None:
    """SIGTTOU asked for a member that crashed: not taken for a clean stop (recovery runs)."""
    token = group.token("alice")
    _committed(group.client(token=token), ["zebra 0"])
    os.kill(group.proc.pid, signal.SIGTTIN)
    newest = _joined(group)
    before = _children(group.proc.pid)
    os.kill(newest, signal.SIGKILL)
    os.kill(group.proc.pid, signal.SIGTTOU)
    wait_for(
        lambda: len(now := _children(group.proc.pid)) >= 2 and not set(now) & set(before),
        "the group started again",
        120,
    )
    fresh = group.client(token=token, options=OWN_CONNECTION)
    wait_for(lambda: _serves(fresh), "the group serving again", 60)
    assert _texts(fresh, "zebra") == ["zebra 0"]
    assert group.proc.poll() is None
