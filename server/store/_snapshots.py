"""Index snapshots on disk: sealed files under one key per owner, and their clean-up.

An owner's in-memory indexes (``server/retrieval``) may be kept between
processes as a *snapshot*: bytes the retriever serialises, which this part seals
and keeps in a file. The store never reads them; it holds ciphertext and a
header of ids and sizes, as it does for every payload.

Where: ``DIR/index/{owner}.snapshot`` (``DIR`` the data directory), beside
``data/`` and not in it, so ``lethe backup`` (a copy of the data environment)
never carries one. A write goes to ``{owner}.snapshot.tmp``, is synced, and is
renamed over the file (then the directory is synced): a reader sees the old
snapshot or the new one, never a part.

Key: the record key :data:`SNAPSHOT_KEY_ID` in the owner's ring (the ring of
derivatives that span threads), made on the first write
(:meth:`SnapshotsPart.stage_snapshot`, write op ``snapshot.key``). Every
deletion of the owner's records destroys it in the same keystore transaction as
the deletion's own keys (:meth:`server.store.Store.finish_forget`, step 3) and
then removes the file, so once a forget has returned no snapshot written before
it — on disk, in a copy, anywhere — can be opened with the live keystore; the
next snapshot gets a new key. Rotation renews the owner ring like any ring that
lost a key, so lingering copies of the destroyed key (free pages, keystore
snapshots) stop opening it too.

File layout (integers little-endian)::

    offset  size  field
    0       8     magic b"lethesnp"
    8       4     format (:data:`SNAPSHOT_FORMAT`)
    12      8     generation: 1 for the owner's first snapshot, +1 for each one after
    20      8     plaintext size in bytes
    28      4     frame size in bytes (:data:`FRAME_BYTES`; the last frame may be shorter)
    32      4     frame count n
    36      ...   n frames: 4-byte ciphertext length, then the frame sealed with
                  XChaCha20-Poly1305 under the snapshot key (``shredder`` layout: 24-byte
                  nonce, ciphertext, 16-byte tag)

Each frame's associated data binds the owner, the record id
``owners/{owner}/index-snapshot``, the generation (as the version) and the payload
type ``index-snapshot/{format}/{frame}/{n}/{plaintext size}``: a frame moved to
another place, another snapshot, another owner, or a file cut short, fails to
open. Frames bound memory: a snapshot is sealed 1 MiB at a time
(:data:`FRAME_BYTES`) and opened a frame at a time.

Rows: a snapshot is checked against the store by the digests of the owner's rows
(:meth:`SnapshotsPart.row_digests`: BLAKE2b-64 of each turn's and memory's
stored metadata row, ids and states, never content), so a load decodes only the
rows written since the snapshot was saved (:meth:`SnapshotsPart.snapshot_rows`
gives a saver the rows and their digests from one read transaction).

Strays: a temporary file a crash left, a snapshot whose key is gone (a forget
that crashed between destroying the key and removing the file, or an owner gone
whole), a snapshot key without a snapshot (a crash between a first save's key
and its rename; a first save that was abandoned or discarded destroys its key
at once: :meth:`SnapshotsPart.drop_unused_snapshot_key`). Start-up removes them
(:meth:`SnapshotsPart.clean_snapshots`) and the audit counts them (a hint, as a
stray opens nothing).

Failpoints: ``snapshot.after_temp`` (sealed and synced in the temporary file,
not in place) and ``snapshot.after_rename`` (in place, directory not synced);
the key's write op has ``snapshot.key.after_keystore`` and ``.after_commit``.

Thread rules: any thread. Writes of snapshots are serialised by one lock; the
key is made through the writer thread. :meth:`SnapshotsPart.clean_snapshots`
only at start-up, before anything is served.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar, cast

import lmdb

from server.errors import NotFound, RecordDeleted
from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._records import MemMeta, TurnMeta
from server.store._writer import WriteOp
from shredder import (
    AssociatedData,
    IntegrityError,
    KeyNotFoundError,
    RingRef,
    declare,
    failpoint,
    fsync_dir,
)

_log = logging.getLogger(__name__)

SNAPSHOT_KEY_ID = "index-snapshot"
"""The record key (in the owner ring) that seals the owner's index snapshot."""
SNAPSHOT_DIR = "index"
"""The snapshots' directory in the data directory (never in a backup: not in ``data/``)."""
SNAPSHOT_FORMAT = 1
"""File format written and the only one read."""
FRAME_BYTES = 1 << 20
"""Plaintext bytes per sealed frame written (1 MiB; any size is read: the header says).

A save holds about three frames at a time (the one being filled, its copy,
its ciphertext): at 8 MiB that was 24 MiB beside the indexes of the owner."""
_MAGIC = b"lethesnp"
_HEADER = struct.Struct("<8sIQQII")
_LENGTH = struct.Struct("<I")
_SUFFIX = ".snapshot"
_TEMP = ".snapshot.tmp"
_OWNER = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


