"""Memories: typed entries and derivatives, their versions, lineage and conditional publication.

See API.md, ``Memories``, and ARCHITECTURE.md, "Lineage and deletion".

A memory's content (text, slot, scope, graph edge) is one JSON payload per
version, sealed under that version's record key; its vector is a second
payload. Metadata (:class:`server.store.MemMeta`) holds ids, states,
versions, times and lineage names only.

Conditional publication: creating or updating a derivative re-reads every
source in the same write transaction that publishes it, and refuses with
``FAILED_PRECONDITION`` and ``SOURCE_DELETED`` (deleted, expired or tainted),
``SOURCE_STALE`` (no longer at the referenced version) or ``SOURCE_SEALED``,
naming the source. So a summariser that read a source before it was deleted
can never publish after the deletion.

Inherited state: a derivative of a pending source is pending; committing it
needs its pending sources committed first, or ``include_sources``.

Thread rules: as every part of :class:`server.store.Store` (writes on the
writer thread through ``WriteOp``; reads from any thread).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator, Sequence

import lmdb
import numpy as np
import numpy.typing as npt

from lethe.names import InvalidName, MemoryName, TurnName, parse_record
from server.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Reason,
    RecordDeleted,
)
from server.store import _schema as sk
from server.store._base import lineage_expiry_of
from server.store._echoes import EchoPart, Shingler
from server.store._lineage import add_edges, ancestors_of, children_of, remove_edges_of
from server.store._records import (
    COMMITTED,
    PAYLOAD_EMBEDDING,
    PAYLOAD_MEMORY,
    PENDING,
    SEALED,
    MemMeta,
    RecordMeta,
    stack_vectors,
)
from server.store._shapes import (
    CORRECTED_KINDS,
    KIND_DEFAULTS,
    SLOT_KEY_ID,
    SLOTTED_KINDS,
    SlotConflict,
    scope_chain,
    transition_allowed,
)
from server.store._views import MemoryContent, MemoryDraft, MemoryView
from server.store._visibility import effective_state, source_alive
from server.store._writer import WriteOp
from shredder import RingRef

_UPSERT_TRIES = 4
"""How often :meth:`MemoriesPart.upsert_memory` chooses again when the id changes hands."""


def _earliest(own: float, sources: float) -> float:
    """A pending derivative's expiry: its own, or its first pending source's if sooner."""
    return min(own, sources) if sources else own


def _noop_apply(txn: lmdb.Transaction) -> None:
    del txn


def _record_name(name: str) -> TurnName | MemoryName | None:
    try:
        return parse_record(name)
    except InvalidName:
        return None


class MemoriesPart(EchoPart):
    """Memory operations of :class:`server.store.Store` (see the module docstring)."""

    _slot_key_guard = threading.Lock()

    def check_source(
        self, txn: lmdb.Transaction, name: str, version: int, now: float
    ) -> RecordMeta:
        """Conditional publication of one source (see the module docstring).

        Raises:
            FailedPrecondition: ``SOURCE_DELETED``, ``SOURCE_SEALED`` or ``SOURCE_STALE``.
            InvalidArgument: the source never existed.
        """
        found = self.resolve(txn, name)
        meta = None if found is None else self._as_read(txn, found, now)
        if meta is None:
            if self._tombstone_of(txn, name) is not None:
                raise FailedPrecondition(
                    f"source {name} was deleted", reason=Reason.SOURCE_DELETED, subject=name
                )
            raise InvalidArgument("sources", f"{name} does not exist")
        if not source_alive(meta, now):
            raise FailedPrecondition(
                f"source {name} was deleted", reason=Reason.SOURCE_DELETED, subject=name
            )
        if meta.state == SEALED:
            raise FailedPrecondition(
                f"source {name} is sealed", reason=Reason.SOURCE_SEALED, subject=name
            )
        if version != meta.version:
            raise FailedPrecondition(
                f"source {name} is at version {meta.version}, not {version}",
                reason=Reason.SOURCE_STALE,
                subject=name,
            )
        return meta

    def ring_for_sources(self, owner: str, sources: Sequence[tuple[str, int]]) -> str:
        """The thread whose ring a derivative's keys go in, or "" for the owner ring."""
        threads: set[str] = set()
        with self.env.begin() as txn:
            for name, _ in sources:
                parsed = _record_name(name)
                if parsed is None:
                    return ""
                if isinstance(parsed, TurnName):
                    threads.add(parsed.thread)
                else:
                    meta = self._mem_by_id(txn, owner, parsed.memory)
                    threads.add(meta.ring_thread if meta is not None else "")
        return threads.pop() if len(threads) == 1 else ""

    # ------------------------------------------------------------------ writes

    def _write_version(self, txn: lmdb.Transaction, meta: MemMeta, draft: MemoryDraft) -> None:
        txn.put(
            sk.memory_payload_key(meta.rid, meta.version, PAYLOAD_MEMORY),
            self._seal_memory(meta, meta.version, PAYLOAD_MEMORY, draft.content.encode()),
            db=self.t.mpayloads,
        )
        if draft.embedding is not None:
            txn.put(
                sk.memory_payload_key(meta.rid, meta.version, PAYLOAD_EMBEDDING),
                self._seal_memory(
                    meta, meta.version, PAYLOAD_EMBEDDING, draft.embedding.astype("<f4").tobytes()
                ),
                db=self.t.mpayloads,
            )
        meta.has_embedding = draft.embedding is not None

    def _sources_state(
        self,
        txn: lmdb.Transaction,
        owner: str,
        sources: Sequence[tuple[str, int]],
        now: float,
    ) -> str:
        """Check every source; COMMITTED only when all of them are."""
        return self._sources_window(txn, owner, sources, now)[0]

    def _sources_window(
        self,
        txn: lmdb.Transaction,
        owner: str,
        sources: Sequence[tuple[str, int]],
        now: float,
    ) -> tuple[str, float]:
        """(COMMITTED or PENDING, earliest expire_time of a pending source or 0).

        A derivative never outlives a pending source.
        """
        state, earliest = COMMITTED, 0.0
        for name, version in sources:
            parsed = _record_name(name)
            if parsed is None or parsed.owner != owner:
                raise InvalidArgument("sources", f"{name} is not a record of owners/{owner}")
            meta = self.check_source(txn, name, version, now)
            if meta.state == PENDING:
                state = PENDING
                if meta.expire_time and (not earliest or meta.expire_time < earliest):
                    earliest = meta.expire_time
        return state, earliest

    def _sources_lineage(self, txn: lmdb.Transaction, sources: Sequence[tuple[str, int]]) -> float:
        """The ``lineage_expiry`` of a derivative of ``sources``.

        See :func:`~server.store._base.lineage_expiry_of`.
        """
        found = [m for m in (self.resolve(txn, name) for name, _ in sources) if m is not None]
        return lineage_expiry_of(found)

    def create_memory(
        self,
        owner: str,
        memory_id: str,
        draft: MemoryDraft,
        *,
        commit: bool,
        pending_ttl: float,
        shingler: Shingler | None = None,
    ) -> MemoryView:
        """Publish a memory with its lineage, in one transaction.

        ``shingler``: a text's word shingles, for the owner's echo guards
        (:mod:`server.store._echoes`); None: no check.

        Raises:
            AlreadyExists: the id is taken (also by a deleted memory not yet purged),
                or ``SLOT_CONFLICT``.
            FailedPrecondition: a source is deleted, stale or sealed;
                ``ECHOES_FORGOTTEN``: the text echoes a text forgotten within
                an echo guard's window.
            InvalidArgument: a source never existed or belongs to another owner.
        """
        ring_thread = self.ring_for_sources(owner, draft.sources) if draft.sources else ""
        key_id = secrets.token_hex(8)
        if draft.kind in SLOTTED_KINDS and draft.content.slot:
            self.ensure_slot_key(owner)

        def apply(txn: lmdb.Transaction) -> MemoryView:
            if self._echo_check(txn, owner, [_guarded_text(draft.content)], shingler)[0]:
                raise self._refuse_echo("memory.text")
            return self._insert_memory(
                txn,
                owner,
                memory_id,
                draft,
                key_id,
                ring_thread,
                commit=commit,
                pending_ttl=pending_ttl,
                now=time.time(),
            )

        ring = RingRef(owner, ring_thread or None)
        return self.writer.run(
            WriteOp(apply, owner=owner, create_keys=[(ring, key_id)], name="memory.create")
        )

    def _insert_memory(
        self,
        txn: lmdb.Transaction,
        owner: str,
        memory_id: str,
        draft: MemoryDraft,
        key_id: str,
        ring_thread: str,
        *,
        commit: bool,
        pending_ttl: float,
        now: float,
    ) -> MemoryView:
        """Write a new memory in the caller's transaction.

        Its record key ``key_id`` in ``ring_thread``'s ring ("" for the
        owner's) must exist.

        Raises:
            AlreadyExists: the id is taken, or ``SLOT_CONFLICT``.
            FailedPrecondition / InvalidArgument: a source (see :meth:`check_source`).
        """
        direction, trigger, status = KIND_DEFAULTS[draft.kind]
        if sk.get(txn, self.t.memory_ids, sk.memory_id_key(owner, memory_id)) is not None:
            raise AlreadyExists(f"owners/{owner}/memories/{memory_id} already exists")
        sources_state, sources_expiry = self._sources_window(txn, owner, draft.sources, now)
        state = COMMITTED if commit and sources_state == COMMITTED else PENDING
        rid = self._next_rids(txn, 1)
        self._ensure_owner(txn, owner, now)
        asked = now + draft.retention if draft.retention else 0.0
        retain = self._born_retention(txn, owner, now, asked)
        pending_end = _earliest(now + pending_ttl, sources_expiry) if state == PENDING else 0.0
        name = f"owners/{owner}/memories/{memory_id}"
        stone = self._tombstone_of(txn, name)
        # An id used again continues the old numbering: (name, version) is unique.
        version = stone.last_version + 1 if stone is not None else 1
        txn.delete(sk.tombstone_key(name), db=self.t.tombstones)
        meta = MemMeta(
            rid=rid,
            owner=owner,
            memory_id=memory_id,
            kind=draft.kind,
            state=state,
            version=version,
            status=draft.status or status,
            direction=draft.direction or direction,
            trigger=draft.trigger or trigger,
            origin=draft.origin,
            create_time=now,
            update_time=now,
            expire_time=_earliest(pending_end, retain) if state == PENDING else retain,
            ring_thread=ring_thread,
            key_ids={str(version): key_id},
            sources=list(draft.sources),
            due_time=draft.due_time,
            lineage_expiry=self._sources_lineage(txn, draft.sources),
            retain_until=retain,
        )
        if draft.embedding is not None:
            self._check_memory_dim(txn, owner, draft.embedding.shape[0], now)
        self._claim_slot(txn, meta, draft.content, now)
        self._write_version(txn, meta, draft)
        self._put_memory(txn, meta)
        self._queue_expiry(txn, meta)
        txn.put(sk.memory_id_key(owner, memory_id), sk.rid_key(rid), db=self.t.memory_ids)
        txn.put(sk.owner_record_key(owner, rid), b"", db=self.t.owner_records)
        add_edges(txn, self.t, meta.name, version, draft.sources)
        return MemoryView(meta, version, meta.status, draft.content, list(draft.sources))

    # ------------------------------------------------------------------ slots

    def ensure_slot_key(self, owner: str) -> None:
        """Create the owner's slot-digest key (in the owner ring) if it is missing."""
        ring = RingRef(owner, None)
        with self._slot_key_guard:
            if not self.keystore.has_record_key(ring, SLOT_KEY_ID):
                self.writer.run(
                    WriteOp(
                        _noop_apply, owner=owner, create_keys=[(ring, SLOT_KEY_ID)], name="slot.key"
                    )
                )

    def _slot_digest(self, meta: MemMeta, content: MemoryContent) -> str:
        origin = meta.origin if meta.kind == "PREFERENCE" else ""
        data = "\x00".join((meta.kind, content.slot, content.scope, origin)).encode()
        return self.keystore.keyed_digest(RingRef(meta.owner, None), SLOT_KEY_ID, data).hex()

    def _claim_slot(
        self, txn: lmdb.Transaction, meta: MemMeta, content: MemoryContent, now: float
    ) -> None:
        """Hold (kind, slot, scope) for ``meta``, or refuse a second active holder.

        Raises:
            AlreadyExists: reason ``SLOT_CONFLICT``, naming the memory that holds it.
        """
        if meta.kind not in SLOTTED_KINDS or not content.slot:
            self._release_slot(txn, meta)
            return
        digest = self._slot_digest(meta, content)
        key = sk.slot_key(meta.owner, digest)
        holder_rid = sk.get(txn, self.t.slots, key)
        if holder_rid is not None and holder_rid != sk.rid_key(meta.rid):
            holder = self._memory(txn, sk.rid_of(holder_rid))
            if holder is not None and effective_state(holder, now) in (PENDING, COMMITTED):
                raise SlotConflict(holder.name)
        if meta.slot_digest != digest:
            self._release_slot(txn, meta)
        meta.slot_digest = digest
        txn.put(key, sk.rid_key(meta.rid), db=self.t.slots)

    # ------------------------------------------------------------------ transitions

    def transition_memory(
        self,
        owner: str,
        memory_id: str,
        status: str,
        expected_version: int,
        evidence: tuple[str, int] | None,
        note: str,
    ) -> MemoryView:
        """Move a memory along its kind's state machine (a new version).

        Raises:
            NotFound / RecordDeleted: the memory. Aborted: ``expected_version``
            is not current. FailedPrecondition: ``ILLEGAL_TRANSITION``, or the
            evidence is deleted, stale or sealed; ``SEALED`` for a sealed memory.
        """
        with self.env.begin() as txn:
            current = self._mem_by_id(txn, owner, memory_id)
            if current is None:
                self._raise_missing(txn, f"owners/{owner}/memories/{memory_id}")
        key_id = secrets.token_hex(8)
        ring_thread = current.ring_thread

        def apply(txn: lmdb.Transaction) -> MemoryView:
            now = time.time()
            meta = self._mem_by_id(txn, owner, memory_id)
            name = f"owners/{owner}/memories/{memory_id}"
            if meta is None or effective_state(meta, now) is None:
                raise RecordDeleted(f"{name} was deleted")
            if meta.state == SEALED:
                raise FailedPrecondition(f"{name} is sealed", reason=Reason.SEALED, subject=name)
            if expected_version and expected_version != meta.version:
                raise Aborted(f"{name} is at version {meta.version}, not {expected_version}")
            if meta.ring_thread != ring_thread:
                raise Aborted(f"{name} changed concurrently; retry")
            if not transition_allowed(meta.kind, meta.status, status):
                hint = " (a FACT or PREFERENCE changes only by correction: UpdateMemory)"
                raise FailedPrecondition(
                    f"{meta.kind} {name} cannot go from {meta.status} to {status}"
                    + (hint if meta.kind in CORRECTED_KINDS else ""),
                    reason=Reason.ILLEGAL_TRANSITION,
                    subject=name,
                )
            if evidence is not None:
                parsed = _record_name(evidence[0])
                if parsed is None or parsed.owner != owner:
                    raise InvalidArgument("evidence.name", "must name a record of the same owner")
                self.check_source(txn, evidence[0], evidence[1], now)
                meta.evidence.append(evidence)
            old = self.memory_view(meta, meta.version, self._memory_ct(txn, meta, meta.version))
            content = old.content
            if note:
                content.notes.append(note)
            old_vec = txn.get(
                sk.memory_payload_key(meta.rid, meta.version, PAYLOAD_EMBEDDING),
                db=self.t.mpayloads,
            )
            embedding = None
            if old_vec is not None:
                raw = self.open_memory(meta, meta.version, PAYLOAD_EMBEDDING, bytes(old_vec))
                embedding = np.frombuffer(raw, dtype="<f4").astype(np.float32)
            meta.supersedes = 0
            meta.version += 1
            meta.key_ids[str(meta.version)] = key_id
            meta.status = status
            meta.update_time = now
            draft = MemoryDraft(meta.kind, content, list(meta.sources), embedding=embedding)
            self._write_version(txn, meta, draft)
            self._put_memory(txn, meta)
            remove_edges_of(txn, self.t, meta.name)
            add_edges(
                txn,
                self.t,
                meta.name,
                meta.version,
                meta.sources,
            )
            return MemoryView(meta, meta.version, meta.status, content, list(meta.sources))

        ring = RingRef(owner, ring_thread or None)
        return self.writer.run(
            WriteOp(apply, owner=owner, create_keys=[(ring, key_id)], name="memory.transition")
        )

    # ------------------------------------------------------------------ commitments

    def announce_due_commitments(self, now: float) -> int:
        """Emit ``COMMITMENT_DUE`` once per committed ``OPEN`` commitment past its ``due_time``.

        Returns how many are overdue now (announced or not): the
        ``lethe_overdue_commitments`` gauge. They stay at the top of every
        context assembly until closed (see :mod:`server.retrieval._context`).
        """

        def apply(txn: lmdb.Transaction) -> int:
            overdue = 0
            for raw_key, raw in txn.cursor(db=self.t.memories):
                meta = MemMeta.decode(bytes(raw))
                if (
                    meta.kind != "COMMITMENT"
                    or meta.status != "OPEN"
                    or not meta.due_time
                    or meta.due_time > now
                    or effective_state(meta, now) != COMMITTED
                ):
                    continue
                overdue += 1
                if meta.due_announced:
                    continue
                meta.due_announced = True
                txn.put(bytes(raw_key), meta.encode(), db=self.t.memories)
                self._append_event(txn, meta.owner, "COMMITMENT_DUE", meta.name, now)
            return overdue

        return self.writer.run(WriteOp(apply, name="commitments.due"))

    # ------------------------------------------------------------------ preferences

    def resolve_preference(
        self, owner: str, slot: str, scope: str
    ) -> tuple[MemoryView | None, list[MemoryView]]:
        """The applicable preference for ``slot`` at ``scope`` and the candidates.

        Resolution: the narrowest applicable scope (:func:`scope_chain`) first;
        within a scope, a committed ``EXPLICIT`` preference before a committed
        ``INFERRED`` one. Pending preferences (candidates, inferred or explicit)
        are never resolved: they are returned as candidates.
        """
        now = time.time()
        prefs: list[MemoryView] = []
        with self.env.begin() as txn:
            rows = []
            for meta in self._memories_read(txn, self._owner_memory_metas(txn, owner), now):
                state = effective_state(meta, now)
                if meta.kind != "PREFERENCE" or state not in (PENDING, COMMITTED):
                    continue
                rows.append((meta, self._memory_ct(txn, meta, meta.version)))
        for view in self.open_each(rows, lambda m, ct: self.memory_view(m, m.version, ct)):
            if view.content.slot == slot:
                prefs.append(view)
        chain = scope_chain(scope)
        rank = {s: i for i, s in enumerate(chain)}

        def scope_of(view: MemoryView) -> str:
            return view.content.scope or "default"

        applicable = [v for v in prefs if scope_of(v) in rank]
        resolved = sorted(
            (v for v in applicable if v.meta.state == COMMITTED),
            key=lambda v: (rank[scope_of(v)], 0 if v.meta.origin != "INFERRED" else 1),
        )
        candidates = [v for v in applicable if v.meta.state == PENDING]
        return (resolved[0] if resolved else None), candidates

    def _check_memory_dim(self, txn: lmdb.Transaction, owner: str, dim: int, now: float) -> None:
        row = self._ensure_owner(txn, owner, now)
        if row.dim and row.dim != dim:
            raise InvalidArgument(
                "memory.embedding",
                f"dimension {dim} differs from the owner's {row.dim}",
                reason=Reason.DIMENSION_MISMATCH,
            )
        if not row.dim:
            row.dim = dim
            self._put_owner(txn, owner, row)

    def update_memory(
        self,
        owner: str,
        memory_id: str,
        draft: MemoryDraft,
        paths: set[str],
        expected_version: int,
        pending_ttl: float,
        *,
        keep_embedding: bool = False,
        shingler: Shingler | None = None,
    ) -> MemoryView:
        """Write a new version of a memory (the version is the etag).

        With ``keep_embedding`` (neither text nor vector changed) the previous
        version's vector is carried over; otherwise ``draft.embedding`` is the
        new version's vector (the embedding follows the text).

        ``paths`` are the update-mask fields: text, slot, scope, edge, sources,
        due_time, embedding, metadata. Fields not named are carried over from the current
        version. A ``FACT`` or ``PREFERENCE`` update is a correction: the old
        version becomes ``SUPERSEDED`` (readable only by explicit version).

        ``shingler``: as :meth:`create_memory` (the new version's text is checked).

        Raises:
            NotFound / RecordDeleted: the memory. Aborted: ``expected_version``
            (when non-zero) is not current. FailedPrecondition: a new source is
            deleted, stale or sealed; ``ECHOES_FORGOTTEN`` (as :meth:`create_memory`).
        """
        key_id = secrets.token_hex(8)
        with self.env.begin() as txn:
            current = self._mem_by_id(txn, owner, memory_id)
        if current is None or current.deleted:
            name = f"owners/{owner}/memories/{memory_id}"
            with self.env.begin() as txn:
                self._raise_missing(txn, name)
        ring_thread = current.ring_thread
        if current.kind in SLOTTED_KINDS:
            self.ensure_slot_key(owner)

        def apply(txn: lmdb.Transaction) -> MemoryView:
            return self._update_in(
                txn,
                self._mem_by_id(txn, owner, memory_id),
                f"owners/{owner}/memories/{memory_id}",
                draft,
                paths,
                expected_version,
                pending_ttl,
                key_id,
                ring_thread,
                keep_embedding=keep_embedding,
                shingler=shingler,
                now=time.time(),
            )

        ring = RingRef(owner, ring_thread or None)
        return self.writer.run(
            WriteOp(apply, owner=owner, create_keys=[(ring, key_id)], name="memory.update")
        )

    def _update_in(
        self,
        txn: lmdb.Transaction,
        meta: MemMeta | None,
        name: str,
        draft: MemoryDraft,
        paths: set[str],
        expected_version: int,
        pending_ttl: float,
        key_id: str,
        ring_thread: str,
        *,
        keep_embedding: bool,
        shingler: Shingler | None,
        now: float,
    ) -> MemoryView:
        """Write a new version of ``meta`` (the memory ``name`` as read in ``txn``) in ``txn``.

        Its record key ``key_id`` in ``ring_thread``'s ring must exist.
        Arguments as :meth:`update_memory`'s; sources not in ``paths`` are
        the current version's.

        Raises:
            RecordDeleted: ``meta`` is None, deleted or expired.
            Aborted: ``expected_version`` is not current, or the memory's ring
                is not ``ring_thread`` (it changed since the key was made).
            FailedPrecondition / AlreadyExists: as :meth:`update_memory`.
        """
        if meta is None or meta.deleted or effective_state(meta, now) is None:
            raise RecordDeleted(f"{name} was deleted")
        owner = meta.owner
        if meta.state == SEALED:
            raise FailedPrecondition(
                f"{meta.name} is sealed", reason=Reason.SEALED, subject=meta.name
            )
        if expected_version and expected_version != meta.version:
            raise Aborted(f"{meta.name} is at version {meta.version}, not {expected_version}")
        if meta.ring_thread != ring_thread:
            raise Aborted(f"{meta.name} changed concurrently; retry")
        sources = draft.sources if "sources" in paths else list(meta.sources)
        for src, _ in meta.sources:  # no patching a derivative out of its lineage
            src_meta = self.resolve(txn, src)
            if src_meta is None or not source_alive(src_meta, now):
                raise FailedPrecondition(
                    f"source {src} is gone; rebuild {meta.name} instead of updating it",
                    reason=Reason.SOURCE_DELETED,
                    subject=src,
                )
        old = self.memory_view(meta, meta.version, self._memory_ct(txn, meta, meta.version))
        content = MemoryContent(
            draft.content.text if "text" in paths else old.content.text,
            draft.content.slot if "slot" in paths else old.content.slot,
            draft.content.scope if "scope" in paths else old.content.scope,
            draft.content.edge if "edge" in paths else old.content.edge,
            metadata=draft.content.metadata if "metadata" in paths else old.content.metadata,
        )
        if self._echo_check(txn, owner, [_guarded_text(content)], shingler)[0]:
            raise self._refuse_echo("memory.text")
        sources_state, sources_expiry = self._sources_window(txn, owner, sources, now)
        if meta.kind in SLOTTED_KINDS:
            self._claim_slot(txn, meta, content, now)
        remove_edges_of(txn, self.t, meta.name)
        if meta.kind in CORRECTED_KINDS:
            meta.superseded.append(meta.version)
        meta.supersedes = meta.version
        meta.version += 1
        meta.key_ids[str(meta.version)] = key_id
        meta.sources = list(sources)
        meta.lineage_expiry = self._sources_lineage(txn, sources)
        meta.update_time = now
        if "due_time" in paths:
            meta.due_time = draft.due_time
        if sources_state == PENDING and meta.state == COMMITTED:
            meta.state = PENDING  # a derivative is never more durable than its sources
        if meta.state == PENDING:
            self._unqueue_expiry(txn, meta)
            window = _earliest(now + pending_ttl, sources_expiry)
            meta.expire_time = _earliest(window, meta.retain_until)
            self._queue_expiry(txn, meta)
        embedding = draft.embedding
        if keep_embedding and meta.has_embedding:
            old_vec = txn.get(
                sk.memory_payload_key(meta.rid, meta.version - 1, PAYLOAD_EMBEDDING),
                db=self.t.mpayloads,
            )
            if old_vec is not None:
                prev = MemMeta.decode(meta.encode())
                prev.version -= 1
                raw = self.open_memory(prev, prev.version, PAYLOAD_EMBEDDING, bytes(old_vec))
                embedding = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        new = MemoryDraft(meta.kind, content, list(sources), embedding=embedding)
        if embedding is not None:
            self._check_memory_dim(txn, owner, embedding.shape[0], now)
        self._write_version(txn, meta, new)
        self._put_memory(txn, meta)
        add_edges(txn, self.t, meta.name, meta.version, sources)
        return MemoryView(meta, meta.version, meta.status, content, list(sources))

    def upsert_memory(
        self,
        owner: str,
        memory_id: str,
        draft: MemoryDraft,
        paths: set[str],
        expected_version: int,
        pending_ttl: float,
        *,
        commit: bool,
        keep_embedding: bool = False,
        shingler: Shingler | None = None,
    ) -> MemoryView:
        """``UpdateMemory`` with ``allow_missing``: update the memory, or create it (AIP-134).

        A memory that exists is updated as :meth:`update_memory` does (its
        kind must be ``draft.kind``); an id no memory holds is created as
        :meth:`create_memory` does (``draft`` whole, ``paths`` unused). Each
        is one write transaction; when another writer creates or purges the
        id between the read that chose and that transaction, the choice is
        made again (at most :data:`_UPSERT_TRIES` times).

        Raises:
            RecordDeleted: the memory is deleted or expired and its id not yet
                free (its deletion still purging it).
            NotFound: ``expected_version`` is non-zero and no memory holds the id.
            InvalidArgument: ``draft.kind`` is not the existing memory's kind.
            Aborted: the id changed hands :data:`_UPSERT_TRIES` times in a row.
            AlreadyExists / FailedPrecondition / Aborted: as :meth:`create_memory`
                and :meth:`update_memory`.
        """
        name = f"owners/{owner}/memories/{memory_id}"
        for _ in range(_UPSERT_TRIES):
            with self.env.begin() as txn:
                current = self._mem_by_id(txn, owner, memory_id)
            if current is not None:
                if current.kind != draft.kind and not current.deleted:
                    raise InvalidArgument(
                        "memory.kind", f"is immutable: {name} is a {current.kind}"
                    )
                update = MemoryDraft(
                    draft.kind,
                    draft.content,
                    draft.sources,
                    due_time=draft.due_time,
                    embedding=None if keep_embedding else draft.embedding,
                )
                try:
                    return self.update_memory(
                        owner,
                        memory_id,
                        update,
                        paths,
                        expected_version,
                        pending_ttl,
                        keep_embedding=keep_embedding,
                        shingler=shingler,
                    )
                except RecordDeleted:
                    if self._id_taken(owner, memory_id):
                        raise  # deleted and not yet purged, or expired
                continue  # purged meanwhile: create it
            if expected_version:
                raise NotFound(f"{name} not found (expected_version {expected_version})")
            try:
                return self.create_memory(
                    owner,
                    memory_id,
                    draft,
                    commit=commit,
                    pending_ttl=pending_ttl,
                    shingler=shingler,
                )
            except SlotConflict:
                raise
            except AlreadyExists:
                continue  # created meanwhile (and maybe purged again since): choose again
        raise Aborted(f"{name} changed concurrently; retry")

    def _id_taken(self, owner: str, memory_id: str) -> bool:
        """Whether a memory (live, deleted or expired) holds ``memory_id``."""
        with self.env.begin() as txn:
            key = sk.memory_id_key(owner, memory_id)
            return sk.get(txn, self.t.memory_ids, key) is not None

    # ------------------------------------------------------------------ reads

    def get_memory(self, owner: str, memory_id: str, version: int) -> MemoryView:
        """Read the current version (``version`` 0) or an explicit one.

        Raises:
            NotFound: never existed, or no such version. RecordDeleted: deleted
            or expired. DataLoss: ciphertext fails authentication.
        """
        name = f"owners/{owner}/memories/{memory_id}"
        now = time.time()
        with self.env.begin() as txn:
            found = self._mem_by_id(txn, owner, memory_id)
            if found is None:
                self._raise_missing(txn, name)
            meta = self._memory_read(txn, found, now)
            if effective_state(meta, now) is None:
                raise RecordDeleted(f"{name} was deleted")
            if meta.state == SEALED:
                raise FailedPrecondition(f"{name} is sealed", reason=Reason.SEALED, subject=name)
            wanted = version or meta.version
            if str(wanted) not in meta.key_ids:
                raise NotFound(f"{name} has no version {wanted}")
            ct = self._memory_ct(txn, meta, wanted)
        view = self.memory_view(meta, wanted, ct)
        if wanted != meta.version:
            view.sources = []  # lineage is kept for the current version only
        return view

    def list_memories(
        self,
        owner: str,
        after: str,
        limit: int,
        *,
        kinds: set[str],
        states: set[str],
        statuses: set[str],
        by_creation: bool = False,
    ) -> tuple[list[MemoryView], str]:
        """Current versions of an owner's memories, by id or in creation order.

        Sealed, deleted and expired memories are never listed.

        Args:
            owner: the owner id.
            after: where the page starts: "" for the first page, else the
                cursor returned with the previous page (a memory id by id, a
                record number in decimal in creation order).
            limit: most memories returned (≥ 1).
            kinds: only these kinds (empty: every kind).
            states: only these states.
            statuses: only these statuses of the current version (empty: every
                status).
            by_creation: creation order instead of id order: the owner's
                ``owner_records`` rows in record-number order (each creation
                takes the next number in the one writer; an update keeps it; a
                memory created again after its purge gets a new one; an owner
                move renumbers in the same order). The owner's turns are in
                that table too and are skipped with one ``memories`` read each
                (1.2 µs a turn after 20,000 turns, 2.1 µs after 100,000: those
                add 25 ms and 0.21 s to the pages that cross them;
                ``bench/bench_list_skip.py``, one run on a shared 2-core
                machine).

        Returns:
            (the page, the cursor of the next page or "" when this was the last).

        Raises:
            InvalidArgument: ``after`` is not a record number (``by_creation``).
            DataLoss: ciphertext fails authentication.
        """
        now = time.time()
        rows: list[tuple[MemMeta, bytes | None]] = []
        more = False
        with self.env.begin() as txn:
            for meta in self._listed(txn, owner, after, by_creation):
                meta = self._memory_read(txn, meta, now)
                state = effective_state(meta, now)
                if state is None or state == SEALED or state not in states:
                    continue
                if (kinds and meta.kind not in kinds) or (statuses and meta.status not in statuses):
                    continue
                if len(rows) == limit:
                    more = True
                    break
                rows.append((meta, self._memory_ct(txn, meta, meta.version)))
        views = self.open_each(rows, lambda m, ct: self.memory_view(m, m.version, ct))
        if not (more and rows):
            return views, ""
        last = rows[-1][0]
        return views, (str(last.rid) if by_creation else last.memory_id)

    def _listed(
        self, txn: lmdb.Transaction, owner: str, after: str, by_creation: bool
    ) -> Iterator[MemMeta]:
        """The owner's stored memories after ``after``, by id or by record number."""
        prefix = sk.owner_prefix(owner)
        if not by_creation:
            start = prefix + after.encode() + b"\x01" if after else None
            for _, rk in sk.scan(txn, self.t.memory_ids, prefix, start=start):
                meta = self._memory(txn, sk.rid_of(rk))
                if meta is not None:
                    yield meta
            return
        if after and not after.isdigit():
            raise InvalidArgument("page_token", "not a position of this listing")
        start = sk.owner_record_key(owner, int(after) + 1) if after else None
        for key, _ in sk.scan(txn, self.t.owner_records, prefix, start=start):
            meta = self._memory(txn, sk.rid_of(key[len(prefix) :]))  # None: a turn
            if meta is not None and meta.owner == owner:
                yield meta

    def owner_memories(self, owner: str) -> list[MemMeta]:
        """Every stored memory of an owner (one read transaction), as reads see them."""
        now = time.time()
        with self.env.begin() as txn:
            return self._memories_read(txn, self._owner_memory_metas(txn, owner), now)

    def committed_memories(self, owner: str) -> list[MemoryView]:
        """The current versions of the owner's committed, live, untainted memories, by id.

        That is what context assembly may offer.
        """
        now = time.time()
        with self.env.begin() as txn:
            rows = [
                (meta, self._memory_ct(txn, meta, meta.version))
                for meta in self._memories_read(txn, self._owner_memory_metas(txn, owner), now)
                if effective_state(meta, now) == COMMITTED and not meta.tainted
            ]
        out = self.open_each(rows, lambda m, ct: self.memory_view(m, m.version, ct))
        return out

    # ------------------------------------------------------------------ lineage

    def lineage(
        self, name: str, ancestors: bool, max_depth: int
    ) -> list[tuple[tuple[str, int], tuple[str, int]]]:
        """Edges reachable from ``name`` up (ancestors) or down (descendants), breadth first.

        Up to ``max_depth`` hops; each edge is
        ``((source, v), (derivative, v))``.
        """
        edges: list[tuple[tuple[str, int], tuple[str, int]]] = []
        seen = {name}
        frontier = [name]
        with self.env.begin() as txn:
            for _ in range(max_depth):
                nxt = []
                for node in frontier:
                    if ancestors:
                        for src, (sv, dv) in ancestors_of(txn, self.t, node):
                            edges.append(((src, sv), (node, dv)))
                            if src not in seen:
                                seen.add(src)
                                nxt.append(src)
                    else:
                        for child, (sv, dv) in children_of(txn, self.t, node):
                            edges.append(((node, sv), (child, dv)))
                            if child not in seen:
                                seen.add(child)
                                nxt.append(child)
                frontier = nxt
                if not frontier:
                    break
        return edges

    def memory_embeddings(
        self, metas: Sequence[MemMeta]
    ) -> tuple[list[int], npt.NDArray[np.float32]]:
        """Decrypted current-version vectors: (rids, ``(n, d) float32``)."""
        with self.env.begin() as txn:
            cts = {
                m.rid: sk.get(
                    txn,
                    self.t.mpayloads,
                    sk.memory_payload_key(m.rid, m.version, PAYLOAD_EMBEDDING),
                )
                for m in metas
                if m.has_embedding
            }
        opened = self.open_each(
            ((m, ct) for m in metas if (ct := cts.get(m.rid)) is not None),
            lambda m, ct: (m.rid, self.open_memory(m, m.version, PAYLOAD_EMBEDDING, bytes(ct))),
        )
        return stack_vectors(opened)


def _guarded_text(content: MemoryContent) -> str:
    """What an echo guard checks of a memory: its text, or its graph edge's words."""
    if content.text or content.edge is None:
        return content.text
    return " ".join(content.edge)
