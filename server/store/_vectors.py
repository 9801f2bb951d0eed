"""Which embedder made an owner's vectors, and replacing them all at once.

The vectors of one owner must all come from one model: two models' vectors are
not comparable, even at the same dimension. The store records:

- in ``meta`` (:data:`~server.store._schema.EMBEDDER`), the embedder the server
  was started with last time (name and dimension; ``"none"``, 0 when clients
  send their vectors);
- in each owner's row, the embedder of its vectors; ``""`` means the recorded
  one. At a start with another embedder, :meth:`VectorsPart.record_embedder`
  stamps every owner still at ``""`` with the previous name, then records the
  new one — one transaction, so a crash leaves either the old record or the new
  one with every owner stamped. New owners are born ``""``: the new embedder.

A store written before embedders were recorded has no record: the embedder it is
first started with is taken to have made its vectors, except for owners whose
dimension differs from that embedder's, which are stamped ``"unknown"``.

The server re-embeds an owner whose embedder differs from its own on the
owner's first use (``server.retrieval._reembed``): it computes every vector outside any
transaction, then :meth:`VectorsPart.replace_vectors` swaps all of them and the
owner's row in ONE write transaction. Killed before that commit, nothing
changed (the next start re-embeds again); after it, everything did. No reader
ever sees vectors of two models in one owner.

Thread rules: reads from any thread; writes go through the writer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import lmdb
import numpy as np
import numpy.typing as npt

from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._records import PAYLOAD_EMBEDDING, MemMeta, OwnerRow, TurnMeta
from server.store._writer import WriteOp
from shredder import AssociatedData, KeyNotFoundError, RingRef

NO_EMBEDDER = "none"
"""The recorded name when clients send every vector (``--embedder none``)."""
UNKNOWN = "unknown"
"""An owner of a store recorded before embedders were whose dimension differs."""


@dataclass(frozen=True, slots=True)
class EmbedderChange:
    """What :meth:`VectorsPart.record_embedder` found at start.

    Attributes:
        previous: The recorded embedder's name ("" when none was recorded).
        previous_dim: Its dimension (0 for none).
        current: The embedder the server starts with.
        dim: Its dimension.
        owners: Owners stamped with the previous embedder (re-embedded on first
            use when the server has an embedder).
    """

    previous: str
    previous_dim: int
    current: str
    dim: int
    owners: int


@dataclass(frozen=True, slots=True)
class VectorSwap:
    """What :meth:`VectorsPart.replace_vectors` did.

    Attributes:
        replaced: Vectors written or removed (0 when ``stale``).
        stale: rids of memories whose version changed since they were embedded;
            when not empty, nothing was written.
    """

    replaced: int
    stale: list[int]


class VectorsPart(StoreBase):
    """Embedder records and the all-at-once replacement of an owner's vectors."""

    def recorded_embedder(self) -> tuple[str, int] | None:
        """The embedder recorded at the last start, ``(name, dim)``, or None."""
        with self.env.begin() as txn:
            raw = sk.get(txn, self.t.meta, sk.EMBEDDER)
        if raw is None:
            return None
        data = json.loads(raw)
        return str(data["name"]), int(data["dim"])

    def record_embedder(self, name: str, dim: int) -> EmbedderChange | None:
        """Record the embedder the server starts with (module docstring).

        Args:
            name: Its stable name (``Embedder.name``), or :data:`NO_EMBEDDER`.
            dim: Its dimension (0 for none).

        Returns:
            What changed, or None when the recorded embedder is this one (then
            nothing is written: a start with the same embedder writes nothing).

        Raises:
            StoreFull, Unavailable: the record could not be written.
        """
        if self.recorded_embedder() == (name, dim):
            return None

        def apply(txn: lmdb.Transaction) -> EmbedderChange | None:
            raw = sk.get(txn, self.t.meta, sk.EMBEDDER)
            previous = json.loads(raw) if raw is not None else None
            if previous is not None and (previous["name"], previous["dim"]) == (name, dim):
                return None
            stamped = 0
            with txn.cursor(db=self.t.owners) as cur:
                rows = [(bytes(k), OwnerRow.decode(bytes(v))) for k, v in cur]
            for key, row in rows:
                if row.embedder:
                    continue
                if previous is not None:
                    row.embedder = str(previous["name"])
                elif row.dim and name != NO_EMBEDDER and row.dim != dim:
                    row.embedder = UNKNOWN  # a store from before the record
                else:
                    continue
                txn.put(key, row.encode(), db=self.t.owners)
                stamped += 1
            record = json.dumps({"name": name, "dim": dim}).encode()
            txn.put(sk.EMBEDDER, record, db=self.t.meta)
            if previous is None:
                return EmbedderChange("", 0, name, dim, stamped)
            return EmbedderChange(str(previous["name"]), int(previous["dim"]), name, dim, stamped)

        return self.writer.run(WriteOp(apply, name="embedder.record"))

    def owner_embedder(self, owner: str) -> str:
        """The embedder whose vectors ``owner`` holds.

        The recorded one when its row says none, or when it has no row yet.
        """
        with self.env.begin() as txn:
            row = self._owner_row(txn, owner)
            if row is not None and row.embedder:
                return row.embedder
            raw = sk.get(txn, self.t.meta, sk.EMBEDDER)
        return str(json.loads(raw)["name"]) if raw is not None else ""

    def replace_vectors(
        self,
        owner: str,
        embedder: str,
        dim: int,
        turns: Mapping[int, npt.NDArray[np.float32] | None],
        memories: Mapping[int, tuple[int, npt.NDArray[np.float32] | None]],
    ) -> VectorSwap:
        """Swap ``owner``'s given vectors and its embedder in ONE write transaction, or nothing.

        Every given vector and the owner row's embedder change together (see
        the module docstring).

        Records forgotten meanwhile are skipped. A memory whose current version is
        no longer the one embedded (a transition or commit made a new version,
        carrying the old model's vector) makes the whole swap stale: nothing is
        written, and the caller embeds those memories again and retries. A None
        vector removes the record's vector (its text has no tokens, or it cannot
        be read); so does a record whose key is gone.

        Args:
            owner: The owner.
            embedder: The new embedder's name.
            dim: Its dimension (the owner's new fixed dimension; 0 keeps it).
            turns: rid -> ``(dim,) float32`` unit vector or None.
            memories: rid -> (the version embedded, ``(dim,) float32`` or None).

        Returns:
            The number of vectors written or removed, and the stale memories'
            rids (when any, nothing was written).

        Raises:
            StoreFull, Unavailable: as every write (nothing was applied).
        """

        def apply(txn: lmdb.Transaction) -> VectorSwap:
            current: list[MemMeta] = []
            stale: list[int] = []
            for rid, (version, _) in memories.items():
                mem = self._memory(txn, rid)
                if mem is None or mem.deleted or mem.owner != owner:
                    continue
                if mem.version != version:
                    stale.append(rid)
                current.append(mem)
            if stale:
                return VectorSwap(0, stale)
            done = 0
            for rid, vec in turns.items():
                turn = self._turn(txn, rid)
                if turn is None or turn.deleted or turn.owner != owner:
                    continue
                self._swap_turn(txn, turn, vec)
                done += 1
            for mem in current:
                self._swap_memory(txn, mem, memories[mem.rid][1])
                done += 1
            row = self._ensure_owner(txn, owner, 0.0)
            row.dim = dim if dim else row.dim
            row.embedder = embedder
            self._put_owner(txn, owner, row)
            return VectorSwap(done, [])

        return self.writer.run(WriteOp(apply, name="reembed"))

    def _swap_turn(
        self, txn: lmdb.Transaction, meta: TurnMeta, vec: npt.NDArray[np.float32] | None
    ) -> None:
        key = sk.payload_key(meta.rid, PAYLOAD_EMBEDDING)
        ct = None
        if vec is not None:
            ad = AssociatedData(meta.owner, meta.name, meta.version, PAYLOAD_EMBEDDING)
            ring = RingRef(meta.owner, meta.ring_thread)
            try:
                ct = self._seal(ring, meta.key_id, ad, vec.astype("<f4").tobytes())
            except KeyNotFoundError:  # its key is gone: nothing of it is readable
                ct = None
        if ct is None:
            txn.delete(key, db=self.t.payloads)
        else:
            txn.put(key, ct, db=self.t.payloads)
        if meta.has_embedding != (ct is not None):
            meta.has_embedding = ct is not None
            self._put_turn(txn, meta)

    def _swap_memory(
        self, txn: lmdb.Transaction, meta: MemMeta, vec: npt.NDArray[np.float32] | None
    ) -> None:
        key = sk.memory_payload_key(meta.rid, meta.version, PAYLOAD_EMBEDDING)
        ct = None
        if vec is not None:
            try:
                ct = self._seal_memory(
                    meta, meta.version, PAYLOAD_EMBEDDING, vec.astype("<f4").tobytes()
                )
            except KeyNotFoundError:
                ct = None
        if ct is None:
            txn.delete(key, db=self.t.mpayloads)
        else:
            txn.put(key, ct, db=self.t.mpayloads)
        if meta.has_embedding != (ct is not None):
            meta.has_embedding = ct is not None
            self._put_memory(txn, meta)
