"""Batches of memory writes: ``BatchUpdateMemories``, every write in one writer op, or none.

See API.md, ``Memories.BatchUpdateMemories``. Each write is an update, or
with ``allow_missing`` a create-or-update (AIP-134), as
:class:`server.store._memories.MemoriesPart` writes one; the choice is made
in the one data transaction that writes them all.

Thread rules: as every part of :class:`server.store.Store` (writes on the
writer thread through ``WriteOp``; reads from any thread).
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Sequence

import lmdb

from server.errors import Aborted, InvalidArgument, LetheError, NotFound
from server.store._echoes import Shingler
from server.store._memories import _UPSERT_TRIES, MemoriesPart, _guarded_text
from server.store._shapes import SLOTTED_KINDS
from server.store._views import MemoryView, MemoryWrite
from server.store._writer import WriteOp
from shredder import RingRef


class MemoryBatchPart(MemoriesPart):
    """``BatchUpdateMemories`` (see the module docstring)."""

    def batch_update_memories(
        self,
        owner: str,
        writes: Sequence[MemoryWrite],
        pending_ttl: float,
        *,
        shingler: Shingler | None = None,
    ) -> list[MemoryView]:
        """``BatchUpdateMemories``: every write of ``writes`` in one write op, or none.

        Each write is :meth:`update_memory`, or with ``allow_missing``
        :meth:`upsert_memory` (create when no memory holds the id). The
        choice between create and update is made in the one data transaction
        that writes them all; one record key per write is made in the group's
        keystore transaction, in the ring the memory lives in (an update) or
        its sources choose (a creation). When a memory changes hands between
        the read that chose a key's ring and that transaction (created,
        purged, moved to another ring), the batch is planned again, at most
        :data:`_UPSERT_TRIES` times. Every key is used by a committed batch;
        a refused batch's keys are destroyed by the writer.

        ``memory_id`` values must be distinct (the service checks).

        Returns:
            The written version of each write, in ``writes`` order.

        Raises:
            The first refusal, as :meth:`update_memory`, :meth:`upsert_memory`
            and :meth:`create_memory` raise it, naming the write: an
            ``InvalidArgument`` field ``requests[i].…``, other messages
            starting ``requests[i]:``. Nothing is written then.
        """
        for _ in range(_UPSERT_TRIES):
            try:
                return self._batch_once(owner, writes, pending_ttl, shingler)
            except _ChoiceChanged:
                continue
        raise Aborted(f"owners/{owner}: memories of the batch changed concurrently; retry")

    def _batch_once(
        self,
        owner: str,
        writes: Sequence[MemoryWrite],
        pending_ttl: float,
        shingler: Shingler | None,
    ) -> list[MemoryView]:
        """One attempt of :meth:`batch_update_memories`.

        Raises:
            _ChoiceChanged: a memory changed hands since its key's ring was chosen.
        """
        with self.env.begin() as txn:
            current = [self._mem_by_id(txn, owner, w.memory_id) for w in writes]
        rings = [
            (meta.ring_thread, True)
            if meta is not None
            else (self.ring_for_sources(owner, w.draft.sources) if w.draft.sources else "", False)
            for w, meta in zip(writes, current, strict=True)
        ]
        slotted = any(
            (w.draft.kind in SLOTTED_KINDS and w.draft.content.slot)
            or (meta is not None and meta.kind in SLOTTED_KINDS)
            for w, meta in zip(writes, current, strict=True)
        )
        if slotted:
            self.ensure_slot_key(owner)
        key_ids = [secrets.token_hex(8) for _ in writes]

        def apply(txn: lmdb.Transaction) -> list[MemoryView]:
            now = time.time()
            views = []
            for i, (w, key_id, (ring_thread, existed)) in enumerate(
                zip(writes, key_ids, rings, strict=True)
            ):
                try:
                    views.append(
                        self._batch_write(
                            txn, owner, w, key_id, ring_thread, existed, pending_ttl, shingler, now
                        )
                    )
                except _ChoiceChanged:
                    raise
                except LetheError as exc:
                    raise _in_request(exc, i) from None
            return views

        refs = [(RingRef(owner, r or None), k) for (r, _), k in zip(rings, key_ids, strict=True)]
        return self.writer.run(WriteOp(apply, owner=owner, create_keys=refs, name="memory.batch"))

    def _batch_write(
        self,
        txn: lmdb.Transaction,
        owner: str,
        w: MemoryWrite,
        key_id: str,
        ring_thread: str,
        existed: bool,
        pending_ttl: float,
        shingler: Shingler | None,
        now: float,
    ) -> MemoryView:
        """One write of a batch, in the batch's transaction (see :meth:`batch_update_memories`).

        Raises:
            _ChoiceChanged: the memory was created or purged since ``existed``
                was read (its key's ring may be the wrong one).
        """
        name = f"owners/{owner}/memories/{w.memory_id}"
        meta = self._mem_by_id(txn, owner, w.memory_id)
        if meta is None:
            if not w.allow_missing:
                self._raise_missing(txn, name)
            if w.expected_version:
                raise NotFound(f"{name} not found (expected_version {w.expected_version})")
            if existed:
                raise _ChoiceChanged(name)
            if self._echo_check(txn, owner, [_guarded_text(w.draft.content)], shingler)[0]:
                raise self._refuse_echo("memory.text")
            return self._insert_memory(
                txn,
                owner,
                w.memory_id,
                w.draft,
                key_id,
                ring_thread,
                commit=w.commit,
                pending_ttl=pending_ttl,
                now=now,
            )
        if w.allow_missing and meta.kind != w.draft.kind and not meta.deleted:
            raise InvalidArgument("memory.kind", f"is immutable: {name} is a {meta.kind}")
        if not existed:
            raise _ChoiceChanged(name)
        draft = w.draft
        if w.allow_missing and w.keep_embedding:
            draft = dataclasses.replace(draft, embedding=None)
        return self._update_in(
            txn,
            meta,
            name,
            draft,
            w.paths,
            w.expected_version,
            pending_ttl,
            key_id,
            ring_thread,
            keep_embedding=w.keep_embedding,
            shingler=shingler,
            now=now,
        )


class _ChoiceChanged(Aborted):
    """A memory of a batch changed hands under it: the batch is planned again."""


def _in_request(exc: LetheError, index: int) -> LetheError:
    """``exc`` naming request ``index`` of a batch (its field, or its message's start)."""
    if isinstance(exc, InvalidArgument):
        exc.field = f"requests[{index}].{exc.field}"
        exc.message = f"{exc.field}: {exc.description}"
    else:
        exc.message = f"requests[{index}]: {exc.message}"
    exc.args = (exc.message,)
    return exc
