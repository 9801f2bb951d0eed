"""Moving an owner between two real ``lethe serve`` processes, with the ``lethe owner`` commands.

Each process has its own data directory and KEK; the ``lethe owner`` commands
run beside them.

What is checked: the moved owner reads back the same on the destination (turns,
a pending turn, a memory with its lineage, vectors found by DENSE search, its
token), what was forgotten before the move stays forgotten, the source answers
``OWNER_MOVED`` and holds nothing of it (no rows, no keys, its other owners
untouched), writes are refused during the copy and the destination refuses
calls until activation; and a SIGKILL of the command at every step of the move
(each failpoint of :mod:`server.store._moves` and its writes), followed by the
same command again, converges to the owner whole on exactly one serving shard.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _shardprocs import (
    LETHE,
    ROOT,
    ShardProc,
    lethe_cli,
    running_shards,
    shared_token,
    start_shard,
    stop_shard,
    wait_for,
)
from conftest import free_port
from google.protobuf import json_format

import lethe.client as lc
from lethe.receipts import verify_receipt
from lethe.v1 import common_pb2
from server import Store
from shredder import IntegrityError, KekRing, KeyNotFoundError, Keystore, ReceiveKey

OWNER = "alice"
DIM = 16


def _unit(i: int) -> list[float]:
    v = [0.0] * DIM
    v[i % DIM] = 1.0
    v[(i + 3) % DIM] = 0.5
    return v


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ShardProc]]:
    work = tmp_path_factory.mktemp("move")
    shards = {
        name: ShardProc(name, work / f"data-{name}", KekRing.generate_env_value(), free_port())
        for name in ("a", "c")
    }
    with running_shards(shards.values(), work):
        yield shards


@pytest.fixture(scope="module")
def token(pair: dict[str, ShardProc]) -> str:
    return shared_token(list(pair.values()))


def _client(shard: ShardProc, token: str) -> lc.Client:
    return lc.Client(shard.address, token, tls=False, retry=None, timeout=15)


def _write_owner(client: lc.Client, owner: str) -> dict[str, Any]:
    """An owner with pending and committed turns, vectors, lineage and forgotten records.

    Committed and pending turns, vectors, a memory with lineage, a forgotten
    turn and a forgotten thread; returns the names to check.
    """
    thread = client.create_thread(f"owners/{owner}", thread_id="t1").name
    turns = [
        {"role": "USER", "text": f"{owner} turn {i} heron", "embedding": _unit(i), "commit": True}
        for i in range(12)
    ]
    client.append_turns(thread, turns)
    client.append_turns(thread, [{"role": "USER", "text": f"{owner} pending", "commit": False}])
    memory = client.create_memory(
        f"owners/{owner}",
        {
            "kind": "FACT",
            "text": f"{owner} likes herons",
            "state": "COMMITTED",
            "sources": [{"name": f"{thread}/turns/2", "version": 1}],
        },
        memory_id="m1",
    )
    # Created after m1 with an id that sorts before it: creation order is not id order.
    client.create_memory(
        f"owners/{owner}",
        {"kind": "FACT", "text": f"{owner} keeps bees", "state": "COMMITTED"},
        memory_id="m0",
    )
    gone = client.create_thread(f"owners/{owner}", thread_id="t2").name
    client.append_turns(gone, [{"role": "USER", "text": f"{owner} gone thread", "commit": True}])
    client.forget([gone])
    client.forget([f"{thread}/turns/5"])
    return {"thread": thread, "memory": memory.name, "gone": gone}


def _snapshot(client: lc.Client, owner: str) -> dict[str, Any]:
    """What the owner reads back: turns, memories and their sources, a DENSE and a LEXICAL search.

    Every thread's turns, its memories and their sources, the memories in
    creation order (``order_by="create_time"``: a move renumbers the owner's
    records in their old order), a DENSE search (vectors) and a LEXICAL one.
    """
    threads = sorted(t.name for t in client.iter_threads(f"owners/{owner}"))
    turns = {
        t: [
            (x.seq, x.text, int(x.state))
            for x in client.iter_turns(t, states=["COMMITTED", "PENDING"])
        ]
        for t in threads
    }
    memories = sorted(
        (m.name, m.text, tuple(s.name for s in m.sources))
        for m in client.iter_memories(f"owners/{owner}")
    )
    created = [m.name for m in client.iter_memories(f"owners/{owner}", order_by="create_time")]
    dense = client.search(f"owners/{owner}", query_embedding=_unit(3), mode="DENSE", top_k=3)
    lexical = client.search(f"owners/{owner}", query_text="heron", mode="LEXICAL", top_k=20)
    return {
        "threads": threads,
        "turns": turns,
        "memories": memories,
        "created": created,
        "dense": [h.turn.name or h.memory.name for h in dense.hits][:1],
        "lexical": sorted(h.turn.name or h.memory.name for h in lexical.hits),
    }


def _owner(shard: ShardProc, *args: str, fail: str = "") -> subprocess.CompletedProcess[str]:
    env_args = ("--data", str(shard.data))
    if fail:
        os.environ["LETHE_FAILPOINTS"] = fail
    try:
        return lethe_cli(shard, "owner", *args, *env_args)
    finally:
        os.environ.pop("LETHE_FAILPOINTS", None)


def _ok(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout)) if done.stdout.startswith("{") else {}


def _store_rows_and_keys(shard: ShardProc, owner: str) -> tuple[dict[str, int], int]:
    """The owner's rows and record keys in the shard's store (opened beside its server)."""
    saved = os.environ.pop("LETHE_KEK", None)
    if shard.kek_file is None:
        os.environ["LETHE_KEK"] = shard.kek
    try:
        store = Store(shard.data, kek_file=shard.kek_file, lock=False)
        try:
            return store.owner_row_counts(owner), len(list(store.keystore.list_record_keys(owner)))
        finally:
            store.close()
    finally:
        os.environ.pop("LETHE_KEK", None)
        if saved is not None:
            os.environ["LETHE_KEK"] = saved


def _move(
    src: ShardProc, dst: ShardProc, work: Path, owner: str, *, crash: str = "", step: str = ""
) -> dict[str, Any]:
    """The whole move, src → dst, optionally killed at one step's failpoint and run again.

    With ``crash``, the command of ``step`` is killed at that failpoint first,
    then run again (as an operator would).
    """
    key = work / f"{owner}-{dst.name}-{os.urandom(4).hex()}.key"
    public = _ok(lethe_cli(dst, "owner", "receive-key", "--out", str(key), "--json"))["public"]
    out = work / f"{owner}.lethe-owner"
    steps = {
        "export": (
            src,
            [
                "export",
                "--owner",
                owner,
                "--to",
                dst.name,
                "--target",
                dst.address,
                "--recipient",
                public,
                "--out",
                str(out),
                "--json",
            ],
        ),
        "import": (
            dst,
            ["import", "--in", str(out), "--receive-key", str(key), "--from", src.name, "--json"],
        ),
        "activate": (dst, ["activate", "--owner", owner, "--json"]),
        "release": (src, ["release", "--owner", owner, "--json"]),
    }
    docs: dict[str, Any] = {}
    for name, (shard, args) in steps.items():
        if name == step:
            killed = _owner(shard, *args, fail=f"{crash}=kill")
            assert killed.returncode == -9, (crash, killed.stdout, killed.stderr)
        docs[name] = _ok(_owner(shard, *args))
    return docs


def test_a_moved_owner_reads_back_the_same_and_leaves_nothing_behind(
    pair: dict[str, ShardProc], token: str, tmp_path: Path
) -> None:
    a, c = pair["a"], pair["c"]
    src, dst = _client(a, token), _client(c, token)
    names = _write_owner(src, OWNER)
    _write_owner(src, "bob")
    before = _snapshot(src, OWNER)
    assert before["dense"] == [f"{names['thread']}/turns/4"]  # _unit(3) is nearest turn 3's seq 4
    assert before["created"] == [names["memory"], f"owners/{OWNER}/memories/m0"]
    owner_token = lethe_cli(a, "token", "create", "--data", str(a.data), "--owner", OWNER)
    assert owner_token.returncode == 0, owner_token.stderr

    key = tmp_path / "c.key"
    public = _ok(lethe_cli(c, "owner", "receive-key", "--out", str(key), "--json"))["public"]
    out = tmp_path / "alice.lethe-owner"
    exported = _ok(
        _owner(
            a,
            "export",
            "--owner",
            OWNER,
            "--to",
            "c",
            "--target",
            c.address,
            "--recipient",
            public,
            "--out",
            str(out),
            "--json",
        )
    )
    assert exported["keys"] > 0
    assert exported["rows"]["owners"] == 1
    # During the copy the source serves reads and refuses writes.
    assert _snapshot(src, OWNER) == before
    with pytest.raises(lc.OwnerMoving) as refused:
        src.append_turns(names["thread"], [{"role": "USER", "text": "late", "commit": True}])
    assert refused.value.shard == "c"
    # Nothing of the export is plaintext.
    assert b"heron" not in out.read_bytes()
    assert b"alice turn" not in out.read_bytes()

    _ok(_owner(c, "import", "--in", str(out), "--receive-key", str(key), "--from", "a", "--json"))
    with pytest.raises(lc.OwnerMoving):
        dst.get_thread(names["thread"])  # not served before activation
    _ok(_owner(c, "activate", "--owner", OWNER, "--json"))
    receipt = _ok(_owner(a, "release", "--owner", OWNER, "--json"))
    assert receipt["shard"] == "c"
    assert receipt["keys_destroyed"] > 0
    signed = json_format.ParseDict(receipt["receipt"], common_pb2.DeletionReceipt())
    assert list(signed.targets) == [f"owners/{OWNER}"]
    assert signed.reason == "OWNER_MOVED"
    assert verify_receipt(signed, [k.public_key for k in src.get_server_info().receipt_keys])

    assert _snapshot(dst, OWNER) == before
    with pytest.raises(lc.RecordDeleted):
        dst.get_turn(f"{names['thread']}/turns/5")  # forgotten before the move
    with pytest.raises((lc.RecordDeleted, lc.NotFound)):
        dst.get_thread(names["gone"])
    lineage = dst.get_lineage(names["memory"], direction="ANCESTORS")
    assert [e.source.name for e in lineage.edges] == [f"{names['thread']}/turns/2"]
    appended = dst.append_turns(
        names["thread"], [{"role": "USER", "text": "after the move", "commit": True}]
    )
    assert [t.seq for t in appended.turns] == [14]
    # The owner's own token works on the destination.
    mine = lc.Client(c.address, owner_token.stdout.strip(), tls=False, retry=None, timeout=15)
    assert [t.text for t in mine.iter_turns(names["thread"])][-1] == "after the move"
    mine.close()

    with pytest.raises(lc.OwnerMoved) as moved:
        src.get_thread(names["thread"])
    assert (moved.value.shard, moved.value.target) == ("c", c.address)
    rows, keys = _store_rows_and_keys(a, OWNER)
    assert (rows, keys) == ({}, 0)
    assert _store_rows_and_keys(a, "bob")[1] > 0
    assert len(list(src.iter_turns("owners/bob/threads/t1"))) == 12  # bob is untouched
    src.close()
    dst.close()


STEPS = [
    ("move.export.after_marker", "export"),
    ("move.import.after_marker", "import"),
    ("move.import.after_keys", "import"),
    ("owner.import.after_keystore", "import"),
    ("owner.import.after_commit", "import"),
    ("move.import.after_rows", "import"),
    ("move.release.after_marker", "release"),
    ("move.release.after_keys", "release"),
    ("owner.purge.after_keystore", "release"),
    ("owner.purge.after_commit", "release"),
]


@pytest.mark.slow
def test_a_kill_at_every_step_of_a_move_converges(
    pair: dict[str, ShardProc], token: str, tmp_path: Path
) -> None:
    a, c = pair["a"], pair["c"]
    owner = "carol"
    _write_owner(_client(a, token), owner)
    expected = _snapshot(_client(a, token), owner)
    here, there = a, c
    for crash, step in STEPS:
        _move(here, there, tmp_path, owner, crash=crash, step=step)
        assert _snapshot(_client(there, token), owner) == expected, crash
        with pytest.raises(lc.OwnerMoved):
            _client(here, token).get_thread(f"owners/{owner}/threads/t1")
        assert _store_rows_and_keys(here, owner) == ({}, 0), crash
        here, there = there, here


@pytest.fixture(scope="module")
def filed_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ShardProc]]:
    """Two servers whose KEKs are files.

    ``lethe owner move`` opens both stores in one process, so their KEKs cannot
    both come from ``LETHE_KEK``.
    """
    work = tmp_path_factory.mktemp("move-files")
    shards = {
        name: ShardProc(name, work / f"data-{name}", "", free_port(), kek_file=work / f"kek-{name}")
        for name in ("a", "c")
    }
    with running_shards(shards.values(), work):
        yield shards


def _one_command_move(src: ShardProc, dst: ShardProc, owner: str, fail: str = "") -> Any:
    args = ["move", "--owner", owner, "--from", src.name, "--to", dst.name,
            "--target", dst.address, "--to-data", str(dst.data),
            "--to-kek-file", str(dst.kek_file), "--json"]  # fmt: skip
    return _owner(src, *args, fail=fail)


@pytest.mark.slow
def test_one_command_moves_an_owner_and_resumes_after_a_kill_at_any_step(
    filed_pair: dict[str, ShardProc],
) -> None:
    a, c = filed_pair["a"], filed_pair["c"]
    token = shared_token([a, c])
    owner = "dora"
    _write_owner(_client(a, token), owner)
    expected = _snapshot(_client(a, token), owner)
    here, there = a, c
    for crash, _ in STEPS:
        killed = _one_command_move(here, there, owner, fail=f"{crash}=kill")
        assert killed.returncode == -9, (crash, killed.stdout, killed.stderr)
        receipt = _ok(_one_command_move(here, there, owner))
        assert receipt["shard"] == there.name
        assert _snapshot(_client(there, token), owner) == expected, crash
        with pytest.raises(lc.OwnerMoved):
            _client(here, token).get_thread(f"owners/{owner}/threads/t1")
        assert _store_rows_and_keys(here, owner) == ({}, 0), crash
        here, there = there, here
    # Under LETHE_KEK both stores would get one KEK: refused, nothing done.
    os.environ["LETHE_KEK"] = a.kek or "x"
    try:
        refused = subprocess.run(
            [*LETHE, "owner", "move", "--owner", owner, "--from", here.name, "--to", there.name,
             "--data", str(here.data), "--to-data", str(there.data)],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
    finally:
        os.environ.pop("LETHE_KEK", None)
    assert refused.returncode == 2
    assert "one KEK" in refused.stderr


def test_writes_during_a_one_command_move_are_refused_briefly_and_none_is_lost(
    filed_pair: dict[str, ShardProc],
) -> None:
    a, c = filed_pair["a"], filed_pair["c"]
    made = lethe_cli(a, "token", "create", "--data", str(a.data), "--admin")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    imported = lethe_cli(c, "shard", "token-import", "--data", str(c.data), "--admin",
                         stdin=secret + "\n")  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    owner = "erin"
    thread = _client(a, secret).create_thread(f"owners/{owner}", thread_id="t1").name
    acked: list[str] = []
    times: list[float] = []
    refused = 0
    stop = threading.Event()

    def write() -> None:
        nonlocal refused
        target, i = a, 0
        client = _client(target, secret)
        while not stop.is_set():
            try:
                client.append_turns(thread, [{"role": "USER", "text": f"w{i}", "commit": True}])
            except lc.OwnerMoving:
                refused += 1
                time.sleep(0.005)
                continue
            except lc.OwnerMoved as exc:
                client.close()
                target = c if exc.target == c.address else a
                client = _client(target, secret)
                continue
            acked.append(f"w{i}")
            times.append(time.monotonic())
            i += 1
        client.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        while len(acked) < 50:
            time.sleep(0.01)
        receipt = _ok(_one_command_move(a, c, owner))
        mark = len(acked)
        while len(acked) < mark + 50:
            assert writer.is_alive()
            time.sleep(0.01)
    finally:
        stop.set()
        writer.join(30)
    gaps = [t2 - t1 for t1, t2 in itertools.pairwise(times)]
    print(
        f"\none-command move under load: {len(acked)} writes acknowledged, {refused} refusals "
        f"retried, writes refused for {receipt['writes_refused_seconds']:.3f} s of the move's "
        f"{receipt['seconds']:.3f} s, longest gap between acknowledged writes {max(gaps):.3f} s"
    )
    on_c = [t.text for t in _client(c, secret).iter_turns(thread)]
    assert on_c == acked  # every acknowledged write, in order, once


def test_old_backups_of_the_source_do_not_bring_a_moved_owner_back(
    filed_pair: dict[str, ShardProc], tmp_path: Path
) -> None:
    """Old backups of the source bring nothing readable of a moved owner back.

    Runs last (it stops and restores shard a). A data backup of a taken before
    the move, restored beside a's keystore after it, yields a's other owners
    and nothing readable of the moved one; a copy of a's keystore from before
    the move opens nothing once a has rotated.
    """
    a, c = filed_pair["a"], filed_pair["c"]
    made = lethe_cli(a, "token", "create", "--data", str(a.data), "--admin")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    lethe_cli(c, "shard", "token-import", "--data", str(c.data), "--admin", stdin=secret + "\n")
    _write_owner(_client(a, secret), "gail")
    _write_owner(_client(a, secret), "hugo")
    backup = tmp_path / "a-backup"
    done = lethe_cli(a, "backup", "--data", str(a.data), "--out", str(backup))
    assert done.returncode == 0, done.stderr
    old_keystore = tmp_path / "a-keystore-copy"
    shutil.copytree(a.data / "keystore", old_keystore)
    _ok(_one_command_move(a, c, "gail"))

    stop_shard(a)
    rotated = lethe_cli(a, "rotate", "--data", str(a.data))
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    kek = KekRing.load_or_create(a.kek_file, create=False) if a.kek_file else None
    assert kek is not None
    snapshot = Keystore(old_keystore, kek, map_size=1 << 26)
    try:
        with pytest.raises((KeyNotFoundError, IntegrityError)):
            snapshot.export_owner("gail", ReceiveKey.generate().public_hex)
    finally:
        snapshot.close()

    restored = lethe_cli(a, "restore", "--data", str(a.data), "--backup", str(backup))
    assert restored.returncode == 0, restored.stdout + restored.stderr
    start_shard(a, tmp_path / "a-restored.log")
    assert a.proc is not None
    wait_for(tmp_path / "a-restored.log", "lethe serving", a.proc)
    src = _client(a, secret)
    assert len(list(src.iter_turns("owners/hugo/threads/t1"))) == 12
    texts: list[str] = []
    with contextlib.suppress(lc.LetheError):
        for thread in src.iter_threads("owners/gail"):
            texts += [t.text for t in src.iter_turns(thread.name)]
    assert texts == []
    with pytest.raises(lc.LetheError):
        src.get_turn("owners/gail/threads/t1/turns/1")
    # c still holds gail, whole.
    assert len(list(_client(c, secret).iter_turns("owners/gail/threads/t1"))) == 12
