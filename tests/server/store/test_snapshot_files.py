"""Sealed index-snapshot files on a real store and keystore.

A staged snapshot round-trips through its frames; a frame swapped, a byte
flipped, a file cut short, or a file of another owner does not open and is
removed; a snapshot whose key a forget destroyed never opens again, from its
place or from a copy; a staged snapshot whose key went meanwhile is not put in
place; nothing of a snapshot is in a backup; start-up removes stray files and
keys and says how many.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from _one_thread import one_thread_store

import server.store._snapshots as snapshots
from server.errors import NotFound, RecordDeleted
from server.store import ForgetTargets, Store
from server.store._snapshots import SNAPSHOT_KEY_ID
from shredder import AssociatedData, KeyNotFoundError, RingRef

OWNER = "alice"
BODY = bytes(range(256)) * 300  # 76,800 bytes: several frames at FRAME_BYTES 16 KiB


@pytest.fixture
def store(tmp_path: Path, kek_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setattr(snapshots, "FRAME_BYTES", 16 << 10)
    s = one_thread_store(tmp_path / "d", 5)
    yield s
    s.close()


def _staged(store: Store, body: bytes = BODY, owner: str = OWNER) -> Path:
    staged = store.stage_snapshot(owner, len(body), [body[:1000], memoryview(body)[1000:]])
    assert staged.temp.exists()
    assert staged.generation > 1 or not staged.final.exists()  # in place only once published
    assert staged.publish()
    assert not staged.temp.exists()
    return staged.final


def test_a_snapshot_round_trips_through_its_frames(store: Store) -> None:
    path = _staged(store)
    assert path == store.data_dir / "index" / "alice.snapshot"
    assert path.stat().st_mode & 0o777 == 0o600
    assert BODY not in path.read_bytes()
    assert BODY[:64] not in path.read_bytes()
    assert store.read_snapshot(OWNER) == (1, bytearray(BODY))
    _staged(store, b"")  # an empty body is one empty frame
    assert store.read_snapshot(OWNER) == (2, bytearray())  # the generation counts on


def _frames(raw: bytes) -> tuple[bytes, list[bytes]]:
    head, rest = raw[:36], raw[36:]
    frames = []
    while rest:
        size = int.from_bytes(rest[:4], "little")
        frames.append(rest[: 4 + size])
        rest = rest[4 + size :]
    return head, frames


@pytest.mark.parametrize("damage", ["swap", "flip", "cut", "drop", "other_owner"])
def test_a_damaged_or_moved_snapshot_does_not_open_and_is_removed(
    store: Store, damage: str
) -> None:
    path = _staged(store)
    head, frames = _frames(path.read_bytes())
    assert len(frames) == 5
    if damage == "swap":
        frames[1], frames[2] = frames[2], frames[1]
    elif damage == "flip":
        frames[3] = frames[3][:40] + bytes([frames[3][40] ^ 1]) + frames[3][41:]
    elif damage == "drop":
        frames.pop()
    raw = head + b"".join(frames)
    if damage == "cut":
        raw = raw[:-7]
    if damage == "other_owner":
        store.create_thread("bob", "t1", "")
        _staged(store, BODY, "bob")
        target = path.with_name("bob.snapshot")
    else:
        target = path
    target.write_bytes(raw)
    assert store.read_snapshot(target.name.removesuffix(".snapshot")) is None
    assert not target.exists()


def test_a_forget_destroys_the_key_and_a_copy_never_opens_again(
    store: Store, tmp_path: Path
) -> None:
    path = _staged(store)
    copy = tmp_path / "copy.snapshot"
    shutil.copy(path, copy)
    entry = store.plan_forget(
        OWNER, ForgetTargets.of(turns=[("t1", 2)]), reason="FORGET", request_time=0.0
    )
    assert path.exists()  # step 1 leaves it: the key goes in step 3
    store.finish_forget(entry, 0.0)
    assert not path.exists()
    assert not store.keystore.has_record_key(RingRef(OWNER, None), SNAPSHOT_KEY_ID)
    with pytest.raises(KeyNotFoundError):
        store.keystore.open(
            RingRef(OWNER, None),
            SNAPSHOT_KEY_ID,
            AssociatedData(OWNER, "owners/alice/index-snapshot", 1, "index-snapshot/1/0/5/76800"),
            _frames(copy.read_bytes())[1][0][4:],
        )
    shutil.copy(copy, path)  # the old file put back in place: it does not open
    assert store.read_snapshot(OWNER) is None
    assert not path.exists()
    # The next snapshot gets a new key, which opens only the new one.
    _staged(store, b"after")
    assert store.read_snapshot(OWNER) == (1, bytearray(b"after"))


def test_a_staged_snapshot_whose_key_went_is_not_put_in_place(store: Store) -> None:
    staged = store.stage_snapshot(OWNER, len(BODY), [BODY])
    entry = store.plan_forget(
        OWNER, ForgetTargets.of(turns=[("t1", 1)]), reason="FORGET", request_time=0.0
    )
    store.finish_forget(entry, 0.0)
    assert not staged.publish()
    assert not staged.temp.exists()
    assert not staged.final.exists()


def test_a_whole_owner_forget_leaves_no_snapshot_and_no_key(store: Store) -> None:
    path = _staged(store)
    entry = store.plan_forget(
        OWNER, ForgetTargets.of(whole_owner=True), reason="FORGET", request_time=0.0
    )
    store.finish_forget(entry, 0.0)
    assert not path.exists()
    assert store.snapshot_strays() == 0
    with pytest.raises((NotFound, RecordDeleted)):  # no key is made for a forgotten owner
        store.stage_snapshot(OWNER, 1, [b"x"])
    assert store.snapshot_strays() == 0


def test_start_up_removes_stray_files_and_keys(store: Store, tmp_path: Path) -> None:
    path = _staged(store)
    folder = path.parent
    (folder / "alice.snapshot.tmp").write_bytes(b"a write a crash cut short")
    (folder / "nobody.snapshot").write_bytes(b"an owner the store does not hold")
    (folder / "not a snapshot").write_bytes(b"?")
    store.create_thread("bob", "t1", "")
    _staged(store, b"bob's", "bob")
    (folder / "bob.snapshot").unlink()  # a key without a snapshot
    assert store.snapshot_strays() == 4
    assert store.snapshot_strays("alice") == 1
    done = store.clean_snapshots()
    assert (done.files, done.keys) == (3, 1)
    assert sorted(p.name for p in folder.iterdir()) == ["alice.snapshot"]
    assert store.snapshot_strays() == 0
    assert store.read_snapshot(OWNER) == (1, bytearray(BODY))
    assert not store.keystore.has_record_key(RingRef("bob", None), SNAPSHOT_KEY_ID)
    # A snapshot whose key is gone (a forget cut between its steps) is removed too.
    shutil.copy(path, tmp_path / "keep")
    entry = store.plan_forget(
        OWNER, ForgetTargets.of(turns=[("t1", 3)]), reason="FORGET", request_time=0.0
    )
    store.finish_forget(entry, 0.0)
    shutil.copy(tmp_path / "keep", path)
    assert store.snapshot_strays() == 1
    assert store.clean_snapshots().files == 1
    assert not path.exists()


def test_the_snapshot_key_is_no_key_without_record(store: Store) -> None:
    _staged(store)
    assert store.audit(OWNER).keys_without_record == 0
    assert store.check_keys().unreferenced == []
    assert store.destroy_unreferenced_keys() == 0
    assert store.read_snapshot(OWNER) is not None


def test_a_backup_carries_no_snapshot(store: Store, tmp_path: Path) -> None:
    from shredder import backup_environment

    _staged(store)
    out = tmp_path / "backup"
    backup_environment(store.data_dir / "data", out, store.store_id, env=store.env)
    names = [p.name for p in out.rglob("*")]
    assert names
    assert not [n for n in names if "snapshot" in n or n == "index"]
    for file in out.rglob("*"):
        if file.is_file():
            assert BODY[:64] not in file.read_bytes()
