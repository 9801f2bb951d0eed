"""Owners sharded across three real ``lethe serve`` processes behind a real nginx on loopback.

nginx runs the config ``lethe shard nginx-config`` writes.

nginx comes from Debian (``nginx-light``; ``scripts/install_nginx.sh``, run by
``scripts/test.sh``, installs it as root). Without it the tests skip, saying
why — except under ``CI=true``, where they fail.

What is checked: 50 owners written through nginx land on their shard and
only there (each shard asked directly); searches and forgets through nginx;
a call without the header is refused by nginx, a misrouted call (header of
one owner, resource of another) by the shard; per-shard health checks
through nginx; a moved-away marker written by another process answers
``OWNER_MOVED``; and with shard B killed, only B's owners fail, with
``UNAVAILABLE`` / ``SHARD_UNAVAILABLE`` naming B, while the others read and
write. The same over Connect (HTTP) through nginx's HTTP listener: every
owner's call reaches the shard gRPC reaches (placements too), a call
without the header is refused, a ``Watch`` streams through, and B's owners
answer ``SHARD_UNAVAILABLE``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from _connect import ConnectChannel, ConnectRpcError
from _pki import make_pki
from _shardprocs import (
    LETHE,
    ROOT,
    ShardProc,
    lethe_cli,
    running_shards,
    shared_token,
    start_shard,
    wait_for,
)
from conftest import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc

import lethe.client as lc
from lethe.names import OWNER_HEADER
from lethe.v1 import common_pb2, events_pb2, threads_pb2
from server import Store, new_token, principal_record, token_digest
from shredder import KekRing

SHARDS = ("a", "b", "c")
OWNERS = [f"owner-{i:02d}" for i in range(50)]


def nginx_binary() -> str:
    """The nginx executable; skips (or fails under ``CI=true``) without one."""
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if found is None:
        why = "nginx is not installed (as root: bash scripts/install_nginx.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


@dataclass
class Cluster:
    shards: dict[str, ShardProc]
    nginx_port: int
    nginx_http_port: int
    token: str
    work: Path
    nginx: subprocess.Popen[str]
    clients: list[lc.Client] = field(default_factory=list)

    def connect(self, owner: str | None, codec: str = "json") -> tuple[ConnectChannel, Any]:
        """A Connect channel to nginx's HTTP listener, and the metadata of ``owner``'s calls."""
        md = [("authorization", f"Bearer {self.token}")]
        if owner is not None:
            md.append((OWNER_HEADER, owner))
        return ConnectChannel(f"127.0.0.1:{self.nginx_http_port}", codec=codec), tuple(md)

    def client(self, target: str | None = None) -> lc.Client:
        """A typed client through nginx (or to ``target``), without retries."""
        client = lc.Client(
            target or f"127.0.0.1:{self.nginx_port}", self.token, tls=False, retry=None, timeout=10
        )
        self.clients.append(client)
        return client


def _put_token(shard: ShardProc, token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same admin token on every shard (tokens are per data directory)."""
    monkeypatch.setenv("LETHE_KEK", shard.kek)
    store = Store(shard.data, lock=False)
    try:
        store.put_token(token_digest(token), principal_record([], True))
    finally:
        store.close()


