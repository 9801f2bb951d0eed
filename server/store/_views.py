"""What the store hands out and takes in: decrypted views of records, validated drafts of writes.

Plain dataclasses; no storage code.

Times are float seconds since the Unix epoch; vectors are ``(d,) float32``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from server.store import _json
from server.store._records import MemMeta, ThreadMeta, TurnMeta


@dataclass(slots=True)
class TurnDraft:
    """A validated turn to append.

    Attributes:
        embedding: ``(d,) float32`` finite vector, or None to let the server embed.
        pending_ttl: seconds a pending turn lives (ignored when ``commit``).
        time: when it was said, seconds since the epoch, or None for now.
    """

    role: int
    speaker: str
    text: str
    time: float | None
    embedding: npt.NDArray[np.float32] | None
    context_manifest: str
    context_refs: list[tuple[str, int]]
    commit: bool
    pending_ttl: float


@dataclass(slots=True)
class TurnView:
    """A readable turn: metadata plus decrypted content."""

    meta: TurnMeta
    text: str
    speaker: str
    embedding: npt.NDArray[np.float32] | None = None


@dataclass(slots=True)
class ThreadView:
    """A readable thread: metadata plus its decrypted title ("" when it has none)."""

    meta: ThreadMeta
    title: str


@dataclass(slots=True)
class MemoryContent:
    """The sealed part of one memory version (one JSON payload)."""

    text: str = ""
    slot: str = ""
    scope: str = ""
    edge: tuple[str, str, str] | None = None
    # Progress notes and closing notes of TransitionMemory, oldest first.
    notes: list[str] = field(default_factory=list)
    # The client's JSON object (``Memory.metadata``), or None when it set none.
    metadata: dict[str, Any] | None = None

    def encode(self) -> bytes:
        data: dict[str, Any] = {
            "text": self.text,
            "slot": self.slot,
            "scope": self.scope,
            "edge": list(self.edge) if self.edge else None,
            "notes": self.notes,
        }
        if self.metadata is not None:
            data["metadata"] = self.metadata
        return _json.dumps(data)

    @classmethod
    def decode(cls, raw: bytes) -> MemoryContent:
        """Raises: ValueError, KeyError or TypeError on a malformed payload."""
        data = _json.loads(raw)
        edge = data.get("edge")
        return cls(
            data["text"],
            data["slot"],
            data["scope"],
            tuple(edge) if edge else None,
            list(data.get("notes", [])),
            data.get("metadata"),
        )


@dataclass(slots=True)
class MemoryDraft:
    """A validated memory to create, or the fields of an update.

    Attributes:
        embedding: ``(d,) float32`` client vector, or None (the server embeds the text).
        due_time: seconds since the epoch, 0 for none.
        retention: how long a new memory may live, seconds from its creation
            (0: none but the owner's default); ignored by an update.
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
    retention: float = 0.0


@dataclass(slots=True)
class MemoryWrite:
    """One request of a batch of memory writes (``BatchUpdateMemories``).

    Attributes:
        memory_id: the memory's id (under the batch's owner).
        draft: as :meth:`server.store.Store.update_memory` takes it, or whole
            as :meth:`server.store.Store.create_memory` does with ``allow_missing``.
        paths: the update-mask fields (see ``update_memory``).
        expected_version: the etag, 0 for none.
        allow_missing: create the memory when no memory holds ``memory_id``.
        commit: a created memory is committed (else pending).
        keep_embedding: an update carries the current vector over (neither
            text nor vector changes).
    """

    memory_id: str
    draft: MemoryDraft
    paths: set[str]
    expected_version: int = 0
    allow_missing: bool = False
    commit: bool = False
    keep_embedding: bool = False


@dataclass(slots=True)
class MemoryView:
    """A readable memory version: metadata plus decrypted content."""

    meta: MemMeta
    version: int
    status: str
    content: MemoryContent
    sources: list[tuple[str, int]]


RecordView = TurnView | MemoryView
