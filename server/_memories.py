"""Memories: typed entries and derivatives, their versions, lineage and
conditional publication (API.md, ``Memories``; ARCHITECTURE.md, "Lineage and
deletion").

A memory's content (text, slot, scope, graph edge) is one JSON payload per
version, sealed under that version's record key; its vector is a second
payload. Metadata (:class:`server._records.MemMeta`) holds ids, states,
versions, times and lineage names only.

Conditional publication: creating or updating a derivative re-reads every
source in the same write transaction that publishes it, and refuses with
``FAILED_PRECONDITION`` and ``SOURCE_DELETED`` (deleted, expired or tainted),
``SOURCE_STALE`` (no longer at the referenced version) or ``SOURCE_SEALED``,
naming the source. So a summariser that read a source before it was deleted
can never publish after the deletion.

Inherited state: a derivative of a pending source is pending; committing it
needs its pending sources committed first, or ``include_sources``.

Thread rules: as :class:`server._store.Store` (writes on the writer thread
through ``WriteOp``; reads from any thread).
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import lmdb
import numpy as np
import numpy.typing as npt

from server._lineage import add_edges, ancestors_of, children_of, remove_edges_of
from server._records import (
    COMMITTED,
    PAYLOAD_EMBEDDING,
    PAYLOAD_MEMORY,
    PENDING,
    SEALED,
    MemMeta,
    TurnMeta,
    expiry_key,
    memory_id_key,
    memory_payload_key,
    owner_prefix,
    rid_key,
    seq_key,
)
from server._visibility import effective_state
from server._writer import WriteOp
from server.errors import (
    Aborted,
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RecordDeleted,
)
from shredder import AssociatedData, RingRef

if TYPE_CHECKING:
    from server._writer import Writer
    from shredder import Keystore

_TURN_RE = re.compile(
    r"owners/([a-z0-9][a-z0-9-]{0,62})/threads/([a-z0-9][a-z0-9-]{0,62})/turns/([1-9][0-9]{0,18})"
)
_MEMORY_RE = re.compile(r"owners/([a-z0-9][a-z0-9-]{0,62})/memories/([a-z0-9][a-z0-9-]{0,62})")

# Shapes (ARCHITECTURE.md): kind -> (direction, trigger, initial status).
KIND_DEFAULTS: dict[str, tuple[str, str, str]] = {
    "FACT": ("ABOUT_PERSON", "CORRECTION_ONLY", "ACTIVE"),
    "OPEN_QUESTION": ("ABOUT_PERSON", "ANSWERED", "OPEN"),
    "GOAL": ("ABOUT_PERSON", "PROGRESS_OR_ABANDONED", "ACTIVE"),
    "COMMITMENT": ("OWED_BY_SYSTEM", "FULFILLED_CANCELLED_EXPIRED_OR_BROKEN", "OPEN"),
    "PENDING_POINT": ("ABOUT_PERSON", "RESUMED_OR_RELEASED", "PAUSED"),
    "PREFERENCE": ("ABOUT_PERSON", "CORRECTION_ONLY", "ACTIVE"),
    "SUMMARY": ("", "", "ACTIVE"),
    "GRAPH_EDGE": ("", "", "ACTIVE"),
    "ANNOTATION": ("", "", "ACTIVE"),
    "REFLECTION": ("", "", "ACTIVE"),
    "LESSON": ("", "", "ACTIVE"),
}
# Kinds whose update is a correction: the old version becomes SUPERSEDED.
CORRECTED_KINDS = ("FACT", "PREFERENCE")
# Kinds whose (slot, scope) may hold one active memory at a time.
SLOTTED_KINDS = ("FACT", "PREFERENCE")
SLOT_KEY_ID = "slot-digest"

# TransitionMemory's state machines: kind -> status -> statuses it may move to.
# FACT and PREFERENCE change only by correction (UpdateMemory); the derived
# kinds (SUMMARY, GRAPH_EDGE, ANNOTATION, REFLECTION, LESSON) have no lifecycle
# of their own. A GOAL may "move" ACTIVE -> ACTIVE to record progress.
TRANSITIONS: dict[str, dict[str, frozenset[str]]] = {
    "OPEN_QUESTION": {"OPEN": frozenset({"ANSWERED"})},
    "GOAL": {"ACTIVE": frozenset({"ACTIVE", "ACHIEVED", "ABANDONED"})},
    "COMMITMENT": {"OPEN": frozenset({"FULFILLED", "CANCELLED", "EXPIRED", "BROKEN"})},
    "PENDING_POINT": {"PAUSED": frozenset({"RESUMED", "RELEASED"})},
}


def transition_allowed(kind: str, current: str, target: str) -> bool:
    """Whether ``TransitionMemory`` may move a ``kind`` memory from ``current`` to ``target``."""
    return target in TRANSITIONS.get(kind, {}).get(current, frozenset())


def scope_chain(scope: str) -> list[str]:
    """Applicable scopes, narrowest first: ``a.b`` -> ``a.b``, ``a``, ``default``."""
    parts = [p for p in scope.split(".") if p] if scope else []
    chain = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    return [*chain, "default"] if "default" not in chain else chain


@dataclass(slots=True)
class MemoryContent:
    """The sealed part of one memory version."""

    text: str = ""
    slot: str = ""
    scope: str = ""
    edge: tuple[str, str, str] | None = None
    # Progress notes and closing notes of TransitionMemory, oldest first.
    notes: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "text": self.text,
                "slot": self.slot,
                "scope": self.scope,
                "edge": list(self.edge) if self.edge else None,
                "notes": self.notes,
            }
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> MemoryContent:
        data = json.loads(raw)
        edge = data.get("edge")
        return cls(
            data["text"],
            data["slot"],
            data["scope"],
            tuple(edge) if edge else None,
            list(data.get("notes", [])),
        )


@dataclass(slots=True)
class MemoryDraft:
    """A validated memory to create, or the fields of an update.

    Attributes:
        embedding: ``(d,) float32`` client vector, or None (the server embeds the text).
        due_time: seconds since the epoch, 0 for none.
    """

    kind: str
    content: MemoryContent
    sources: list[tuple[str, int]] = field(default_factory=list)
    direction: str = ""
    trigger: str = ""
    status: str = ""
    origin: str = ""
    due_time: float = 0.0
    embedding: npt.NDArray[np.float32] | None = None


@dataclass(slots=True)
class MemoryView:
    """A readable memory version: metadata plus decrypted content."""

    meta: MemMeta
    version: int
    status: str
    content: MemoryContent
    sources: list[tuple[str, int]]


def memory_ring(meta: MemMeta) -> RingRef:
    return RingRef(meta.owner, meta.ring_thread or None)


def parse_record_name(name: str) -> tuple[str, str, str, int] | None:
    """``("turn", owner, thread, seq)`` or ``("memory", owner, memory_id, 0)`` or None."""
    m = _TURN_RE.fullmatch(name)
    if m:
        return ("turn", m.group(1), m.group(2), int(m.group(3)))
    m = _MEMORY_RE.fullmatch(name)
    if m:
        return ("memory", m.group(1), m.group(2), 0)
    return None


class SlotConflict(AlreadyExists):
    """A second active memory on the same (kind, slot, scope); ``holder`` names the first."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"{holder} already holds this slot and scope", reason="SLOT_CONFLICT")
        self.holder = holder

    def details(self) -> list[Any]:
        from google.protobuf import any_pb2
        from google.rpc import error_details_pb2

        info = error_details_pb2.ResourceInfo(
            resource_type="lethe.v1.Memory",
            resource_name=self.holder,
            description="holds the slot and scope",
        )
        packed = any_pb2.Any()
        packed.Pack(info)
        return [packed]


