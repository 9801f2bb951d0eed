"""Moving an owner between shards: export, import, activate, release, abort.

Owners are independent (no record, lineage edge or index crosses owners), so
moving one is a backup-and-restore of that owner alone (ARCHITECTURE.md,
"Scale beyond one machine"). The steps, each its own command (``lethe owner
…``, beside the running servers) and each safe to repeat after a crash:

1. **export** (source): the marker ``moving`` lands first, so from its commit
   on the source refuses the owner's writes inside their transaction (reads
   go on); outstanding deletions of the owner are awaited; then one read
   transaction of the data environment gives every row of the owner, and one
   of the keystore its keys. Both are sealed to the destination's receive key
   (:mod:`shredder._bundle`): ring keys leave the keystore only inside that
   box, record keys stay wrapped under them, ciphertext stays ciphertext.
2. **import** (destination): the marker ``arriving`` lands first (every call
   for the owner is refused while it stands); then the keys, wrapped under
   this shard's KEK, in one keystore transaction; then every row, with fresh
   record numbers (they are per store; associated data binds ciphertext to
   resource names, never to numbers), in one data transaction. A repeated
   import first removes what an interrupted one left.
3. The operator (or the test) points the proxy's map at the destination.
4. **activate** (destination): the marker becomes ``arrived``; calls are served.
5. **release** (source): the marker becomes ``moved`` (calls answer
   ``OWNER_MOVED``), then every ring of the owner is destroyed in one synced
   keystore transaction (crypto-shredding; rotation completes it for old
   backups and free pages, as for any forget), then every row of the owner
   is removed. A receipt counts what was destroyed.

Until release the source holds the owner and is the one that counts; the
destination's copy is refused to every call until activation. So a crash at
any step leaves the owner whole on exactly one serving shard, and repeating
the step (or :meth:`MovesPart.abort_move` before release) converges.
Tombstones, the deletion log, lineage edges and the shred log move with the
owner, so what was forgotten before the move stays forgotten after it.

Thread rules: as every part of :class:`server.store.Store`; these methods are
called from a CLI process beside the running server, one at a time.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import lmdb

from lethe.v1 import common_pb2
from server.errors import LetheError
from server.store import _json
from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._forget import DeletionEntry
from server.store._placement import MovedRow, PlacementPart
from server.store._records import MemMeta, OwnerRow, TurnMeta
from server.store._tokens import owner_tokens
from server.store._writer import WriteOp
from shredder import (
    EnvironmentConfigError,
    IntegrityError,
    ReceiveKey,
    declare,
    failpoint,
    open_bundle,
    seal_bundle,
)

FP_EXPORT_MARKED = declare(
    "move.export.after_marker", "an owner move: the source refuses the owner's writes; no copy"
)
FP_IMPORT_MARKED = declare(
    "move.import.after_marker", "an owner move: the destination's arriving marker, nothing else"
)
FP_IMPORT_KEYS = declare(
    "move.import.after_keys", "an owner move: the destination holds the owner's keys, not its rows"
)
FP_IMPORT_ROWS = declare(
    "move.import.after_rows", "an owner move: the destination holds the owner, not activated"
)
FP_RELEASE_MARKED = declare(
    "move.release.after_marker", "an owner move: the source answers OWNER_MOVED; keys not destroyed"
)
FP_RELEASE_KEYS = declare(
    "move.release.after_keys",
    "an owner move: the source destroyed the owner's keys, not its rows",
)

# Databases whose rows of an owner start with ``owner 0x00``.
_OWNER_PREFIXED = (
    "threads",
    "seqs",
    "owner_records",
    "titles",
    "deletions",
    "requests",
    "memory_ids",
    "events",
    "slots",
    "manifests",
    "echo_keys",
    "echo_guards",
    "echo_digests",
)
# Databases keyed by resource names (``owners/{owner}/…``).
_NAMED = ("tombstones", "lineage_down", "lineage_up")
# Databases keyed by record number.
_BY_RID = ("turns", "memories", "payloads", "mpayloads")
_WAIT_DELETIONS = 30.0


class MoveRefused(LetheError):
    """A move step does not apply to the owner's state on this shard; the message says why.

    Raised to the ``lethe owner`` commands, never to a client.
    """

    code = grpc.StatusCode.FAILED_PRECONDITION


@dataclass
class OwnerExport:
    """What :meth:`MovesPart.export_owner` made.

    Attributes:
        data: the owner's rows, sealed to the destination's receive key.
        keys: the owner's keys, sealed likewise.
        rows: rows per database.
        key_count: ring keys plus record keys.
        marker: the source's ``moving`` marker.
    """

    data: bytes
    keys: bytes
    rows: dict[str, int]
    key_count: int
    marker: MovedRow

    def encode(self) -> bytes:
        """One file: a JSON header line, then the two sealed parts."""
        header = {
            "format": "lethe-owner-export/1",
            "owner": self.marker.owner,
            "move_id": self.marker.move_id,
            "to": self.marker.shard,
            "target": self.marker.target,
            "rows": self.rows,
            "keys": self.key_count,
            "data_bytes": len(self.data),
            "keys_bytes": len(self.keys),
        }
        return json.dumps(header, sort_keys=True).encode() + b"\n" + self.data + self.keys

    @classmethod
    def decode(cls, raw: bytes) -> OwnerExport:
        """Read :meth:`encode`'s file.

        Raises:
            IntegrityError: not an owner export, or truncated.
        """
        line, _, rest = raw.partition(b"\n")
        try:
            header = json.loads(line)
            split, keys_bytes = int(header["data_bytes"]), int(header["keys_bytes"])
            if header["format"] != "lethe-owner-export/1" or len(rest) != split + keys_bytes:
                raise ValueError("not an export, or truncated")
            rows = {str(k): int(v) for k, v in header["rows"].items()}
            marker = MovedRow(
                str(header["owner"]),
                str(header["to"]),
                str(header["target"]),
                0.0,
                "moving",
                str(header["move_id"]),
            )
            keys = int(header["keys"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise IntegrityError("not a complete lethe owner export") from exc
        return cls(rest[:split], rest[split:], rows, keys, marker)


@dataclass
class MoveReceipt:
    """What a release destroyed (ids and counts only, never content).

    Attributes:
        owner, move_id, shard, target: the move and where the owner went.
        keys_destroyed: ring keys plus record keys deleted from the keystore.
        rows_removed: rows per database removed from the data environment.
        request_time, complete_time: seconds since the epoch.
    """

    owner: str
    move_id: str
    shard: str
    target: str
    keys_destroyed: int
    rows_removed: dict[str, int] = field(default_factory=dict)
    request_time: float = 0.0
    complete_time: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "move_id": self.move_id,
            "shard": self.shard,
            "target": self.target,
            "keys_destroyed": self.keys_destroyed,
            "rows_removed": self.rows_removed,
            "request_time": self.request_time,
            "complete_time": self.complete_time,
        }

    def as_receipt(self) -> common_pb2.DeletionReceipt:
        """The release as a :class:`~lethe.v1.common_pb2.DeletionReceipt`, for signing.

        Named ``owners/{o}/deletions/move-{move_id}``, target the owner, reason
        ``OWNER_MOVED``, the keystore and the data environment done at
        ``complete_time``. It counts no records (rows are counted by database in
        the release's own document) and names no shred horizon: the source's
        next rotation (or ``lethe rotate``) completes the shred, whenever that
        server runs it.
        """
        receipt = common_pb2.DeletionReceipt(
            name=f"owners/{self.owner}/deletions/move-{self.move_id}",
            targets=[f"owners/{self.owner}"],
            reason="OWNER_MOVED",
        )
        receipt.request_time.FromNanoseconds(round(self.request_time * 1e9))
        receipt.complete_time.FromNanoseconds(round(self.complete_time * 1e9))
        for name in ("lmdb", "keystore"):
            done = receipt.destinations.add(name=name, done=True)
            done.complete_time.CopyFrom(receipt.complete_time)
        return receipt


class MovesPart(PlacementPart, StoreBase):
    """Owner moves of :class:`server.store.Store` (see the module docstring)."""

    # ------------------------------------------------------------------ rows

    def _owner_rows(self, txn: lmdb.Transaction, owner: str) -> Iterator[tuple[str, bytes, bytes]]:
        """``(database, key, value)`` of every row of ``owner`` except its marker.

        The one place that knows where an owner's rows are.
        """
        prefix = sk.owner_prefix(owner)
        row = sk.get(txn, self.t.owners, sk.owner_key(owner))
        if row is not None:
            yield "owners", sk.owner_key(owner), row
        rids: list[bytes] = []
        for name in _OWNER_PREFIXED:
            for key, value in sk.scan(txn, getattr(self.t, name), prefix):
                if name == "owner_records":
                    rids.append(key[len(prefix) :])
                yield name, key, value
        named = f"owners/{owner}/".encode()
        for name in _NAMED:
            for key, value in sk.scan(txn, getattr(self.t, name), named):
                yield name, key, value
        for rid in rids:
            for name in _BY_RID:
                for key, value in sk.scan(txn, getattr(self.t, name), rid):
                    if name in ("turns", "memories") and key != rid:
                        continue
                    yield name, key, value
        mine = set(rids)
        for queue in ("expiry", "retention"):  # time-first keys: the whole queue is read
            for key, value in sk.scan(txn, getattr(self.t, queue), b""):
                if key[8:16] in mine:
                    yield queue, key, value
        for key, value in sk.scan(txn, self.t.thread_expiry, b""):
            if key[8:].startswith(prefix):
                yield "thread_expiry", key, value
        for key, value in sk.scan(txn, self.t.tokens, b""):
            principal = _json.loads(value)
            if list(principal.get("owners", [])) == [owner] and not principal.get("admin"):
                yield "tokens", key, value

    def owner_row_counts(self, owner: str) -> dict[str, int]:
        """Rows of ``owner`` per database (its marker excluded)."""
        counts: dict[str, int] = {}
        with self.env.begin() as txn:
            for name, _, _ in self._owner_rows(txn, owner):
                counts[name] = counts.get(name, 0) + 1
        return counts

    # ---------------------------------------------------------------- export

    def export_owner(
        self, owner: str, shard: str, target: str, recipient_hex: str, move_id: str = ""
    ) -> OwnerExport:
        """Step 1: refuse the owner's writes here, then copy it, sealed.

        Args:
            owner: the owner's id.
            shard: the destination's name.
            target: the destination's ``HOST:PORT``.
            recipient_hex: the destination's receive key (public half).
            move_id: continue this move (a repeated export after a crash);
                "" starts one.

        Raises:
            MoveRefused: the owner is not held here, is marked for another
                move (or moving to another shard than ``shard``), or still has
                deletions in progress after 30 s.
            ValueError: ``recipient_hex`` is malformed.

        A refused export removes the marker it wrote (the owner's writes go on).
        """
        marker = self.moved(owner)
        if marker is not None and marker.state == "arrived":
            marker = None  # it came here by an earlier move and is served here
        if marker is not None and not (
            marker.state == "moving" and move_id in ("", marker.move_id)
        ):
            raise MoveRefused(f"owners/{owner} is {marker.state} here (move {marker.move_id})")
        started = marker is None
        if marker is None:
            with self.env.begin() as txn:
                if sk.get(txn, self.t.owners, sk.owner_key(owner)) is None:
                    raise MoveRefused(f"this shard holds no owner {owner!r}")
            marker = self.mark_moved(
                owner, shard, target, state="moving", move_id=move_id or uuid.uuid4().hex[:16]
            )
        elif shard != marker.shard:
            raise MoveRefused(
                f"owners/{owner} is moving to {marker.shard} (move {marker.move_id}), not "
                f"{shard}: `lethe owner abort` it first"
            )
        try:
            return self._export_marked(owner, marker, recipient_hex)
        except Exception:
            # A refused export (a malformed recipient, a KEK that does not open
            # the owner's rings, deletions still running) must not leave the
            # owner's writes refused: the marker this call wrote goes.
            if started:
                self.clear_moved(owner)
            raise

    def _export_marked(self, owner: str, marker: MovedRow, recipient_hex: str) -> OwnerExport:
        """:meth:`export_owner` once the owner's ``moving`` marker stands."""
        failpoint(FP_EXPORT_MARKED)
        deadline = time.monotonic() + _WAIT_DELETIONS
        while self._deleting(owner):
            if time.monotonic() > deadline:
                raise MoveRefused(f"owners/{owner} has deletions in progress; retry the export")
            time.sleep(0.1)
        rows: dict[str, int] = {}
        entries: list[tuple[bytes, bytes, bytes]] = []
        with self.env.begin() as txn:
            for name, key, value in self._owner_rows(txn, owner):
                rows[name] = rows.get(name, 0) + 1
                entries.append((name.encode(), key, value))
            embedder = sk.get(txn, self.t.meta, sk.EMBEDDER)
        header = {
            "owner": owner,
            "move_id": marker.move_id,
            "rows": rows,
            "embedder": json.loads(embedder)["name"] if embedder else "",
        }
        entries.insert(0, (b"manifest", b"", json.dumps(header).encode()))
        data = seal_bundle(entries, recipient_hex)
        keys, key_count = self.keystore.export_owner(owner, recipient_hex)
        return OwnerExport(data, keys, rows, key_count, marker)

    def _deleting(self, owner: str) -> bool:
        """Whether a forget of ``owner`` has a destination not yet done."""
        with self.env.begin() as txn:
            return any(
                not DeletionEntry.decode(raw).complete_time
                for _, raw in sk.scan(txn, self.t.deletions, sk.owner_prefix(owner))
            )

    # ---------------------------------------------------------------- import

    def import_owner(self, export: OwnerExport, receive_key: ReceiveKey, source: str) -> MovedRow:
        """Step 2: hold the owner here, refused to calls until :meth:`activate_move`.

        Args:
            export: the source's export (sealed to ``receive_key``).
            receive_key: this shard's receive key.
            source: the source shard's name (recorded in the marker).

        Returns:
            The ``arriving`` marker.

        Raises:
            MoveRefused: the owner lives here (or is moving away from here); an
                owner that moved away from here before may come back.
            IntegrityError: the export is not for this receive key, was changed,
                or holds rows of another owner; nothing was written.
        """
        owner, move_id = export.marker.owner, export.marker.move_id
        entries = list(open_bundle(export.data, receive_key))
        if not entries or entries[0][0] != b"manifest":
            raise IntegrityError("the export has no manifest")
        header = json.loads(entries[0][2])
        if header["owner"] != owner or header["move_id"] != move_id:
            raise IntegrityError("the export's sealed manifest does not match its header")
        # Everything that can refuse the import is checked before its marker,
        # which would otherwise refuse the owner's calls here for nothing.
        list(open_bundle(export.keys, receive_key))
        if not self.keystore.kek_opens_rings():
            raise EnvironmentConfigError(
                "the KEK given does not open this store's keys (another store's "
                "--kek-file or LETHE_KEK?); nothing was imported"
            )
        marker = self.moved(owner)
        if marker is not None and marker.state in ("moving", "arrived"):
            raise MoveRefused(f"owners/{owner} is {marker.state} here (move {marker.move_id})")
        if marker is not None and marker.state == "arriving":
            self._remove_copy(owner)  # what an interrupted import left
        elif self.holds_owner(owner):
            raise MoveRefused(f"this shard already holds owner {owner!r}")
        marker = self.mark_moved(owner, source, "", state="arriving", move_id=move_id)
        failpoint(FP_IMPORT_MARKED)
        self.keystore.import_owner(owner, export.keys, receive_key)
        failpoint(FP_IMPORT_KEYS)
        rows = entries[1:]
        embedder = str(header.get("embedder", ""))

        def apply(txn: lmdb.Transaction) -> dict[str, int]:
            return self._put_rows(txn, owner, rows, embedder)

        # The owner's tokens enter the ledger (the authority every read uses) with
        # the rows; a token the operator stored here already stays as it is.
        ledger = [
            (key, value)
            for name, key, value in rows
            if name == b"tokens" and self.keystore.ledger_entry(key) is None
        ]
        written = self.writer.run(WriteOp(apply, ledger=ledger, name="owner.import"))
        if written != {str(k): int(v) for k, v in header["rows"].items()}:
            raise IntegrityError(f"the import wrote {written}, the export holds {header['rows']}")
        failpoint(FP_IMPORT_ROWS)
        return marker

    def _put_rows(
        self,
        txn: lmdb.Transaction,
        owner: str,
        rows: list[tuple[bytes, bytes, bytes]],
        embedder: str,
    ) -> dict[str, int]:
        """Write exported rows with fresh record numbers; returns rows per database."""
        self._note_reset(owner)
        prefix = sk.owner_prefix(owner)
        named = f"owners/{owner}/".encode()
        old = sorted(key[len(prefix) :] for name, key, _ in rows if name == b"owner_records")
        first = self._next_rids(txn, len(old)) if old else 0
        new = {rid: sk.rid_key(first + i) for i, rid in enumerate(old)}

        def renumber(rid: bytes) -> bytes:
            # A number the owner's rows name but no longer hold (a purged turn
            # an idempotency entry still lists) gets a fresh one here, which
            # names nothing either.
            if rid not in new:
                new[rid] = sk.rid_key(self._next_rids(txn, 1))
            return new[rid]

        counts: dict[str, int] = {}
        last_event = 0
        for raw_name, key, value in rows:
            name = raw_name.decode()
            if name in _OWNER_PREFIXED or name == "owners":
                if not (key.startswith(prefix) or (name == "owners" and key == owner.encode())):
                    raise IntegrityError("the export holds a row of another owner")
            elif name in _NAMED and not key.startswith(named):
                raise IntegrityError("the export holds a row of another owner")
            if name == "owners":
                row = OwnerRow.decode(value)
                row.embedder = row.embedder or embedder
                value = row.encode()
            elif name == "owner_records":
                key = prefix + renumber(key[len(prefix) :])
            elif name in ("seqs", "memory_ids", "slots"):
                value = renumber(value)
            elif name == "requests":
                old_rids = _json.loads(value)
                value = _json.dumps([sk.rid_of(renumber(sk.rid_key(r))) for r in old_rids])
            elif name == "events":
                last_event = max(last_event, int.from_bytes(key[-8:], "big"))
            elif name in ("expiry", "retention"):
                key = key[:8] + renumber(key[8:16])
            elif name == "thread_expiry":
                if not key[8:].startswith(prefix):
                    raise IntegrityError("the export holds a row of another owner")
            elif name == "turns":
                turn = TurnMeta.decode(value)
                turn.rid = sk.rid_of(renumber(key))
                key, value = sk.rid_key(turn.rid), turn.encode()
            elif name == "memories":
                memory = MemMeta.decode(value)
                memory.rid = sk.rid_of(renumber(key))
                key, value = sk.rid_key(memory.rid), memory.encode()
            elif name in ("payloads", "mpayloads"):
                key = renumber(key[:8]) + key[8:]
            elif name == "tokens":
                if sk.get(txn, self.t.tokens, key) is not None:
                    # The same token is already stored here (the operator's
                    # token-import, or an interrupted import): it arrived.
                    counts[name] = counts.get(name, 0) + 1
                    continue
            elif name not in _NAMED and name not in _OWNER_PREFIXED:
                raise IntegrityError(f"the export holds rows of database {name!r}")
            txn.put(key, value, db=getattr(self.t, name))
            counts[name] = counts.get(name, 0) + 1
        if last_event:
            current = int(sk.get(txn, self.t.meta, sk.NEXT_EVENT) or b"1")
            txn.put(sk.NEXT_EVENT, str(max(current, last_event + 1)).encode(), db=self.t.meta)
        return counts

    # ------------------------------------------------------- activate, release

    def activate_move(self, owner: str) -> MovedRow:
        """Step 4: serve the owner here (the marker becomes ``arrived``).

        Raises:
            MoveRefused: no complete import of the owner is waiting here.
        """
        marker = self.moved(owner)
        if marker is not None and marker.state == "arrived":
            return marker
        if marker is None or marker.state != "arriving" or not self.holds_owner(owner):
            raise MoveRefused(f"no complete import of owners/{owner} waits here")
        return self.mark_moved(owner, marker.shard, "", state="arrived", move_id=marker.move_id)

    def release_owner(self, owner: str, shard: str, target: str) -> MoveReceipt:
        """Step 5: answer ``OWNER_MOVED`` here, crypto-shred the owner's keys, remove its rows.

        Args:
            owner: the owner's id.
            shard: the name of the shard it went to (for the marker and the
                receipt).
            target: that shard's ``HOST:PORT`` (for the marker and the receipt).

        Raises:
            MoveRefused: the owner is not moving from here (nor released already).
        """
        request_time = time.time()
        marker = self.moved(owner)
        if marker is None or marker.state not in ("moving", "moved"):
            raise MoveRefused(f"owners/{owner} is not moving from this shard")
        if marker.state == "moving":
            marker = self.mark_moved(owner, shard, target, state="moved", move_id=marker.move_id)
        failpoint(FP_RELEASE_MARKED)
        try:
            destroyed = self.keystore.destroy(owners=[owner])
        except (lmdb.Error, OSError):
            if not self.disk_reserve.release():  # a full disk: a release frees space
                raise
            destroyed = self.keystore.destroy(owners=[owner])
        failpoint(FP_RELEASE_KEYS)
        # Its tokens leave the ledger with its rows: they act for it alone.
        gone: list[tuple[bytes, bytes | None]] = [
            (digest, None) for digest in owner_tokens(self.keystore.ledger(), owner)
        ]
        removed = self.writer.run(
            WriteOp(
                lambda txn: self._delete_rows(txn, owner, tokens=True),
                ledger=gone,
                name="owner.purge",
            )
        )
        return MoveReceipt(
            owner,
            marker.move_id,
            marker.shard,
            marker.target,
            destroyed,
            removed,
            request_time,
            time.time(),
        )

    def abort_move(self, owner: str) -> str:
        """Undo a move before its release; returns what was done.

        The source serves writes again, or the destination drops its copy.

        Raises:
            MoveRefused: the owner is not mid-move here (``moved`` and
                ``arrived`` are final: move it back instead).
        """
        marker = self.moved(owner)
        if marker is None or marker.state not in ("moving", "arriving"):
            state = "not moving" if marker is None else marker.state
            raise MoveRefused(f"owners/{owner} is {state} here: nothing to abort")
        if marker.state == "arriving":
            self._remove_copy(owner)
            self.clear_moved(owner)
            return f"owners/{owner}: the copy arriving here is removed"
        self.clear_moved(owner)
        return f"owners/{owner}: served here again, its writes too"

    def _remove_copy(self, owner: str) -> None:
        """Destroy an interrupted import's keys and rows; the marker stays.

        The keys go unlogged: no record used them here.
        """
        self.keystore.destroy(owners=[owner], logged=False)
        self.writer.run(
            WriteOp(lambda txn: self._delete_rows(txn, owner, tokens=False), name="owner.purge")
        )

    def _delete_rows(self, txn: lmdb.Transaction, owner: str, *, tokens: bool) -> dict[str, int]:
        """Delete every row of ``owner`` but its marker; returns rows per database.

        Its tokens go too unless ``tokens`` is False: an interrupted import
        keeps the ones the operator stored.
        """
        self._note_reset(owner)
        doomed = [(name, key) for name, key, _ in self._owner_rows(txn, owner)]
        counts: dict[str, int] = {}
        for name, key in doomed:
            if name == "tokens" and not tokens:
                continue
            txn.delete(key, db=getattr(self.t, name))
            counts[name] = counts.get(name, 0) + 1
        return counts
