"""Where an owner lives when it is not here: the moved-away markers of a shard.

Lethe scales out by owner (ARCHITECTURE.md, "Scale beyond one machine"):
several servers, each with its own data directory, behind a proxy that routes
on the ``x-lethe-owner`` header. When an owner leaves this shard, the move
writes a :class:`MovedRow` under the owner's id in the ``moved`` database at
cut-over; from then on the server answers every call for that owner
``FAILED_PRECONDITION`` / ``OWNER_MOVED`` naming the destination (the check is
:mod:`server.edge._routing`'s, at authorisation), so a stale route gets an answer
that says where to go, never an empty success. Writes are also refused inside
their transaction (:meth:`PlacementPart.refuse_moved`, the writer's guard),
so a write authorised just before the marker landed cannot commit after it.
Clearing the marker (the owner moved back) makes the owner served here again.

A row holds ids and an address only, never content. Its ``state`` is the
journal of an owner move (:mod:`server.store._moves`, ``lethe owner …``):

============  ==========  =====================================================
state         on          calls for the owner
============  ==========  =====================================================
``moving``    the source  reads served; writes refused (``OWNER_MOVING``)
``arriving``  the dest.   every call refused (``OWNER_MOVING``): not yet live
``arrived``   the dest.   served (the row only records the move it came by)
``moved``     the source  every call refused (``OWNER_MOVED``, naming where)
============  ==========  =====================================================

Thread rules: as every part of :class:`server.store.Store`; writes go through
the writer, reads open their own read transaction (one per lookup: the marker
written by another process, ``lethe shard mark-moved``, is seen by the next
call).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import lmdb

from server.errors import OwnerMoved, OwnerMoving
from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._writer import WriteOp

MOVE_STATES = ("moving", "arriving", "arrived", "moved")


@dataclass(frozen=True, slots=True)
class MovedRow:
    """An owner that moved away from this shard.

    Attributes:
        owner: the owner's id.
        shard: the destination shard's name (as in ``lethe shard nginx-config --shards``).
        target: the destination's ``HOST:PORT``, or "" when not recorded.
        move_time: seconds since the epoch when the marker was written.
        state: ``moved`` (the default), or a step of a move in progress:
            ``moving``, ``arriving``, ``arrived`` (see the module docstring).
            For ``arriving`` and ``arrived`` ``shard`` names the source.
        move_id: the move that wrote it ("" for a marker written by hand).
    """

    owner: str
    shard: str
    target: str
    move_time: float
    state: str = "moved"
    move_id: str = ""

    def encode(self) -> bytes:
        """The row as stored (JSON, without the owner: it is the key)."""
        record = asdict(self)
        del record["owner"]
        return json.dumps(record, sort_keys=True).encode()

    @classmethod
    def decode(cls, owner: str, raw: bytes) -> MovedRow:
        """The row stored under ``owner``."""
        record = json.loads(raw)
        return cls(
            owner,
            str(record["shard"]),
            str(record["target"]),
            float(record["move_time"]),
            str(record.get("state", "moved")),
            str(record.get("move_id", "")),
        )

    def refusal(self, *, write: bool) -> OwnerMoved | OwnerMoving | None:
        """The error a call for the owner gets here in this state, or None when it is served.

        Args:
            write: the call writes (the source refuses only writes while moving).
        """
        if self.state == "moved":
            return OwnerMoved(self.owner, self.shard, self.target)
        if self.state == "arriving" or (self.state == "moving" and write):
            return OwnerMoving(self.owner, self.shard, writes_only=self.state == "moving")
        return None


class PlacementPart(StoreBase):
    """Moved-away markers of :class:`server.store.Store`."""

    def mark_moved(
        self, owner: str, shard: str, target: str = "", *, state: str = "moved", move_id: str = ""
    ) -> MovedRow:
        """Record that ``owner`` now lives on ``shard`` (replacing an older marker).

        Args:
            owner: the owner's id (validated by the caller).
            shard: the destination shard's name (the source's, for the
                destination's ``arriving`` / ``arrived`` rows).
            target: the destination's ``HOST:PORT`` ("" if not known).
            state: see :class:`MovedRow`.
            move_id: the move writing it.

        Returns:
            The stored row.

        Raises:
            ValueError: ``state`` is not one of :data:`MOVE_STATES`.
        """
        if state not in MOVE_STATES:
            raise ValueError(f"a marker's state is one of {', '.join(MOVE_STATES)}")
        row = MovedRow(owner, shard, target, time.time(), state, move_id)

        def apply(txn: lmdb.Transaction) -> MovedRow:
            txn.put(sk.owner_key(owner), row.encode(), db=self.t.moved)
            return row

        return self.writer.run(WriteOp(apply, essential=True))  # a marker: room at the ceiling

    def clear_moved(self, owner: str) -> bool:
        """Remove ``owner``'s marker (it is served here again); returns whether there was one."""

        def apply(txn: lmdb.Transaction) -> bool:
            return bool(txn.delete(sk.owner_key(owner), db=self.t.moved))

        return self.writer.run(WriteOp(apply, essential=True))  # a marker: room at the ceiling

    def moved(self, owner: str) -> MovedRow | None:
        """``owner``'s marker, or None when the owner is served here (one read transaction)."""
        with self.env.begin() as txn:
            raw = sk.get(txn, self.t.moved, sk.owner_key(owner))
        return None if raw is None else MovedRow.decode(owner, raw)

    def placement(self, owner: str) -> tuple[MovedRow | None, bool]:
        """``(owner's marker or None, whether this store has a row of it)``, one read transaction.

        What routing checks on every authorised call.
        """
        with self.env.begin() as txn:
            raw = sk.get(txn, self.t.moved, sk.owner_key(owner))
            held = sk.get(txn, self.t.owners, sk.owner_key(owner)) is not None
        return (None if raw is None else MovedRow.decode(owner, raw)), held

    def holds_owner(self, owner: str) -> bool:
        """Whether this store has a row of ``owner`` (written here, or imported by a move)."""
        with self.env.begin() as txn:
            return sk.get(txn, self.t.owners, sk.owner_key(owner)) is not None

    def refuse_moved(self, txn: lmdb.Transaction, owner: str) -> None:
        """The writer's guard: refuse a client's write for an owner marked moved away.

        Called inside a write transaction.

        Raises:
            OwnerMoved: ``owner`` is marked moved away (read in ``txn``).
            OwnerMoving: ``owner`` is being moved (here or to here).
        """
        raw = sk.get(txn, self.t.moved, sk.owner_key(owner))
        if raw is not None:
            refusal = MovedRow.decode(owner, raw).refusal(write=True)
            if refusal is not None:
                raise refusal

    def moved_owners(self) -> list[MovedRow]:
        """Every marker, by owner id."""
        with self.env.begin() as txn:
            return [
                MovedRow.decode(key.decode(), raw) for key, raw in sk.scan(txn, self.t.moved, b"")
            ]
