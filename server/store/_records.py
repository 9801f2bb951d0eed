"""Rows of the data environment: non-content metadata of records, and small JSON rows beside them.

The small rows are owners, tombstones, manifests and events.

Only ids, states, versions, times, key references and lineage names live
here, JSON-encoded; every client-supplied string except ids (text, speaker,
title) and every vector is sealed by ``shredder`` and stored separately in the
``payloads`` / ``mpayloads`` databases. Times are float seconds since the Unix
epoch (UTC). Which database holds which row: :mod:`server.store._schema`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from server.store import _json

# Storage states (lethe.v1.State value names).
PENDING = "PENDING"
COMMITTED = "COMMITTED"
SEALED = "SEALED"

# Thread kinds, and the states of a repair thread (lethe.v1.RepairInfo.State).
CONVERSATION = "CONVERSATION"
REPAIR = "REPAIR"
REPAIR_PAUSED = "PAUSED"
REPAIR_CONTINUED = "CONTINUED"
REPAIR_CONCLUDED = "CONCLUDED"

# Payload types: the payload_type of the associated data each ciphertext is
# bound to (their key codes are in :mod:`server.store._schema`).
# A turn's content (speaker and text) is one payload so that a search hit
# costs one AEAD open: 4-byte big-endian speaker length | speaker | text, UTF-8.
PAYLOAD_CONTENT = "content"
PAYLOAD_EMBEDDING = "embedding"
PAYLOAD_TITLE = "title"
PAYLOAD_MEMORY = "memory"  # JSON {text, slot, scope, edge: [s, p, o]} of one memory version


def _encode(row: Any) -> bytes:
    """Compact JSON of a slotted dataclass row, field by field.

    ``asdict`` deep-copies every list and dict first: it was a measurable part
    of every append.
    """
    names = _FIELD_NAMES.get(type(row))
    if names is None:
        names = _FIELD_NAMES[type(row)] = tuple(f.name for f in fields(row))
    return _json.dumps({n: getattr(row, n) for n in names})


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def pack_content(speaker: str, text: str) -> bytes:
    """The plaintext of a turn's content payload (layout above)."""
    spk = speaker.encode()
    return struct.pack(">I", len(spk)) + spk + text.encode()


def unpack_content(raw: bytes) -> tuple[str, str]:
    """``(speaker, text)`` from :func:`pack_content`'s output.

    Raises:
        ValueError: malformed (shorter than its length prefix says).
    """
    (size,) = struct.unpack_from(">I", raw)
    if 4 + size > len(raw):
        raise ValueError("malformed content payload")
    return raw[4 : 4 + size].decode(), raw[4 + size :].decode()


