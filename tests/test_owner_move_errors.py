"""Careless and bad input to the ``lethe owner`` commands: refused cleanly, nothing left half-done.

Against two real ``lethe serve`` processes (KEK files): each refused step exits
1 or 2 with a message and no traceback, and leaves nothing half-done — no
marker that refuses the owner's writes on the source, no copy on the
destination, no store created where the operator mistyped one.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _shardprocs import ShardProc, lethe_cli, running_shards, shared_token
from conftest import free_port

import lethe.client as lc
from shredder import IntegrityError


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ShardProc]]:
    work = tmp_path_factory.mktemp("move-errors")
    shards = {
        name: ShardProc(name, work / f"data-{name}", "", free_port(), kek_file=work / f"kek-{name}")
        for name in ("a", "c")
    }
    with running_shards(shards.values(), work):
        yield shards


@pytest.fixture(scope="module")
def token(pair: dict[str, ShardProc]) -> str:
    return shared_token(list(pair.values()))


def _owner(shard: ShardProc, *args: str) -> subprocess.CompletedProcess[str]:
    return lethe_cli(shard, "owner", *args, "--data", str(shard.data))


def _refused(done: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert done.returncode == code, done.stdout + done.stderr
    assert text in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def _state(shard: ShardProc, owner: str) -> str:
    done = _owner(shard, "status", "--owner", owner, "--json")
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["state"])


def _rows(shard: ShardProc, owner: str) -> int:
    done = _owner(shard, "status", "--owner", owner, "--json")
    assert done.returncode == 0, done.stderr
    return sum(json.loads(done.stdout)["rows"].values())


def _make_owner(shard: ShardProc, token: str, owner: str) -> str:
    client = lc.Client(shard.address, token, tls=False, retry=None, timeout=15)
    thread = client.create_thread(f"owners/{owner}", thread_id="t1").name
    client.append_turns(thread, [{"role": "USER", "text": f"{owner} {i}", "commit": True}
                                 for i in range(3)])  # fmt: skip
    client.close()
    return thread


def _writes(shard: ShardProc, token: str, thread: str) -> bool:
    client = lc.Client(shard.address, token, tls=False, retry=None, timeout=15)
    try:
        client.append_turns(thread, [{"role": "USER", "text": "still writable", "commit": True}])
        return True
    except lc.OwnerMoving:
        return False
    finally:
        client.close()


def _receive_key(shard: ShardProc, path: Path) -> str:
    done = lethe_cli(shard, "owner", "receive-key", "--out", str(path), "--json")
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["public"])


def _export(src: ShardProc, owner: str, public: str, out: Path, *extra: str) -> Any:
    return _owner(src, "export", "--owner", owner, "--to", "c", "--recipient", public,
                  "--out", str(out), *extra)  # fmt: skip


def test_a_refused_export_leaves_the_owner_writable(
    pair: dict[str, ShardProc], token: str, tmp_path: Path
) -> None:
    a, c = pair["a"], pair["c"]
    thread = _make_owner(a, token, "ann")
    public = _receive_key(c, tmp_path / "c.key")
    _refused(_export(a, "ann", "deadbeef", tmp_path / "x"), 2, "64-hex-character")
    assert _state(a, "ann") == "served"
    _refused(_export(a, "ann", public, tmp_path / "nowhere" / "ann.out"), 2, "nowhere")
    assert _state(a, "ann") == "served"
    assert not (tmp_path / "nowhere").exists()
    wrong_kek = ("--kek-file", str(c.kek_file))
    _refused(_export(a, "ann", public, tmp_path / "ann.out", *wrong_kek), 2, "")
    assert _state(a, "ann") == "served"
    assert not (tmp_path / "ann.out").exists()
    assert _writes(a, token, thread)


def test_a_second_export_to_another_shard_is_refused(
    pair: dict[str, ShardProc], token: str, tmp_path: Path
) -> None:
    a, c = pair["a"], pair["c"]
    _make_owner(a, token, "ben")
    public = _receive_key(c, tmp_path / "c.key")
    assert _export(a, "ben", public, tmp_path / "ben.out").returncode == 0
    assert _export(a, "ben", public, tmp_path / "ben.out").returncode == 0  # repeated: the same
    again = _owner(a, "export", "--owner", "ben", "--to", "d", "--recipient", public,
                   "--out", str(tmp_path / "ben-d.out"))  # fmt: skip
    _refused(again, 1, "moving to c")
    assert not (tmp_path / "ben-d.out").exists()
    assert _owner(a, "abort", "--owner", "ben").returncode == 0


def test_a_bad_import_is_refused_and_leaves_nothing_on_the_destination(
    pair: dict[str, ShardProc], token: str, tmp_path: Path
) -> None:
    a, c = pair["a"], pair["c"]
    _make_owner(a, token, "cid")
    key = tmp_path / "c.key"
    public = _receive_key(c, key)
    out = tmp_path / "cid.out"
    assert _export(a, "cid", public, out).returncode == 0
    raw = out.read_bytes()
    line, _, rest = raw.partition(b"\n")
    header = json.loads(line)

    def imported(data: bytes, *extra: str) -> subprocess.CompletedProcess[str]:
        changed = tmp_path / "changed.out"
        changed.write_bytes(data)
        return _owner(c, "import", "--in", str(changed), "--receive-key", str(key),
                      "--from", "a", *extra)  # fmt: skip

    bad_rows = json.dumps(header | {"rows": []}).encode() + b"\n" + rest
    _refused(imported(bad_rows), 2, "not a complete lethe owner export")
    keys_changed = bytearray(raw)
    keys_changed[-5] ^= 1
    _refused(imported(bytes(keys_changed)), 2, "sealed to another receive key, or changed")
    assert _state(c, "cid") == "not held"  # no arriving marker, no row left behind
    _make_owner(c, token, "cal")  # c has keys to check a KEK against
    _refused(imported(raw, "--kek-file", str(a.kek_file)), 2, "KEK")
    assert (_state(c, "cid"), _rows(c, "cid")) == ("not held", 0)
    assert _owner(a, "abort", "--owner", "cid").returncode == 0


def test_an_import_where_the_owner_token_is_already_stored(
    pair: dict[str, ShardProc], token: str, tmp_path: Path
) -> None:
    """docs/sharding.md's way to use a token on every shard: store it on the destination first.

    The token is stored on the destination too before the move
    (``lethe shard token-import --owner``).
    """
    a, c = pair["a"], pair["c"]
    _make_owner(a, token, "dan")
    made = lethe_cli(a, "token", "create", "--data", str(a.data), "--owner", "dan")
    assert made.returncode == 0, made.stderr
    stored = lethe_cli(c, "shard", "token-import", "--data", str(c.data), "--owner", "dan",
                       stdin=made.stdout.strip() + "\n")  # fmt: skip
    assert stored.returncode == 0, stored.stderr
    key = tmp_path / "c.key"
    out = tmp_path / "dan.out"
    assert _export(a, "dan", _receive_key(c, key), out).returncode == 0
    args = ("import", "--in", str(out), "--receive-key", str(key), "--from", "a")
    done = _owner(c, *args)
    assert done.returncode == 0, done.stderr
    assert _owner(c, *args).returncode == 0  # repeated, as after a crash
    assert _owner(c, "activate", "--owner", "dan").returncode == 0
    assert _owner(a, "release", "--owner", "dan").returncode == 0
    mine = lc.Client(c.address, made.stdout.strip(), tls=False, retry=None, timeout=15)
    assert len(list(mine.iter_turns("owners/dan/threads/t1"))) == 3
    mine.close()


def _move(src: ShardProc, owner: str, to_data: Path, to_kek: Path | None) -> Any:
    return _owner(src, "move", "--owner", owner, "--from", "a", "--to", "c",
                  "--to-data", str(to_data), "--to-kek-file", str(to_kek))  # fmt: skip


def test_move_refuses_a_destination_that_is_not_a_store_or_the_source(
    pair: dict[str, ShardProc], token: str, tmp_path: Path
) -> None:
    a, c = pair["a"], pair["c"]
    _make_owner(a, token, "eve")
    typo = tmp_path / "data-cc"
    _refused(_move(a, "eve", typo, c.kek_file), 2, "no lethe store")
    assert not typo.exists()
    _refused(_move(a, "eve", a.data, a.kek_file), 2, "")
    assert (_state(a, "eve"), _state(c, "eve")) == ("served", "not held")


def test_move_with_the_wrong_destination_kek_is_refused(
    pair: dict[str, ShardProc], token: str
) -> None:
    a, c = pair["a"], pair["c"]
    thread = _make_owner(a, token, "fay")
    _make_owner(c, token, "gus")  # the destination has keys to check a KEK against
    _refused(_move(a, "fay", c.data, a.kek_file), 2, "KEK")
    assert _state(a, "fay") == "served"
    assert (_state(c, "fay"), _rows(c, "fay")) == ("not held", 0)
    assert _writes(a, token, thread)


@pytest.mark.parametrize(
    "header",
    [
        {},
        {"format": "lethe-owner-export/1", "data_bytes": 0, "keys_bytes": 0},  # no owner
        {"format": "other", "data_bytes": 0, "keys_bytes": 0, "rows": {}},
        {"format": "lethe-owner-export/1", "data_bytes": 5, "keys_bytes": 0, "rows": {}},
    ],
)
def test_an_export_file_with_a_bad_header_is_refused_not_a_traceback(
    header: dict[str, Any],
) -> None:
    from server.store import OwnerExport

    with pytest.raises(IntegrityError, match="not a complete lethe owner export"):
        OwnerExport.decode(json.dumps(header).encode() + b"\n")


def test_status_tells_a_served_owner_from_one_not_held(
    pair: dict[str, ShardProc], token: str
) -> None:
    a = pair["a"]
    _make_owner(a, token, "ivy")
    assert _state(a, "ivy") == "served"
    assert _state(a, "nobody-here") == "not held"
    assert _rows(a, "nobody-here") == 0