class SnapshotSink(Protocol):
    """Where :meth:`SnapshotsPart.read_snapshot_into` puts a snapshot's plaintext, in order."""

    def write(self, data: bytes) -> None:
        """Take the next plaintext bytes (``ValueError``: they do not fit)."""


_SinkT = TypeVar("_SinkT", bound=SnapshotSink)


class _Plaintext:
    """A sink that keeps the whole plaintext (:meth:`SnapshotsPart.read_snapshot`)."""

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)
        self._at = 0

    def write(self, data: bytes) -> None:
        self.data[self._at : self._at + len(data)] = data
        self._at += len(data)


FP_AFTER_TEMP = declare(
    "snapshot.after_temp",
    "an index snapshot is sealed and synced in its temporary file, not yet in place",
)
FP_AFTER_RENAME = declare(
    "snapshot.after_rename",
    "an index snapshot was renamed into place; its directory is not yet synced",
)


def _noop(txn: lmdb.Transaction) -> None:
    del txn


def _ad(owner: str, generation: int, frame: int, frames: int, size: int) -> AssociatedData:
    kind = f"index-snapshot/{SNAPSHOT_FORMAT}/{frame}/{frames}/{size}"
    return AssociatedData(owner, f"owners/{owner}/index-snapshot", generation, kind)


def row_digest(raw: bytes) -> int:
    """BLAKE2b-64 of a stored metadata row, as a signed int (what a snapshot records per row)."""
    digest = hashlib.blake2b(raw, digest_size=8, person=b"lethe-ix-row").digest()
    return int.from_bytes(digest, "little", signed=True)


class RowSink(Protocol):
    """Takes an owner's stored rows one at a time, as reads see them (``scan_rows``).

    Deleted rows are handed over too; whatever the sink keeps of a row is its own.
    """

    now: float
    """The time (seconds since the epoch) the rows are to be read as of."""

    def turn(self, meta: TurnMeta) -> None:
        """Take one stored turn."""

    def memory(self, meta: MemMeta) -> None:
        """Take one stored memory."""


@dataclass(frozen=True, slots=True)
class SnapshotCleanup:
    """What :meth:`SnapshotsPart.clean_snapshots` removed at start-up.

    Attributes:
        files: snapshot files removed (temporary ones, ones whose key is gone,
            ones of owners the store no longer holds).
        keys: snapshot keys destroyed (no snapshot file to open).
    """

    files: int = 0
    keys: int = 0