def _earliest(own: float, sources: float) -> float:
    """A pending derivative's expiry: its own, or its first pending source's if sooner."""
    return min(own, sources) if sources else own


def _noop_apply(txn: lmdb.Transaction) -> None:
    del txn


class MemoryMixin:
    """Memory operations of :class:`server._store.Store` (see the module docstring)."""

    _slot_key_guard = threading.Lock()

    if TYPE_CHECKING:  # provided by Store
        env: lmdb.Environment
        db: dict[str, Any]
        writer: Writer
        keystore: Keystore

        def _raise_missing(self, txn: lmdb.Transaction, name: str) -> NoReturn: ...

        def _owner_memory_metas(self, txn: lmdb.Transaction, owner: str) -> list[MemMeta]: ...

        def _event(
            self, txn: lmdb.Transaction, owner: str, event: dict[str, Any], now: float
        ) -> None: ...

        def _open(
            self, ring: RingRef, key_id: str, ad: AssociatedData, ciphertext: bytes, name: str
        ) -> bytes: ...

    # ------------------------------------------------------------------ lookups

    def _mem_by_id(self, txn: lmdb.Transaction, owner: str, memory_id: str) -> MemMeta | None:
        rk = txn.get(memory_id_key(owner, memory_id), db=self.db["memory_ids"])
        if rk is None:
            return None
        raw = txn.get(bytes(rk), db=self.db["memories"])
        return None if raw is None else MemMeta.decode(bytes(raw))

    def resolve(self, txn: lmdb.Transaction, name: str) -> TurnMeta | MemMeta | None:
        """The metadata row a turn or memory name points at (deleted rows included)."""
        parsed = parse_record_name(name)
        if parsed is None:
            return None
        kind, owner, second, seq = parsed
        if kind == "memory":
            return self._mem_by_id(txn, owner, second)
        rk = txn.get(seq_key(owner, second, seq), db=self.db["seqs"])
        raw = None if rk is None else txn.get(bytes(rk), db=self.db["turns"])
        return None if raw is None else TurnMeta.decode(bytes(raw))

    def check_source(
        self, txn: lmdb.Transaction, name: str, version: int, now: float
    ) -> TurnMeta | MemMeta:
        """Conditional publication of one source (see the module docstring).

        Raises:
            FailedPrecondition: ``SOURCE_DELETED``, ``SOURCE_SEALED`` or ``SOURCE_STALE``.
            InvalidArgument: the source never existed.
        """
        meta = self.resolve(txn, name)
        if meta is None:
            if txn.get(name.encode(), db=self.db["tombstones"]) is not None:
                raise FailedPrecondition(
                    f"source {name} was deleted", reason="SOURCE_DELETED", subject=name
                )
            raise InvalidArgument("sources", f"{name} does not exist")
        state = effective_state(meta, now)
        if state is None or meta.tainted:
            raise FailedPrecondition(
                f"source {name} was deleted", reason="SOURCE_DELETED", subject=name
            )
        if state == SEALED:
            raise FailedPrecondition(
                f"source {name} is sealed", reason="SOURCE_SEALED", subject=name
            )
        if version != meta.version:
            raise FailedPrecondition(
                f"source {name} is at version {meta.version}, not {version}",
                reason="SOURCE_STALE",
                subject=name,
            )
        return meta

    def ring_for_sources(self, owner: str, sources: Sequence[tuple[str, int]]) -> str:
        """The thread whose ring a derivative's keys go in, or "" for the owner ring."""
        threads: set[str] = set()
        with self.env.begin() as txn:
            for name, _ in sources:
                parsed = parse_record_name(name)
                if parsed is None:
                    return ""
                if parsed[0] == "turn":
                    threads.add(parsed[2])
                else:
                    meta = self._mem_by_id(txn, owner, parsed[2])
                    threads.add(meta.ring_thread if meta is not None else "")
        return threads.pop() if len(threads) == 1 else ""

    # ------------------------------------------------------------------ crypto

    def _seal_memory(self, meta: MemMeta, version: int, ptype: str, plain: bytes) -> bytes:
        ad = AssociatedData(meta.owner, meta.name, version, ptype)
        return self.keystore.seal(memory_ring(meta), meta.key_ids[str(version)], ad, plain)

    def open_memory(self, meta: MemMeta, version: int, ptype: str, ct: bytes) -> bytes:
        """Decrypt one payload of one memory version.

        Raises:
            RecordDeleted: its key was destroyed. DataLoss: authentication failed.
        """
        ad = AssociatedData(meta.owner, meta.name, version, ptype)
        return self._open(memory_ring(meta), meta.key_ids[str(version)], ad, ct, meta.name)

    def memory_view(self, meta: MemMeta, version: int, ct: bytes | None) -> MemoryView:
        if ct is None:
            raise RecordDeleted(f"{meta.name} was deleted")
        try:
            content = MemoryContent.decode(self.open_memory(meta, version, PAYLOAD_MEMORY, ct))
        except (ValueError, KeyError, TypeError):
            raise DataLoss(f"stored content of {meta.name} is malformed") from None
        status = "SUPERSEDED" if version in meta.superseded else meta.status
        return MemoryView(meta, version, status, content, list(meta.sources))

    # ------------------------------------------------------------------ writes

    def _write_version(self, txn: lmdb.Transaction, meta: MemMeta, draft: MemoryDraft) -> None:
        txn.put(
            memory_payload_key(meta.rid, meta.version, PAYLOAD_MEMORY),
            self._seal_memory(meta, meta.version, PAYLOAD_MEMORY, draft.content.encode()),
            db=self.db["mpayloads"],
        )
        if draft.embedding is not None:
            txn.put(
                memory_payload_key(meta.rid, meta.version, PAYLOAD_EMBEDDING),
                self._seal_memory(
                    meta, meta.version, PAYLOAD_EMBEDDING, draft.embedding.astype("<f4").tobytes()
                ),
                db=self.db["mpayloads"],
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
        """(COMMITTED or PENDING, earliest expire_time of a pending source or 0):
        a derivative never outlives a pending source."""
        state, earliest = COMMITTED, 0.0
        for name, version in sources:
            parsed = parse_record_name(name)
            if parsed is None or parsed[1] != owner:
                raise InvalidArgument("sources", f"{name} is not a record of owners/{owner}")
            meta = self.check_source(txn, name, version, now)
            if meta.state == PENDING:
                state = PENDING
                if meta.expire_time and (not earliest or meta.expire_time < earliest):
                    earliest = meta.expire_time
        return state, earliest

    def create_memory(
        self,
        owner: str,
        memory_id: str,
        draft: MemoryDraft,
        *,
        commit: bool,
        pending_ttl: float,
    ) -> MemoryView:
        """Publish a memory with its lineage, in one transaction.

        Raises:
            AlreadyExists: the id is taken (also by a deleted memory not yet purged).
            FailedPrecondition: a source is deleted, stale or sealed.
            InvalidArgument: a source never existed or belongs to another owner.
        """
        ring_thread = self.ring_for_sources(owner, draft.sources) if draft.sources else ""
        key_id = secrets.token_hex(8)
        direction, trigger, status = KIND_DEFAULTS[draft.kind]
        if draft.kind in SLOTTED_KINDS and draft.content.slot:
            self.ensure_slot_key(owner)

        def apply(txn: lmdb.Transaction) -> MemoryView:
            now = time.time()
            if txn.get(memory_id_key(owner, memory_id), db=self.db["memory_ids"]) is not None:
                raise AlreadyExists(f"owners/{owner}/memories/{memory_id} already exists")
            sources_state, sources_expiry = self._sources_window(txn, owner, draft.sources, now)
            state = COMMITTED if commit and sources_state == COMMITTED else PENDING
            rid = int(txn.get(b"next_rid", db=self.db["meta"]) or b"1")
            txn.put(b"next_rid", str(rid + 1).encode(), db=self.db["meta"])
            if txn.get(owner.encode(), db=self.db["owners"]) is None:
                txn.put(
                    owner.encode(),
                    json.dumps({"dim": 0, "create_time": now}).encode(),
                    db=self.db["owners"],
                )
            name = f"owners/{owner}/memories/{memory_id}"
            stone = txn.get(name.encode(), db=self.db["tombstones"])
            # An id used again continues the old numbering: (name, version) is unique.
            version = int(json.loads(bytes(stone)).get("last_version", 0)) + 1 if stone else 1
            txn.delete(name.encode(), db=self.db["tombstones"])
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
                expire_time=_earliest(now + pending_ttl, sources_expiry)
                if state == PENDING
                else 0.0,
                ring_thread=ring_thread,
                key_ids={str(version): key_id},
                sources=list(draft.sources),
                due_time=draft.due_time,
            )
            if draft.embedding is not None:
                self._check_memory_dim(txn, owner, draft.embedding.shape[0], now)
            self._claim_slot(txn, meta, draft.content, now)
            self._write_version(txn, meta, draft)
            self._put_memory(txn, meta)
            self.mark_pending_expiry(txn, meta)
            txn.put(memory_id_key(owner, memory_id), rid_key(rid), db=self.db["memory_ids"])
            txn.put(owner_prefix(owner) + rid_key(rid), b"", db=self.db["owner_records"])
            add_edges(
                txn,
                self.db["lineage_down"],
                self.db["lineage_up"],
                meta.name,
                version,
                draft.sources,
            )
            return MemoryView(meta, version, meta.status, draft.content, list(draft.sources))

        ring = RingRef(owner, ring_thread or None)
        return self.writer.run(WriteOp(apply, create_keys=[(ring, key_id)]))

    # ------------------------------------------------------------------ slots

    def emit_event(self, owner: str, event_type: str, subject: str) -> None:
        """Append one event outside any other write (e.g. ``SLOT_CONFLICT``)."""

        def apply(txn: lmdb.Transaction) -> None:
            self._event(
                txn, owner, {"type": event_type, "subject": subject, "sources": []}, time.time()
            )

        self.writer.run(WriteOp(apply))

    def ensure_slot_key(self, owner: str) -> None:
        """Create the owner's slot-digest key (in the owner ring) if it is missing."""
        ring = RingRef(owner, None)
        with self._slot_key_guard:
            if not self.keystore.has_record_key(ring, SLOT_KEY_ID):
                self.writer.run(WriteOp(_noop_apply, create_keys=[(ring, SLOT_KEY_ID)]))

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
        key = f"{meta.owner}\x00".encode() + bytes.fromhex(digest)
        holder_rid = txn.get(key, db=self.db["slots"])
        if holder_rid is not None and bytes(holder_rid) != rid_key(meta.rid):
            raw = txn.get(bytes(holder_rid), db=self.db["memories"])
            holder = None if raw is None else MemMeta.decode(bytes(raw))
            if holder is not None and effective_state(holder, now) in (PENDING, COMMITTED):
                raise SlotConflict(holder.name)
        if meta.slot_digest != digest:
            self._release_slot(txn, meta)
        meta.slot_digest = digest
        txn.put(key, rid_key(meta.rid), db=self.db["slots"])

    def _release_slot(self, txn: lmdb.Transaction, meta: MemMeta) -> None:
        if not meta.slot_digest:
            return
        key = f"{meta.owner}\x00".encode() + bytes.fromhex(meta.slot_digest)
        if txn.get(key, db=self.db["slots"]) == rid_key(meta.rid):
            txn.delete(key, db=self.db["slots"])
        meta.slot_digest = ""

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
                raise FailedPrecondition(f"{name} is sealed", reason="SEALED", subject=name)
            if expected_version and expected_version != meta.version:
                raise Aborted(f"{name} is at version {meta.version}, not {expected_version}")
            if meta.ring_thread != ring_thread:
                raise Aborted(f"{name} changed concurrently; retry")
            if not transition_allowed(meta.kind, meta.status, status):
                hint = " (a FACT or PREFERENCE changes only by correction: UpdateMemory)"
                raise FailedPrecondition(
                    f"{meta.kind} {name} cannot go from {meta.status} to {status}"
                    + (hint if meta.kind in CORRECTED_KINDS else ""),
                    reason="ILLEGAL_TRANSITION",
                    subject=name,
                )
            if evidence is not None:
                parsed = parse_record_name(evidence[0])
                if parsed is None or parsed[1] != owner:
                    raise InvalidArgument("evidence.name", "must name a record of the same owner")
                self.check_source(txn, evidence[0], evidence[1], now)
                meta.evidence.append(evidence)
            old_ct = txn.get(
                memory_payload_key(meta.rid, meta.version, PAYLOAD_MEMORY), db=self.db["mpayloads"]
            )
            old = self.memory_view(meta, meta.version, None if old_ct is None else bytes(old_ct))
            content = old.content
            if note:
                content.notes.append(note)
            old_vec = txn.get(
                memory_payload_key(meta.rid, meta.version, PAYLOAD_EMBEDDING),
                db=self.db["mpayloads"],
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
            remove_edges_of(txn, self.db["lineage_down"], self.db["lineage_up"], meta.name)
            add_edges(
                txn,
                self.db["lineage_down"],
                self.db["lineage_up"],
                meta.name,
                meta.version,
                meta.sources,
            )
            return MemoryView(meta, meta.version, meta.status, content, list(meta.sources))

        ring = RingRef(owner, ring_thread or None)
        return self.writer.run(WriteOp(apply, create_keys=[(ring, key_id)]))

    # ------------------------------------------------------------------ commitments

    def announce_due_commitments(self, now: float) -> int:
        """Emit ``COMMITMENT_DUE`` once for each committed ``OPEN`` commitment whose
        ``due_time`` has passed; returns how many are overdue now (announced or
        not): the ``lethe_overdue_commitments`` gauge. They stay at the top of
        every context assembly until closed (see :mod:`server._context`)."""

        def apply(txn: lmdb.Transaction) -> int:
            overdue = 0
            for raw_key, raw in txn.cursor(db=self.db["memories"]):
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
                txn.put(bytes(raw_key), meta.encode(), db=self.db["memories"])
                self._event(
                    txn,
                    meta.owner,
                    {"type": "COMMITMENT_DUE", "subject": meta.name, "sources": []},
                    now,
                )
            return overdue

        return self.writer.run(WriteOp(apply))

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
            for meta in self._owner_memory_metas(txn, owner):
                state = effective_state(meta, now)
                if meta.kind != "PREFERENCE" or state not in (PENDING, COMMITTED):
                    continue
                ct = txn.get(
                    memory_payload_key(meta.rid, meta.version, PAYLOAD_MEMORY),
                    db=self.db["mpayloads"],
                )
                rows.append((meta, None if ct is None else bytes(ct)))
        for meta, ct in rows:
            try:
                view = self.memory_view(meta, meta.version, ct)
            except RecordDeleted:
                continue
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
        raw = txn.get(owner.encode(), db=self.db["owners"])
        rec: dict[str, Any] = json.loads(bytes(raw)) if raw else {"dim": 0, "create_time": now}
        have = int(rec.get("dim") or 0)
        if have and have != dim:
            raise InvalidArgument(
                "memory.embedding",
                f"dimension {dim} differs from the owner's {have}",
                reason="DIMENSION_MISMATCH",
            )
        if not have:
            rec["dim"] = dim
            txn.put(owner.encode(), json.dumps(rec).encode(), db=self.db["owners"])

    def _put_memory(self, txn: lmdb.Transaction, meta: MemMeta) -> None:
        txn.put(rid_key(meta.rid), meta.encode(), db=self.db["memories"])

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
    ) -> MemoryView:
        """Write a new version of a memory (the version is the etag).

        With ``keep_embedding`` (neither text nor vector changed) the previous
        version's vector is carried over; otherwise ``draft.embedding`` is the
        new version's vector (the embedding follows the text).

        ``paths`` are the update-mask fields: text, slot, scope, edge, sources,
        due_time, embedding. Fields not named are carried over from the current
        version. A ``FACT`` or ``PREFERENCE`` update is a correction: the old
        version becomes ``SUPERSEDED`` (readable only by explicit version).

        Raises:
            NotFound / RecordDeleted: the memory. Aborted: ``expected_version``
            (when non-zero) is not current. FailedPrecondition: a new source is
            deleted, stale or sealed.
        """
        key_id = secrets.token_hex(8)
        with self.env.begin() as txn:
            current = self._mem_by_id(txn, owner, memory_id)
        if current is None or current.deleted:
            name = f"owners/{owner}/memories/{memory_id}"
            with self.env.begin() as txn:
                self._raise_missing(txn, name)
        sources = draft.sources if "sources" in paths else current.sources
        ring_thread = current.ring_thread
        if current.kind in SLOTTED_KINDS:
            self.ensure_slot_key(owner)

        def apply(txn: lmdb.Transaction) -> MemoryView:
            now = time.time()
            meta = self._mem_by_id(txn, owner, memory_id)
            if meta is None or meta.deleted or effective_state(meta, now) is None:
                raise RecordDeleted(f"owners/{owner}/memories/{memory_id} was deleted")
            if meta.state == SEALED:
                raise FailedPrecondition(
                    f"{meta.name} is sealed", reason="SEALED", subject=meta.name
                )
            if expected_version and expected_version != meta.version:
                raise Aborted(f"{meta.name} is at version {meta.version}, not {expected_version}")
            if meta.ring_thread != ring_thread:
                raise Aborted(f"{meta.name} changed concurrently; retry")
            for src, _ in meta.sources:  # no patching a derivative out of its lineage
                src_meta = self.resolve(txn, src)
                if src_meta is None or src_meta.tainted or effective_state(src_meta, now) is None:
                    raise FailedPrecondition(
                        f"source {src} is gone; rebuild {meta.name} instead of updating it",
                        reason="SOURCE_DELETED",
                        subject=src,
                    )
            old_ct = txn.get(
                memory_payload_key(meta.rid, meta.version, PAYLOAD_MEMORY), db=self.db["mpayloads"]
            )
            old = self.memory_view(meta, meta.version, None if old_ct is None else bytes(old_ct))
            content = MemoryContent(
                draft.content.text if "text" in paths else old.content.text,
                draft.content.slot if "slot" in paths else old.content.slot,
                draft.content.scope if "scope" in paths else old.content.scope,
                draft.content.edge if "edge" in paths else old.content.edge,
            )
            sources_state, sources_expiry = self._sources_window(txn, owner, sources, now)
            if meta.kind in SLOTTED_KINDS:
                self._claim_slot(txn, meta, content, now)
            remove_edges_of(txn, self.db["lineage_down"], self.db["lineage_up"], meta.name)
            if meta.kind in CORRECTED_KINDS:
                meta.superseded.append(meta.version)
            meta.supersedes = meta.version
            meta.version += 1
            meta.key_ids[str(meta.version)] = key_id
            meta.sources = list(sources)
            meta.update_time = now
            if "due_time" in paths:
                meta.due_time = draft.due_time
            if sources_state == PENDING and meta.state == COMMITTED:
                meta.state = PENDING  # a derivative is never more durable than its sources
            if meta.state == PENDING:
                txn.delete(expiry_key(meta.expire_time, meta.rid), db=self.db["expiry"])
                meta.expire_time = _earliest(now + pending_ttl, sources_expiry)
                txn.put(expiry_key(meta.expire_time, meta.rid), b"", db=self.db["expiry"])
            embedding = draft.embedding
            if keep_embedding and meta.has_embedding:
                old_vec = txn.get(
                    memory_payload_key(meta.rid, meta.version - 1, PAYLOAD_EMBEDDING),
                    db=self.db["mpayloads"],
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
            add_edges(
                txn,
                self.db["lineage_down"],
                self.db["lineage_up"],
                meta.name,
                meta.version,
                sources,
            )
            return MemoryView(meta, meta.version, meta.status, content, list(sources))

        ring = RingRef(owner, ring_thread or None)
        return self.writer.run(WriteOp(apply, create_keys=[(ring, key_id)]))

    def mark_pending_expiry(self, txn: lmdb.Transaction, meta: MemMeta) -> None:
        if meta.state == PENDING and meta.expire_time:
            txn.put(expiry_key(meta.expire_time, meta.rid), b"", db=self.db["expiry"])

    # ------------------------------------------------------------------ reads

    def get_memory(self, owner: str, memory_id: str, version: int) -> MemoryView:
        """Read the current version (``version`` 0) or an explicit one.

        Raises:
            NotFound: never existed, or no such version. RecordDeleted: deleted
            or expired. DataLoss: ciphertext fails authentication.
        """
        name = f"owners/{owner}/memories/{memory_id}"
        with self.env.begin() as txn:
            meta = self._mem_by_id(txn, owner, memory_id)
            if meta is None:
                self._raise_missing(txn, name)
            if effective_state(meta, time.time()) is None:
                raise RecordDeleted(f"{name} was deleted")
            if meta.state == SEALED:
                raise FailedPrecondition(f"{name} is sealed", reason="SEALED", subject=name)
            wanted = version or meta.version
            if str(wanted) not in meta.key_ids:
                raise NotFound(f"{name} has no version {wanted}")
            ct = txn.get(
                memory_payload_key(meta.rid, wanted, PAYLOAD_MEMORY), db=self.db["mpayloads"]
            )
        view = self.memory_view(meta, wanted, None if ct is None else bytes(ct))
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
    ) -> tuple[list[MemoryView], str]:
        """Current versions of an owner's memories by id, after id ``after``.

        Sealed, deleted and expired memories are never listed.
        """
        prefix = f"{owner}\x00".encode()
        start = prefix + after.encode() + b"\x01" if after else prefix
        now = time.time()
        rows: list[tuple[MemMeta, bytes | None]] = []
        more = False
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db["memory_ids"])
            if cur.set_range(start):
                for raw_key, rk in cur:
                    if not bytes(raw_key).startswith(prefix):
                        break
                    raw = txn.get(bytes(rk), db=self.db["memories"])
                    if raw is None:
                        continue
                    meta = MemMeta.decode(bytes(raw))
                    state = effective_state(meta, now)
                    if state is None or state == SEALED or state not in states:
                        continue
                    if (kinds and meta.kind not in kinds) or (
                        statuses and meta.status not in statuses
                    ):
                        continue
                    if len(rows) == limit:
                        more = True
                        break
                    ct = txn.get(
                        memory_payload_key(meta.rid, meta.version, PAYLOAD_MEMORY),
                        db=self.db["mpayloads"],
                    )
                    rows.append((meta, None if ct is None else bytes(ct)))
        views = []
        for meta, ct in rows:
            try:
                views.append(self.memory_view(meta, meta.version, ct))
            except RecordDeleted:
                continue
        return views, (rows[-1][0].memory_id if more and rows else "")

    def owner_memories(self, owner: str) -> list[MemMeta]:
        """Every stored memory of an owner (one read transaction)."""
        with self.env.begin() as txn:
            return self._owner_memory_metas(txn, owner)

    # ------------------------------------------------------------------ commit

    def commit_records(
        self, names: Sequence[str], include_sources: bool
    ) -> list[TurnMeta | MemMeta]:
        """Commit turns and memories in one transaction.

        A memory with a pending source fails with ``SOURCE_PENDING`` naming it,
        unless ``include_sources``, which commits those sources (transitively).

        Raises:
            NotFound / RecordDeleted: a record never existed / is gone.
            FailedPrecondition: ``SOURCE_PENDING``, or a record is sealed.
        """

        def apply(txn: lmdb.Transaction) -> list[TurnMeta | MemMeta]:
            now = time.time()
            out: list[TurnMeta | MemMeta] = []
            done: set[str] = set()

            def commit_one(name: str, explicit: bool) -> TurnMeta | MemMeta:
                meta = self.resolve(txn, name)
                if meta is None:
                    self._raise_missing(txn, name)
                state = effective_state(meta, now)
                if state is None or meta.tainted:
                    raise RecordDeleted(f"{name} was deleted")
                if state == SEALED:
                    raise FailedPrecondition(f"{name} is sealed", reason="SEALED", subject=name)
                if name in done or meta.state == COMMITTED:
                    return meta
                if isinstance(meta, MemMeta):
                    for src, _ in meta.sources:
                        src_meta = self.resolve(txn, src)
                        if (
                            src_meta is None
                            or src_meta.tainted
                            or effective_state(src_meta, now) is None
                        ):
                            raise FailedPrecondition(
                                f"source {src} was deleted", reason="SOURCE_DELETED", subject=src
                            )
                        if src_meta.state == PENDING:
                            if not include_sources:
                                raise FailedPrecondition(
                                    f"source {src} is pending; commit it first or set "
                                    "include_sources",
                                    reason="SOURCE_PENDING",
                                    subject=src,
                                )
                            commit_one(src, False)
                txn.delete(expiry_key(meta.expire_time, meta.rid), db=self.db["expiry"])
                meta.state = COMMITTED
                meta.expire_time = 0.0
                db = self.db["memories"] if isinstance(meta, MemMeta) else self.db["turns"]
                txn.put(rid_key(meta.rid), meta.encode(), db=db)
                done.add(name)
                if not explicit:
                    out.append(meta)
                return meta

            explicit = [commit_one(name, True) for name in names]
            return explicit + out

        return self.writer.run(WriteOp(apply))

    # ------------------------------------------------------------------ lineage

    def lineage(
        self, name: str, ancestors: bool, max_depth: int
    ) -> list[tuple[tuple[str, int], tuple[str, int]]]:
        """Edges reachable from ``name`` up (ancestors) or down (descendants),
        breadth first to ``max_depth``: ``((source, v), (derivative, v))``."""
        edges: list[tuple[tuple[str, int], tuple[str, int]]] = []
        seen = {name}
        frontier = [name]
        with self.env.begin() as txn:
            for _ in range(max_depth):
                nxt = []
                for node in frontier:
                    if ancestors:
                        for src, (sv, dv) in ancestors_of(txn, self.db["lineage_up"], node):
                            edges.append(((src, sv), (node, dv)))
                            if src not in seen:
                                seen.add(src)
                                nxt.append(src)
                    else:
                        for child, (sv, dv) in children_of(txn, self.db["lineage_down"], node):
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
        rids: list[int] = []
        vecs: list[npt.NDArray[np.float32]] = []
        with self.env.begin() as txn:
            cts = {
                m.rid: txn.get(
                    memory_payload_key(m.rid, m.version, PAYLOAD_EMBEDDING), db=self.db["mpayloads"]
                )
                for m in metas
                if m.has_embedding
            }
        for meta in metas:
            ct = cts.get(meta.rid)
            if ct is None:
                continue
            try:
                raw = self.open_memory(meta, meta.version, PAYLOAD_EMBEDDING, bytes(ct))
            except (RecordDeleted, DataLoss):
                continue
            rids.append(meta.rid)
            vecs.append(np.frombuffer(raw, dtype="<f4"))
        if not vecs:
            return [], np.zeros((0, 0), dtype=np.float32)
        return rids, np.vstack(vecs).astype(np.float32)