def nginx_main_config(work: Path, include: Path) -> Path:
    """A minimal nginx.conf around the generated ``http {}`` part.

    Everything lives under ``work`` (pid, logs, temp files).
    """
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (work / sub).mkdir(exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = work / "nginx.conf"
    conf.write_text(
        f"{user}worker_processes 1;\ndaemon off;\npid {work}/nginx.pid;\n"
        f"error_log {work}/error.log warn;\n"
        "events { worker_connections 1024; }\n"
        "http {\n    access_log off;\n"
        f"    client_body_temp_path {work}/body;\n    proxy_temp_path {work}/proxy;\n"
        f"    fastcgi_temp_path {work}/fastcgi;\n    uwsgi_temp_path {work}/uwsgi;\n"
        f"    scgi_temp_path {work}/scgi;\n    include {include};\n}}\n"
    )
    return conf


@contextlib.contextmanager
def running_nginx(nginx: str, conf: Path, work: Path, port: int) -> Iterator[subprocess.Popen[str]]:
    """Check ``conf`` (``nginx -t``), start nginx in the foreground and wait for its port.

    On exit, stop it (SIGQUIT, then SIGKILL).
    """
    checked = subprocess.run(
        [nginx, "-t", "-q", "-p", str(work), "-c", str(conf), "-e", str(work / "error.log")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr + (work / "error.log").read_text()
    proc = subprocess.Popen(
        [nginx, "-p", str(work), "-c", str(conf), "-e", str(work / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        import socket

        while True:
            with socket.socket() as s, contextlib.suppress(OSError):
                s.connect(("127.0.0.1", port))
                break
            assert proc.poll() is None, (work / "error.log").read_text()
            assert time.monotonic() < deadline, "nginx did not listen"
            time.sleep(0.05)
        yield proc
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _nginx_flags(shards: dict[str, ShardProc], port: int, http_port: int, work: Path) -> list[str]:
    """``lethe shard nginx-config``'s flags for ``shards``: the ring, both listeners."""
    return [
        "--http-route-socket",
        str(work / "route.sock"),
        "--shards",
        ",".join(f"{s.name}={s.address}" for s in shards.values()),
        "--listen",
        f"127.0.0.1:{port}",
        "--http-listen",
        f"127.0.0.1:{http_port}",
        "--http-shards",
        ",".join(f"{s.name}={s.http_address}" for s in shards.values()),
    ]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    nginx = nginx_binary()
    work = tmp_path_factory.mktemp("shards")
    shards = {
        name: ShardProc(
            name,
            work / f"data-{name}",
            KekRing.generate_env_value(),
            free_port(),
            free_port(),
            http_port=free_port(),
        )
        for name in SHARDS
    }
    with running_shards(shards.values(), work):
        token = shared_token(list(shards.values()))
        nginx_port, nginx_http_port = free_port(), free_port()
        include = work / "lethe.conf"
        made = subprocess.run(
            [*LETHE, "shard", "nginx-config",
             *_nginx_flags(shards, nginx_port, nginx_http_port, work), "--out", str(include)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        conf = nginx_main_config(work, include)
        with running_nginx(nginx, conf, work, nginx_port) as nginx_proc:
            cluster = Cluster(shards, nginx_port, nginx_http_port, token, work, nginx_proc)
            yield cluster
            for client in cluster.clients:
                client.close()


def _holds(client: lc.Client, owner: str) -> bool:
    """Whether the shard ``client`` calls directly holds ``owner``; it lists the owner's threads.

    A shard that does not hold it answers NOT_FOUND, never an empty list.
    """
    try:
        return bool([t.name for t in client.iter_threads(f"owners/{owner}")])
    except lc.NotFound:
        return False


@pytest.fixture(scope="module")
def homes(cluster: Cluster) -> dict[str, str]:
    """Write 50 owners through nginx; return owner → the shard holding it.

    The shard is asked directly: exactly one shard has the owner's thread.
    """
    proxy = cluster.client()
    for owner in OWNERS:
        thread = proxy.create_thread(f"owners/{owner}", thread_id="t1")
        proxy.append_turns(
            thread.name, [{"role": "USER", "text": f"marker {owner} lake", "commit": True}]
        )
    direct = {name: cluster.client(s.address) for name, s in cluster.shards.items()}
    found: dict[str, str] = {}
    for owner in OWNERS:
        holders = [name for name, client in direct.items() if _holds(client, owner)]
        assert len(holders) == 1, (owner, holders)
        found[owner] = holders[0]
        turns = list(direct[holders[0]].iter_turns(f"owners/{owner}/threads/t1"))
        assert [t.text for t in turns] == [f"marker {owner} lake"]
    return found


def test_owners_written_through_nginx_land_on_one_shard_each(homes: dict[str, str]) -> None:
    assert sorted(homes) == OWNERS
    per_shard = {name: sum(1 for s in homes.values() if s == name) for name in SHARDS}
    assert all(count > 0 for count in per_shard.values()), per_shard  # the ring spreads them
    assert sum(per_shard.values()) == 50


def test_search_and_forget_through_nginx(cluster: Cluster, homes: dict[str, str]) -> None:
    proxy = cluster.client()
    owner = OWNERS[7]
    hits = proxy.search(f"owners/{owner}", query_text=owner, mode="LEXICAL")
    assert [h.turn.text for h in hits.hits] == [f"marker {owner} lake"]
    other = proxy.search(f"owners/{OWNERS[8]}", query_text=owner, mode="LEXICAL")
    # Another owner (maybe on another shard) sees only its own turns.
    assert {h.turn.name.split("/")[1] for h in other.hits} <= {OWNERS[8]}
    turn = f"owners/{owner}/threads/t1/turns/1"
    receipt = proxy.forget([turn])
    assert list(receipt.targets) == [turn]
    assert list(proxy.search(f"owners/{owner}", query_text=owner, mode="LEXICAL").hits) == []
    with pytest.raises(lc.RecordDeleted):
        proxy.get_turn(turn)
    home = cluster.client(cluster.shards[homes[owner]].address)
    with pytest.raises(lc.RecordDeleted):
        home.get_turn(turn)


def _raw_error(call: object) -> lc.LetheError:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as raw:
        return lc.error_from_rpc(raw)
    raise AssertionError("the call succeeded")


def test_a_call_without_the_header_is_refused_by_nginx(cluster: Cluster) -> None:
    proxy = cluster.client()
    err = _raw_error(
        lambda: proxy.stubs.threads.GetThread(
            threads_pb2.GetThreadRequest(name=f"owners/{OWNERS[0]}/threads/t1"),
            metadata=proxy.metadata,
        )
    )
    assert isinstance(err, lc.OwnerHeaderMissing), repr(err)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_misrouted_call_is_refused_by_the_shard(cluster: Cluster, homes: dict[str, str]) -> None:
    proxy = cluster.client()
    x = OWNERS[0]
    y = next(o for o in OWNERS if homes[o] != homes[x])
    err = _raw_error(
        lambda: proxy.stubs.threads.CreateThread(
            threads_pb2.CreateThreadRequest(parent=f"owners/{y}", thread_id="stray"),
            metadata=(*proxy.metadata, (OWNER_HEADER, x)),
        )
    )
    assert isinstance(err, lc.OwnerHeaderMismatch), repr(err)
    # Nothing of y was written on x's shard, nor on y's.
    for name, shard in cluster.shards.items():
        direct = cluster.client(shard.address)
        if name != homes[y]:
            assert not _holds(direct, y), name
            continue
        threads = [t.name for t in direct.iter_threads(f"owners/{y}")]
        assert threads == [f"owners/{y}/threads/t1"], name


def test_health_of_each_shard_through_nginx(cluster: Cluster) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{cluster.nginx_port}")
    try:
        health = health_pb2_grpc.HealthStub(channel)
        for name in SHARDS:
            reply = health.Check(
                health_pb2.HealthCheckRequest(), metadata=(("x-lethe-shard", name),), timeout=5
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
    finally:
        channel.close()


def test_a_marker_written_beside_the_server_answers_owner_moved(
    cluster: Cluster, homes: dict[str, str]
) -> None:
    owner = OWNERS[3]
    shard = cluster.shards[homes[owner]]
    dest = next(s for s in cluster.shards.values() if s.name != shard.name)
    env = {**os.environ, "LETHE_KEK": shard.kek}
    mark = [*LETHE, "shard", "mark-moved", "--data", str(shard.data), "--owner", owner]
    done = subprocess.run(
        [*mark, "--to", dest.name, "--target", dest.address],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    proxy = cluster.client()
    with pytest.raises(lc.OwnerMoved) as info:
        proxy.list_turns(f"owners/{owner}/threads/t1")
    assert (info.value.shard, info.value.target) == (dest.name, dest.address)
    unmark = [*LETHE, "shard", "unmark-moved", "--data", str(shard.data), "--owner", owner]
    done = subprocess.run(unmark, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert [t.seq for t in proxy.iter_turns(f"owners/{owner}/threads/t1")] == [1]


def test_a_watch_stream_through_nginx(cluster: Cluster) -> None:
    """Server streaming over nginx's HTTP/2 upstream.

    The event of a forget made through nginx arrives on a ``Watch`` opened
    through nginx.
    """
    proxy = cluster.client()
    owner = OWNERS[5]
    thread = f"owners/{owner}/threads/t1"
    turn = proxy.append_turns(thread, [{"role": "USER", "text": "to forget", "commit": True}])
    name = turn.turns[0].name
    proxy.forget([name])
    with proxy.watch(f"owners/{owner}", types=["RECORD_DELETED"], timeout=10) as stream:
        event = next(stream)
    assert event.type == events_pb2.RECORD_DELETED
    assert event.subject == name


def _connect_turns(cluster: Cluster, owner: str) -> list[str]:
    """The texts of ``owner``'s thread t1, listed over Connect (JSON) through nginx."""
    channel, md = cluster.connect(owner)
    listed = channel.unary(
        "/lethe.v1.Threads/ListTurns",
        threads_pb2.ListTurnsRequest(parent=f"owners/{owner}/threads/t1"),
        threads_pb2.ListTurnsResponse,
        md,
    )
    assert isinstance(listed, threads_pb2.ListTurnsResponse)
    return [t.text for t in listed.turns]


def test_connect_calls_through_nginx_reach_the_shard_grpc_reaches(
    cluster: Cluster, homes: dict[str, str]
) -> None:
    """Every owner's Connect call lands on the shard its gRPC calls land on.

    A ring of HTTP addresses would place owners elsewhere; the HTTP block asks
    the gRPC ring instead. A write over Connect is read back over gRPC on the
    owner's shard, asked directly.
    """
    proxy = cluster.client()
    for owner in OWNERS:  # a wrong shard would answer NOT_FOUND (it holds no such owner)
        over_grpc = [t.text for t in proxy.iter_turns(f"owners/{owner}/threads/t1")]
        assert _connect_turns(cluster, owner) == over_grpc, owner
    owner = OWNERS[11]
    channel, md = cluster.connect(owner, codec="proto")
    channel.unary(
        "/lethe.v1.Threads/AppendTurns",
        threads_pb2.AppendTurnsRequest(
            parent=f"owners/{owner}/threads/t1",
            turns=[threads_pb2.TurnInput(role=common_pb2.USER, text="over connect", commit=True)],
        ),
        threads_pb2.AppendTurnsResponse,
        md,
    )
    home = cluster.client(cluster.shards[homes[owner]].address)
    assert [t.text for t in home.iter_turns(f"owners/{owner}/threads/t1")][-1] == "over connect"
    # The route question is answered cleanly: nothing about it in nginx's error log.
    assert "_lethe_route" not in (cluster.work / "error.log").read_text()


def test_a_connect_call_without_the_header_is_refused_by_nginx(cluster: Cluster) -> None:
    channel, md = cluster.connect(None)
    with pytest.raises(ConnectRpcError) as refused:
        channel.unary(
            "/lethe.v1.Threads/GetThread",
            threads_pb2.GetThreadRequest(name=f"owners/{OWNERS[0]}/threads/t1"),
            threads_pb2.Thread,
            md,
        )
    assert refused.value.http_status == 400
    assert refused.value.body["details"][0]["debug"]["reason"] == "OWNER_HEADER_MISSING"


def test_a_connect_watch_stream_through_nginx(cluster: Cluster) -> None:
    """A Connect server stream through nginx: the event of a forget arrives, unbuffered."""
    owner = OWNERS[6]
    proxy = cluster.client()
    turn = proxy.append_turns(
        f"owners/{owner}/threads/t1", [{"role": "USER", "text": "to forget", "commit": True}]
    ).turns[0]
    channel, md = cluster.connect(owner, codec="proto")
    stream = channel.stream(
        "/lethe.v1.Events/Watch",
        events_pb2.WatchRequest(parent=f"owners/{owner}", types=[events_pb2.RECORD_DELETED]),
        events_pb2.Event,
        md,
        timeout=20,
    )
    try:
        proxy.forget([turn.name])
        event = next(stream)
    finally:
        stream.cancel()
    assert isinstance(event, events_pb2.Event)
    assert event.subject == turn.name


def _audit(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    metrics = ",".join(f"{s.name}=127.0.0.1:{s.metrics_port}" for s in cluster.shards.values())
    return subprocess.run(
        [*LETHE, "shard", "audit", "--metrics", metrics],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_one_command_audits_every_shard(cluster: Cluster, homes: dict[str, str]) -> None:
    done = _audit(cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [*SHARDS, "all"]
    assert "orphan_derivatives=0" in lines[-1]
    assert "records_without_key=0" in lines[-1]


def test_an_owner_a_shard_never_held_is_not_found_not_empty(cluster: Cluster) -> None:
    """Sharded servers answer reads of an owner they hold no row of NOT_FOUND, not empty.

    An empty success would hide data placed elsewhere. CreateThread creates the
    owner.
    """
    proxy = cluster.client()
    with pytest.raises(lc.NotFound) as info:
        list(proxy.iter_threads("owners/newcomer"))
    assert "holds no owners/newcomer" in info.value.details()
    with pytest.raises(lc.NotFound):
        proxy.search("owners/newcomer", query_text="anything", mode="LEXICAL")
    thread = proxy.create_thread("owners/newcomer", thread_id="t1")
    assert [t.name for t in proxy.iter_threads("owners/newcomer")] == [thread.name]


def _place(cluster: Cluster, placements: dict[str, str]) -> None:
    """Rewrite the nginx config with ``placements`` (owner → shard) and reload nginx.

    SIGHUP: new workers take the new map, old ones finish their calls.
    """
    pins = [f"--placement={owner}={shard}" for owner, shard in placements.items()]
    flags = _nginx_flags(cluster.shards, cluster.nginx_port, cluster.nginx_http_port, cluster.work)
    made = subprocess.run(
        [*LETHE, "shard", "nginx-config", *flags, *pins,
         "--out", str(cluster.work / "lethe.conf")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    cluster.nginx.send_signal(signal.SIGHUP)


@dataclass
class _Load:
    """Appends to one owner's thread through nginx until stopped, retrying ``UNAVAILABLE``.

    The retries (the move's refusals, nginx's reload) have a short backoff.
    """

    client: lc.Client
    thread: str
    acked: list[str] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            text = f"load {i}"
            try:
                self.client.append_turns(
                    self.thread, [{"role": "USER", "text": text, "commit": True}],
                    request_id=f"load-{i}",
                )  # fmt: skip
            except lc.Unavailable:
                self.refused += 1
                time.sleep(0.02)
                continue
            except lc.LetheError as exc:
                self.errors.append(f"{text}: {exc!r}")
                return
            self.acked.append(text)
            self.ack_times.append(time.monotonic())
            i += 1


def test_an_owner_moves_between_shards_under_write_load(
    cluster: Cluster, homes: dict[str, str]
) -> None:
    """An owner moved a → c under write load through nginx loses no write and leaves nothing on a.

    Moved through the ``lethe owner`` commands while a client writes to it
    through nginx: every acknowledged write is on c, what was forgotten before
    stays forgotten, and a holds nothing of it.
    """
    owner = next(o for o in OWNERS if homes[o] == "a")
    a, c = cluster.shards["a"], cluster.shards["c"]
    thread = f"owners/{owner}/threads/t1"
    proxy = cluster.client()
    forgotten = proxy.append_turns(thread, [{"role": "USER", "text": "forget me", "commit": True}])
    proxy.forget([forgotten.turns[0].name])
    load = _Load(cluster.client(), thread)
    writer = threading.Thread(target=load.run)
    writer.start()
    try:
        while len(load.acked) < 20:
            time.sleep(0.01)
        key = cluster.work / "c.receive-key"
        made = lethe_cli(c, "owner", "receive-key", "--out", str(key), "--json")
        assert made.returncode == 0, made.stderr
        public = json.loads(made.stdout)["public"]
        bundle = cluster.work / f"{owner}.lethe-owner"
        before = len(load.acked)
        started = time.monotonic()
        steps = [
            (a, ["export", "--owner", owner, "--to", "c", "--target", c.address,
                 "--recipient", public, "--out", str(bundle)]),
            (c, ["import", "--in", str(bundle), "--receive-key", str(key), "--from", "a"]),
            (None, []),
            (c, ["activate", "--owner", owner]),
            (a, ["release", "--owner", owner, "--json"]),
        ]  # fmt: skip
        for shard, args in steps:
            if shard is None:
                _place(cluster, {owner: "c"})
                continue
            done = lethe_cli(shard, "owner", *args, "--data", str(shard.data))
            assert done.returncode == 0, done.stdout + done.stderr
            if args[0] == "activate":
                activated = time.monotonic()
        receipt = json.loads(done.stdout)
        assert receipt["keys_destroyed"] > 0
        while len(load.acked) < before + 20 or load.ack_times[-1] < activated:
            assert writer.is_alive(), load.errors
            time.sleep(0.01)
    finally:
        load.stop.set()
        writer.join(30)
    assert load.errors == []
    gaps = [t2 - t1 for t1, t2 in zip(load.ack_times, load.ack_times[1:], strict=False)]
    print(
        f"\nmove of {owner} a→c under load: {len(load.acked)} writes acknowledged, "
        f"{load.refused} refusals retried, longest gap between acknowledged writes "
        f"{max(gaps):.3f} s, export→activate {activated - started:.3f} s"
    )
    # Every acknowledged write is on c (asked directly), in order, once.
    on_c = [t.text for t in cluster.client(c.address).iter_turns(thread)]
    assert [t for t in on_c if t.startswith("load ")] == load.acked
    assert "forget me" not in on_c
    with pytest.raises(lc.RecordDeleted):
        cluster.client(c.address).get_turn(forgotten.turns[0].name)
    hits = proxy.search(f"owners/{owner}", query_text=f"marker {owner} lake", mode="LEXICAL")
    assert hits.hits[0].turn.text == f"marker {owner} lake"
    # Over Connect the placement holds too: the calls reach c (the first page of turns).
    over_http = _connect_turns(cluster, owner)
    assert over_http
    assert over_http == on_c[: len(over_http)]
    # a answers OWNER_MOVED and holds nothing of the owner: no rows, no keys.
    with pytest.raises(lc.OwnerMoved) as moved:
        cluster.client(a.address).get_thread(thread)
    assert (moved.value.shard, moved.value.target) == ("c", c.address)
    os.environ["LETHE_KEK"] = a.kek
    try:
        store = Store(a.data, lock=False)
        try:
            assert store.owner_row_counts(owner) == {}
            assert list(store.keystore.list_record_keys(owner)) == []
        finally:
            store.close()
    finally:
        os.environ.pop("LETHE_KEK", None)
    # No plaintext of it on a's disk (its content was only ever ciphertext there).
    needles = [t.encode() for t in (f"marker {owner} lake", "forget me", *load.acked[-3:])]
    files = [f for f in a.data.rglob("*") if f.is_file()]
    assert [(f.name, n) for f in files for n in needles if n in f.read_bytes()] == []
    homes[owner] = "c"


def test_killing_a_shard_fails_only_its_owners(cluster: Cluster, homes: dict[str, str]) -> None:
    """Runs last (it kills shard b)."""
    victim = cluster.shards["b"]
    assert victim.proc is not None
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    proxy = cluster.client()
    for owner in OWNERS:
        if homes[owner] == "b":
            with pytest.raises(lc.ShardUnavailable) as info:
                proxy.get_thread(f"owners/{owner}/threads/t1")
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert info.value.info_metadata == {"shard": "b", "target": victim.address}
            with pytest.raises(lc.ShardUnavailable):
                proxy.append_turns(f"owners/{owner}/threads/t1", [{"role": "USER", "text": "x"}])
            with pytest.raises(ConnectRpcError) as over_http:
                _connect_turns(cluster, owner)
            assert over_http.value.http_status == 503
            assert over_http.value.body["details"][0]["debug"]["reason"] == "SHARD_UNAVAILABLE"
        else:
            thread = proxy.get_thread(f"owners/{owner}/threads/t1")
            reply = proxy.append_turns(thread.name, [{"role": "USER", "text": "still here"}])
            assert reply.turns[0].seq == thread.last_seq + 1
    audit = _audit(cluster)
    assert audit.returncode == 1
    assert "b: unreachable" in audit.stdout


def test_tls_on_both_sides_of_nginx(tmp_path: Path) -> None:
    """TLS on both sides of nginx: mutual TLS to a shard, TLS from the client.

    A shard serving mutual TLS, nginx verifying it (``--upstream-ca``) and
    presenting a client certificate, and TLS from the client to nginx.
    """
    nginx = nginx_binary()
    pki = make_pki(tmp_path / "pki")
    shard = ShardProc(
        "a", tmp_path / "data-a", KekRing.generate_env_value(), free_port(), http_port=free_port()
    )
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    start_shard(shard, tmp_path / "a.log", *tls, "--client-ca", str(pki.ca))
    assert shard.proc is not None
    assert shard.log is not None
    mp = pytest.MonkeyPatch()
    try:
        wait_for(tmp_path / "a.log", "lethe serving", shard.proc)
        token = new_token()
        _put_token(shard, token, mp)
        port, http_port = free_port(), free_port()
        include = tmp_path / "lethe.conf"
        upstream = ["--upstream-ca", str(pki.ca), "--upstream-server-name", "localhost"]
        upstream += ["--upstream-cert", str(pki.client_cert), "--upstream-key", str(pki.client_key)]
        listen = ["--listen", f"127.0.0.1:{port}", "--out", str(include), *tls]
        listen += ["--http-listen", f"127.0.0.1:{http_port}", "--http-shards"]
        listen += [f"a={shard.http_address}", "--http-route-socket", str(tmp_path / "route.sock")]
        made = subprocess.run(
            [*LETHE, "shard", "nginx-config", "--shards", f"a={shard.address}", *listen, *upstream],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert made.returncode == 0, made.stderr
        work = tmp_path / "nginx"
        work.mkdir()
        with running_nginx(nginx, nginx_main_config(work, include), work, port):
            roots = lc.TLSConfig(root_certificates=pki.read("ca"), server_name="localhost")
            with lc.Client(f"127.0.0.1:{port}", token, tls=roots, retry=None) as client:
                thread = client.create_thread("owners/alice", thread_id="t1")
                assert client.get_thread(thread.name).name == "owners/alice/threads/t1"
            # Plaintext to a TLS listener does not get through.
            plain = lc.Client(f"127.0.0.1:{port}", token, tls=False, retry=None, timeout=5)
            with plain, pytest.raises(lc.Unavailable):
                plain.get_thread("owners/alice/threads/t1")
            # Connect over TLS to nginx, and over mutual TLS from nginx to the shard.
            context = ssl.create_default_context(cafile=pki.ca)
            https = ConnectChannel(f"localhost:{http_port}", codec="json", ssl_context=context)
            got = https.unary(
                "/lethe.v1.Threads/GetThread",
                threads_pb2.GetThreadRequest(name="owners/alice/threads/t1"),
                threads_pb2.Thread,
                (("authorization", f"Bearer {token}"), (OWNER_HEADER, "alice")),
            )
            assert isinstance(got, threads_pb2.Thread)
            assert got.name == "owners/alice/threads/t1"
    finally:
        mp.undo()
        shard.proc.terminate()
        shard.proc.wait(15)
        shard.log.close()