class StagedSnapshot:
    """A sealed snapshot in its temporary file, synced, not yet in place.

    :meth:`publish` renames it over the owner's snapshot, :meth:`discard`
    removes it; one of them once. Made by :meth:`SnapshotsPart.stage_snapshot`.
    """

    __slots__ = ("_done", "_key_alive", "final", "generation", "owner", "size", "temp")

    def __init__(
        self,
        owner: str,
        generation: int,
        temp: Path,
        final: Path,
        size: int,
        key_alive: Callable[[], bool],
    ) -> None:
        self.owner = owner
        self.generation = generation
        self.temp = temp
        self.final = final
        self.size = size
        self._key_alive = key_alive
        self._done = False

    def publish(self) -> bool:
        """Rename it into place and sync the directory, if its key still exists.

        A deletion that destroyed the key since it was sealed made it
        unopenable: it is discarded instead.

        Returns:
            Whether it was put in place.

        Raises:
            OSError: the rename or the sync failed (the temporary file is removed).
        """
        if self._done:
            return False
        if not self._key_alive():
            self.discard()
            return False
        self._done = True
        try:
            os.replace(self.temp, self.final)
        except OSError:
            self.temp.unlink(missing_ok=True)
            raise
        failpoint(FP_AFTER_RENAME)
        fsync_dir(self.final.parent)
        return True

    def discard(self) -> None:
        """Remove the temporary file (idempotent; nothing after :meth:`publish`)."""
        if not self._done:
            self._done = True
            self.temp.unlink(missing_ok=True)