def stack_vectors(
    opened: Sequence[tuple[int, bytes]],
) -> tuple[list[int], npt.NDArray[np.float32]]:
    """``(rids, (n, d) float32)`` from decrypted embedding payloads; ``([], (0, 0))`` for none.

    Each payload is ``d`` ``<f4`` (little-endian float32) values.

    Raises:
        ValueError: the payloads differ in length (two dimensions in one owner).
    """
    if not opened:
        return [], np.zeros((0, 0), dtype=np.float32)
    size = len(opened[0][1])
    if any(len(raw) != size for _, raw in opened):
        raise ValueError("embedding payloads of different dimensions")
    flat = np.frombuffer(b"".join(raw for _, raw in opened), dtype="<f4")
    return [rid for rid, _ in opened], flat.reshape(len(opened), size // 4).astype(np.float32)


@dataclass(slots=True)
class ThreadMeta:
    """A thread's metadata; ``title_key`` is the key id of its sealed title.

    ``deleted`` is set by step 1 of a forget; the row is purged in step 4.
    """

    owner: str
    thread: str
    kind: str
    create_time: float
    update_time: float
    last_seq: int = 0
    title_key: str = ""
    deleted: bool = False
    # When a turn of this thread was last forgotten (0: never); summaries older
    # than this are stale (Audit).
    last_deletion_time: float = 0.0
    # Repair threads (kind REPAIR): the sealed source thread and first seq, the
    # repair's state (PAUSED, CONTINUED, CONCLUDED) and outcome.
    repair_source: str = ""
    repair_from_seq: int = 0
    repair_state: str = ""
    repair_outcome: str = ""
    # The thread's retention: when it and every turn of it expire (0: none).
    # Its turns carry it too (``retain_until``), as turns appended later do.
    expire_time: float = 0.0

    def encode(self) -> bytes:
        return _encode(self)

    @classmethod
    def decode(cls, raw: bytes) -> ThreadMeta:
        return cls(**_json.loads(raw))


@dataclass(slots=True)
class TurnMeta:
    """A turn's metadata (one row per turn; turns are immutable, version 1).

    ``rid`` is the internal 64-bit record number used as the FAISS id.
    ``key_id`` names the turn's record key in the thread's ring.
    ``expire_time`` is when reads stop seeing it: a pending turn's end of its
    pending window (or of its retention, if sooner), a committed turn's end of
    its retention (``retain_until``); 0 when neither applies (a sealed turn
    never expires). ``deleted`` is set by step 1 of a forget (the tombstone
    transaction) and the row is purged in step 4.
    """

    rid: int
    owner: str
    thread: str
    seq: int
    role: int
    state: str
    version: int
    time: float
    create_time: float
    expire_time: float
    key_id: str
    has_embedding: bool = False
    tainted: bool = False
    deleted: bool = False
    context_manifest: str = ""
    context_refs: list[tuple[str, int]] = field(default_factory=list)
    # The thread whose ring holds the record key: "" for the turn's own thread,
    # a repair thread's id once the turn is sealed into it.
    key_ring: str = ""
    # Set when PENDING_EXPIRING was announced for this turn.
    expiry_warned: bool = False
    # The earliest expire_time of a record in this turn's lineage when it was
    # written or a source's retention was set (0: none): from then on its
    # lineage is rechecked on read.
    lineage_expiry: float = 0.0
    # Its retention: the latest it may live once committed (0: none).
    retain_until: float = 0.0

    @property
    def name(self) -> str:
        return f"owners/{self.owner}/threads/{self.thread}/turns/{self.seq}"

    @property
    def ring_thread(self) -> str:
        """The thread id whose ring holds this turn's record key."""
        return self.key_ring or self.thread

    def encode(self) -> bytes:
        return _encode(self)

    @classmethod
    def decode(cls, raw: bytes) -> TurnMeta:
        data: dict[str, Any] = _json.loads(raw)
        data["context_refs"] = [tuple(ref) for ref in data.get("context_refs", [])]
        return cls(**data)


@dataclass(slots=True)
class MemMeta:
    """A memory's metadata (current version); non-content only.

    ``ring_thread`` names the ring its record keys live in: a thread id when
    every source belongs to that thread, "" for the owner's ring (roots and
    derivatives that span threads). ``key_ids`` maps each stored version
    (as a decimal string) to its record key id: one record key per version.
    ``sources`` are (name, version) of the current version's lineage.
    """

    rid: int
    owner: str
    memory_id: str
    kind: str
    state: str
    version: int
    status: str
    direction: str
    trigger: str
    origin: str
    create_time: float
    update_time: float
    expire_time: float
    ring_thread: str
    key_ids: dict[str, str] = field(default_factory=dict)
    sources: list[tuple[str, int]] = field(default_factory=list)
    has_embedding: bool = False
    deleted: bool = False
    tainted: bool = False
    due_time: float = 0.0
    supersedes: int = 0
    # Versions whose status is SUPERSEDED (corrections of FACT / PREFERENCE).
    superseded: list[int] = field(default_factory=list)
    # Set when PENDING_EXPIRING was announced for this memory.
    expiry_warned: bool = False
    # Hex keyed digest of (kind, slot, scope, origin) under the owner's slot
    # key: indexes the slot without its plaintext ("" when the memory has none).
    slot_digest: str = ""
    # (name, version) of the records that closed or advanced it (TransitionMemory).
    evidence: list[tuple[str, int]] = field(default_factory=list)
    # Set when COMMITMENT_DUE was announced for this (committed, open) commitment.
    due_announced: bool = False
    # As TurnMeta.lineage_expiry, for the current version's lineage.
    lineage_expiry: float = 0.0
    # As TurnMeta.retain_until (every version goes at once).
    retain_until: float = 0.0

    @property
    def name(self) -> str:
        return f"owners/{self.owner}/memories/{self.memory_id}"

    @property
    def thread(self) -> str:
        """The ring's thread ("" for the owner ring); turns and memories share this field."""
        return self.ring_thread

    @property
    def key_id(self) -> str:
        return self.key_ids[str(self.version)]

    def encode(self) -> bytes:
        return _encode(self)

    @classmethod
    def decode(cls, raw: bytes) -> MemMeta:
        data: dict[str, Any] = _json.loads(raw)
        data["sources"] = [tuple(ref) for ref in data.get("sources", [])]
        data["evidence"] = [tuple(ref) for ref in data.get("evidence", [])]
        return cls(**data)


RecordMeta = TurnMeta | MemMeta


@dataclass(slots=True)
class OwnerRow:
    """An owner's row: its fixed vector dimension and the embedder whose vectors it holds.

    The dimension is 0 before its first vector; the embedder "" is the one the
    store last recorded at start (see :mod:`server.store._vectors`).
    """

    dim: int = 0
    create_time: float = 0.0
    embedder: str = ""
    # The owner's default retention, seconds (0: none): a turn or memory
    # created from then on expires this long after its creation.
    retention: float = 0.0

    def encode(self) -> bytes:
        body: dict[str, Any] = {"dim": self.dim, "create_time": self.create_time}
        if self.embedder:
            body["embedder"] = self.embedder
        if self.retention:
            body["retention"] = self.retention
        return _json.dumps(body)

    @classmethod
    def decode(cls, raw: bytes) -> OwnerRow:
        data = _json.loads(raw)
        return cls(
            int(data.get("dim") or 0),
            float(data.get("create_time", 0.0)),
            str(data.get("embedder", "")),
            float(data.get("retention", 0.0)),
        )


@dataclass(slots=True)
class Tombstone:
    """What remains of a deleted record: time, reason, deletion id, and the last seq / version.

    The last seq / version is kept for threads and memories, so that an id used
    again continues the numbering and no (name, version) ever names two
    contents.
    """

    time: float
    reason: str
    deletion: str
    last_seq: int = 0
    last_version: int = 0

    def encode(self) -> bytes:
        body: dict[str, Any] = {"time": self.time, "reason": self.reason, "deletion": self.deletion}
        if self.last_seq:
            body["last_seq"] = self.last_seq
        if self.last_version:
            body["last_version"] = self.last_version
        return _json.dumps(body)

    @classmethod
    def decode(cls, raw: bytes) -> Tombstone:
        data = _json.loads(raw)
        return cls(
            float(data["time"]),
            str(data["reason"]),
            str(data["deletion"]),
            int(data.get("last_seq", 0)),
            int(data.get("last_version", 0)),
        )


@dataclass(slots=True)
class ManifestRow:
    """A context manifest: the (name, version) refs one assembly returned."""

    refs: list[tuple[str, int]]
    create_time: float
    thread: str

    def encode(self) -> bytes:
        body = {"refs": self.refs, "create_time": self.create_time, "thread": self.thread}
        return _json.dumps(body)

    @classmethod
    def decode(cls, raw: bytes) -> ManifestRow:
        data = _json.loads(raw)
        refs = [(str(n), int(v)) for n, v in data["refs"]]
        return cls(refs, float(data["create_time"]), str(data.get("thread", "")))


@dataclass(slots=True)
class EventRow:
    """One event (ids only).

    ``id`` is its decimal number within the store; ``receipt`` names the
    deletion receipt it belongs to, or is "".
    """

    id: str
    owner: str
    time: float
    type: str
    subject: str
    sources: list[tuple[str, int]] = field(default_factory=list)
    receipt: str = ""

    def encode(self) -> bytes:
        return _encode(self)

    @classmethod
    def decode(cls, raw: bytes) -> EventRow:
        data = _json.loads(raw)
        return cls(
            str(data["id"]),
            str(data["owner"]),
            float(data["time"]),
            str(data["type"]),
            str(data["subject"]),
            [(str(n), int(v)) for n, v in data.get("sources", [])],
            str(data.get("receipt", "")),
        )