class SnapshotsPart(StoreBase):
    """Sealed index snapshots and their key (see the module docstring)."""

    data_dir: Path
    """The data directory (resolved)."""
    _snapshot_guard = threading.Lock()

    @property
    def snapshot_dir(self) -> Path:
        """``DIR/index``, where the snapshots are (created on the first write)."""
        return self.data_dir / SNAPSHOT_DIR

    def _snapshot_path(self, owner: str, suffix: str = _SUFFIX) -> Path:
        if not _OWNER.fullmatch(owner):
            raise ValueError(f"malformed owner id {owner!r}")
        return self.snapshot_dir / f"{owner}{suffix}"

    def has_snapshot(self, owner: str) -> bool:
        """Whether a snapshot file of ``owner`` is in place (it may not open)."""
        return self._snapshot_path(owner).exists()

    def _ensure_snapshot_key(self, owner: str) -> None:
        """Make the owner's snapshot key if it is missing (write op ``snapshot.key``).

        Raises:
            NotFound, RecordDeleted: the owner has no row, or is being forgotten
                (the key made for it is destroyed again by the writer).
        """
        ring = RingRef(owner, None)

        def apply(txn: lmdb.Transaction) -> None:
            if self._owner_row(txn, owner) is None:
                raise NotFound(f"owners/{owner} not found")
            if self._tombstone_of(txn, f"owners/{owner}") is not None:
                raise RecordDeleted(f"owners/{owner} was deleted")

        if not self.keystore.has_record_key(ring, SNAPSHOT_KEY_ID):
            self.writer.run(
                WriteOp(
                    apply, owner=owner, create_keys=[(ring, SNAPSHOT_KEY_ID)], name="snapshot.key"
                )
            )

    def _generation(self, path: Path) -> int:
        """The generation in a snapshot file's header, 0 when it has none."""
        try:
            with path.open("rb") as f:
                head = f.read(_HEADER.size)
        except OSError:
            return 0
        if len(head) != _HEADER.size:
            return 0
        magic, fmt, generation, _, _, _ = _HEADER.unpack(head)
        return int(generation) if magic == _MAGIC and fmt == SNAPSHOT_FORMAT else 0

    def stage_snapshot(
        self, owner: str, size: int, chunks: Iterable[bytes | bytearray | memoryview]
    ) -> StagedSnapshot:
        """Seal ``size`` bytes of ``chunks`` into the owner's temporary snapshot file, synced.

        Makes the owner's snapshot key first if it has none. The caller decides
        whether to :meth:`StagedSnapshot.publish` it (the retriever does so only
        if nothing left its indexes meanwhile) or to discard it.

        Args:
            owner: whose snapshot.
            size: total bytes of ``chunks``.
            chunks: the plaintext, in order (any split).

        Returns:
            The staged snapshot (generation: the one in place plus 1).

        Raises:
            NotFound, RecordDeleted: the owner is gone or being forgotten.
            KeyNotFoundError: the key was destroyed while sealing (a forget).
            OSError: the file could not be written (the temporary file is removed).
            ValueError: the chunks hold another number of bytes than ``size``.
        """
        ring = RingRef(owner, None)
        temp, final = self._snapshot_path(owner, _TEMP), self._snapshot_path(owner)
        with self._snapshot_guard:
            self._ensure_snapshot_key(owner)
            generation = self._generation(final) + 1
            frames = max(1, -(-size // FRAME_BYTES))
            self.snapshot_dir.mkdir(mode=0o700, exist_ok=True)
            written = 0
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(
                        _HEADER.pack(_MAGIC, SNAPSHOT_FORMAT, generation, size, FRAME_BYTES, frames)
                    )
                    for index, frame in enumerate(_frames(chunks, FRAME_BYTES)):
                        ad = _ad(owner, generation, index, frames, size)
                        sealed = self.keystore.seal(ring, SNAPSHOT_KEY_ID, ad, frame)
                        out.write(_LENGTH.pack(len(sealed)))
                        out.write(sealed)
                        written += len(frame)
                    if written != size:
                        raise ValueError(f"snapshot chunks hold {written} bytes, not {size}")
                    out.flush()
                    os.fsync(out.fileno())
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
            failpoint(FP_AFTER_TEMP)

        def key_alive() -> bool:
            return self.keystore.has_record_key(ring, SNAPSHOT_KEY_ID)

        return StagedSnapshot(owner, generation, temp, final, size, key_alive)

    def drop_unused_snapshot_key(self, owner: str) -> bool:
        """Destroy the owner's snapshot key if no snapshot file is in place; whether it did.

        For a save that was abandoned, discarded or failed after it made the
        key (the owner's first save): the key would otherwise stay, sealing
        nothing, until start-up removed it as a stray. Checked under the lock
        that staging holds, and kept while a staged snapshot's temporary file
        waits for its rename; a save in another process that finds the key gone
        discards its file (:meth:`StagedSnapshot.publish`), or cannot seal and
        writes none. A key made while a forget had destroyed the old one and
        not yet removed its file stays until start-up.

        Raises:
            LetheError: the write failed (the key stays; start-up removes it).
        """
        ring = RingRef(owner, None)
        with self._snapshot_guard:
            # The temporary file first: a save staged and not yet renamed holds
            # it (its rename takes no lock), and the file is in place once it
            # is gone.
            if self._snapshot_path(owner, _TEMP).exists() or self._snapshot_path(owner).exists():
                return False
            if not self.keystore.has_record_key(ring, SNAPSHOT_KEY_ID):
                return False
            self.writer.run(
                WriteOp(_noop, destroy_keys=[(ring, SNAPSHOT_KEY_ID)], name="keys.destroy_stray")
            )
        return True

    def read_snapshot(self, owner: str) -> tuple[int, bytearray] | None:
        """Open the owner's snapshot: ``(generation, plaintext)``, or None.

        None when there is none, and when it does not open: its key was
        destroyed (a forget it predates), it fails authentication, or it is
        malformed; such a file is removed (logged by owner, never content).
        """
        opened = self.read_snapshot_into(owner, _Plaintext)
        return None if opened is None else (opened[0], opened[1].data)

    def read_snapshot_into(
        self, owner: str, sink: Callable[[int], _SinkT]
    ) -> tuple[int, _SinkT] | None:
        """Open the owner's snapshot into ``sink(size)``, frame by frame: ``(generation, sink)``.

        Each authenticated frame's plaintext goes to the sink's ``write`` in
        order (``index.StateReader`` reads the state's arrays as they come, so
        the plaintext is never held whole beside them). None as
        :meth:`read_snapshot`; a sink's ``ValueError`` counts as a malformed
        snapshot. The caller uses the sink only when this returns it.
        """
        path = self._snapshot_path(owner)
        try:
            f = path.open("rb")
        except FileNotFoundError:
            return None
        try:
            with f:
                return self._open_snapshot(owner, f, sink)
        except KeyNotFoundError:
            _log.info("owners/%s: index snapshot predates a forget (its key is gone)", owner)
        except (IntegrityError, ValueError, OSError) as exc:
            _log.error("owners/%s: index snapshot does not open (%s)", owner, type(exc).__name__)
        path.unlink(missing_ok=True)
        return None

    def _open_snapshot(
        self, owner: str, f: BinaryIO, sink: Callable[[int], _SinkT]
    ) -> tuple[int, _SinkT]:
        read = f.read
        head = read(_HEADER.size)
        if len(head) != _HEADER.size:
            raise ValueError("snapshot header cut short")
        magic, fmt, generation, size, frame_bytes, frames = _HEADER.unpack(head)
        if magic != _MAGIC or fmt != SNAPSHOT_FORMAT:
            raise ValueError("not an index snapshot of this format")
        if not frame_bytes or frames != max(1, -(-size // frame_bytes)):
            raise ValueError("snapshot frame count disagrees with its size")
        ring = RingRef(owner, None)
        out = sink(size)
        at = 0
        for index in range(frames):
            raw = read(_LENGTH.size)
            if len(raw) != _LENGTH.size:
                raise ValueError("snapshot cut short")
            (length,) = _LENGTH.unpack(raw)
            sealed = read(length)
            if len(sealed) != length:
                raise ValueError("snapshot cut short")
            plain = self.keystore.open(
                ring, SNAPSHOT_KEY_ID, _ad(owner, generation, index, frames, size), sealed
            )
            if at + len(plain) > size:
                raise ValueError("snapshot frames exceed its size")
            out.write(plain)
            at += len(plain)
            del plain
        if at != size or read(1):
            raise ValueError("snapshot size disagrees with its frames")
        return int(generation), out

    def _row_digests(self, txn: lmdb.Transaction, owner: str) -> dict[int, int]:
        prefix = sk.owner_prefix(owner)
        out: dict[int, int] = {}
        for key in sk.scan_keys(txn, self.t.owner_records, prefix):
            rid_key = key[len(prefix) :]
            raw = sk.get(txn, self.t.turns, rid_key) or sk.get(txn, self.t.memories, rid_key)
            if raw is not None:
                out[sk.rid_of(rid_key)] = row_digest(raw)
        return out

    def row_digests(self, owner: str) -> dict[int, int]:
        """The digest (:func:`row_digest`) of every stored turn and memory row of ``owner``.

        One read transaction; no row is decoded.
        """
        with self.env.begin() as txn:
            return self._row_digests(txn, owner)

    def _scan_rows(self, txn: lmdb.Transaction, owner: str, sink: RowSink) -> None:
        prefix = sk.owner_prefix(owner)
        for key in sk.scan_keys(txn, self.t.owner_records, prefix):
            turn = self._turn(txn, sk.rid_of(key[len(prefix) :]))
            if turn is not None:
                sink.turn(cast(TurnMeta, self._as_read(txn, turn, sink.now)))
        for _, rid_key in sk.scan(txn, self.t.memory_ids, prefix):
            memory = self._memory(txn, sk.rid_of(rid_key))
            if memory is not None:
                sink.memory(cast(MemMeta, self._as_read(txn, memory, sink.now)))

    def scan_rows(self, owner: str, sink: RowSink) -> None:
        """Hand every stored turn, then memory, of ``owner`` to ``sink``, one at a time.

        Each as reads see it at ``sink.now`` (deleted rows included), from one
        read transaction; none is kept here, so an audit of a 100k-turn owner
        holds what its sink keeps, not 100k records' metadata.
        """
        with self.env.begin() as txn:
            self._scan_rows(txn, owner, sink)

    def snapshot_rows(self, owner: str, sink: RowSink) -> dict[int, int]:
        """:meth:`scan_rows` and the digest of every stored row, from one read transaction.

        Returns:
            Record number -> :func:`row_digest` of its stored row.
        """
        with self.env.begin() as txn:
            self._scan_rows(txn, owner, sink)
            return self._row_digests(txn, owner)

    def discard_snapshot(self, owner: str) -> bool:
        """Remove the owner's snapshot file and any temporary one; whether one was there.

        The directory is synced after a removal.
        """
        found = False
        for suffix in (_SUFFIX, _TEMP):
            path = self._snapshot_path(owner, suffix)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                found = True
        if found:
            fsync_dir(self.snapshot_dir)
        return found

    def _snapshot_files(self) -> list[tuple[str, Path, bool]]:
        """``(owner, path, temporary)`` of every file in the snapshot directory.

        Files that are no snapshot of ours are listed with owner "".
        """
        try:
            names = sorted(os.listdir(self.snapshot_dir))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            temp = name.endswith(_TEMP)
            owner = name.removesuffix(_TEMP if temp else _SUFFIX)
            known = (temp or name.endswith(_SUFFIX)) and _OWNER.fullmatch(owner) is not None
            out.append((owner if known else "", self.snapshot_dir / name, temp))
        return out

    def _snapshot_keys(self) -> set[str]:
        """Owners with a snapshot key in the keystore."""
        return {
            ring.owner
            for ring, key_id in self.keystore.list_record_keys()
            if key_id == SNAPSHOT_KEY_ID and ring.thread is None
        }

    def snapshot_strays(self, owner: str | None = None) -> int:
        """Stray snapshot files and keys (see the module docstring), of ``owner`` or all.

        A temporary file counts while a write is under way too: a hint, not a
        failure.
        """
        files = [f for f in self._snapshot_files() if owner is None or f[0] == owner]
        keys = self._snapshot_keys()
        if owner is not None:
            keys &= {owner}
        placed = {o for o, _, temp in files if o and not temp}
        strays = sum(1 for o, _, temp in files if temp or not o or o not in keys)
        return strays + len(keys - placed)

    def clean_snapshots(self) -> SnapshotCleanup:
        """Remove stray snapshot files and destroy stray snapshot keys (start-up only).

        A file is stray when it is temporary, not a snapshot name, its owner
        has no snapshot key, or its owner has no row in the store; a key is
        stray when its owner has no snapshot file in place. Nothing is being
        written then.
        """
        keys = self._snapshot_keys()
        with self.env.begin() as txn:
            held = {o for o in keys if self._owner_row(txn, o) is not None}
            files = self._snapshot_files()
            held |= {o for o, _, _ in files if o and self._owner_row(txn, o) is not None}
        removed = 0
        placed: set[str] = set()
        for owner, path, temp in files:
            if temp or not owner or owner not in keys or owner not in held:
                path.unlink(missing_ok=True)
                removed += 1
            else:
                placed.add(owner)
        stray = sorted(keys - placed)
        if stray:
            refs = [(RingRef(o, None), SNAPSHOT_KEY_ID) for o in stray]
            self.writer.run(WriteOp(_noop, destroy_keys=refs, name="keys.destroy_stray"))
        if removed:
            fsync_dir(self.snapshot_dir)
        return SnapshotCleanup(removed, len(stray))


def _frames(chunks: Iterable[bytes | bytearray | memoryview], frame_bytes: int) -> Iterable[bytes]:
    """The bytes of ``chunks`` cut into frames of ``frame_bytes`` (the last may be shorter).

    Yields at least one frame (an empty one when ``chunks`` is empty).
    """
    buf = bytearray()
    yielded = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while len(view):
            take = min(frame_bytes - len(buf), len(view))
            buf += view[:take]
            view = view[take:]
            if len(buf) == frame_bytes:
                yield bytes(buf)
                buf.clear()
                yielded += 1
    if buf or not yielded:
        yield bytes(buf)
