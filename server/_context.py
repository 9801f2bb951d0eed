"""Context assembly (API.md, ``Retrieval.AssembleContext``) and context manifests.

A bundle holds, within ``max_chars`` (characters of text, default 8000):

1. open items: committed ``COMMITMENT`` ``OPEN`` (due ones first, by due
   time), ``OPEN_QUESTION`` ``OPEN``, ``PENDING_POINT`` ``PAUSED``, ``GOAL``
   ``ACTIVE``;
2. applicable preferences: per slot, the one :meth:`resolve_preference` picks;
3. the thread's recent turns (pending included; tainted, sealed, deleted and
   expired never);
4. relevant memories: a search over the owner's committed memories (current
   versions only: a superseded value never appears, however close it is);
5. the newest valid summaries, with their sources (provenance).

Items are taken in that order until the budget is spent. The manifest — every
(name, version) returned — is stored (``manifests`` database: ids only) and
returned; an assistant turn that names it in ``context_manifest`` has those
records as its lineage.

Thread rules: any thread (writes go through the store's writer).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import lmdb
import numpy as np
import numpy.typing as npt

from server._memories import MemoryView, scope_chain
from server._names import new_id
from server._records import COMMITTED, PAYLOAD_MEMORY, MemMeta, memory_payload_key
from server._search import MODE_HYBRID, Retriever
from server._store import Store, TurnView
from server._visibility import effective_state, listable
from server._writer import WriteOp
from server.errors import NotFound, RecordDeleted

DEFAULT_MAX_CHARS = 8000
DEFAULT_RECENT = 10
DEFAULT_TOP_K = 5
MAX_SUMMARIES = 3
_OPEN_ORDER = {"COMMITMENT": 1, "OPEN_QUESTION": 2, "PENDING_POINT": 3, "GOAL": 4}
_OPEN_STATUS = {
    "COMMITMENT": "OPEN",
    "OPEN_QUESTION": "OPEN",
    "PENDING_POINT": "PAUSED",
    "GOAL": "ACTIVE",
}


@dataclass
class ContextBundle:
    """What :func:`assemble` returns (before conversion to protobuf)."""

    manifest_name: str
    refs: list[tuple[str, int]]
    create_time: float
    recent_turns: list[TurnView] = field(default_factory=list)
    preferences: list[MemoryView] = field(default_factory=list)
    open_items: list[MemoryView] = field(default_factory=list)
    memories: list[tuple[MemoryView, float]] = field(default_factory=list)
    summaries: list[MemoryView] = field(default_factory=list)


def _text_len(view: TurnView | MemoryView) -> int:
    if isinstance(view, TurnView):
        return len(view.speaker) + len(view.text)
    return len(view.content.text)


def _committed_memories(store: Store, owner: str) -> list[MemoryView]:
    now = time.time()
    rows: list[tuple[MemMeta, bytes | None]] = []
    with store.env.begin() as txn:
        for meta in store._owner_memory_metas(txn, owner):
            if effective_state(meta, now) != COMMITTED or meta.tainted:
                continue
            ct = txn.get(
                memory_payload_key(meta.rid, meta.version, PAYLOAD_MEMORY), db=store.db["mpayloads"]
            )
            rows.append((meta, None if ct is None else bytes(ct)))
    out = []
    for meta, ct in rows:
        try:
            out.append(store.memory_view(meta, meta.version, ct))
        except RecordDeleted:
            continue
    return out


def assemble(
    store: Store,
    retriever: Retriever,
    owner: str,
    thread: str,
    query_text: str,
    query_vector: npt.NDArray[np.float32] | None,
    *,
    max_chars: int,
    recent: int,
    top_k: int,
    scope: str,
) -> ContextBundle:
    """Assemble one context bundle for a thread and store its manifest.

    Raises:
        NotFound / RecordDeleted: the thread.
    """
    now = time.time()
    store.get_thread(owner, thread)  # NOT_FOUND / RECORD_DELETED
    committed = _committed_memories(store, owner)
    budget = max_chars
    taken: set[str] = set()
    bundle = ContextBundle("", [], now)

    def fits(view: TurnView | MemoryView) -> bool:
        nonlocal budget
        size = _text_len(view)
        if size > budget:
            return False
        budget -= size
        return True

    open_items = [
        v
        for v in committed
        if v.meta.kind in _OPEN_ORDER and v.meta.status == _OPEN_STATUS[v.meta.kind]
    ]

    def open_key(v: MemoryView) -> tuple[int, float, float]:
        due = v.meta.due_time
        is_due = v.meta.kind == "COMMITMENT" and 0 < due <= now
        return (
            0 if is_due else _OPEN_ORDER[v.meta.kind],
            due if is_due else 0.0,
            -v.meta.update_time,
        )

    for view in sorted(open_items, key=open_key):
        if fits(view):
            bundle.open_items.append(view)
            taken.add(view.meta.name)
    chain = scope_chain(scope)
    rank = {s: i for i, s in enumerate(chain)}
    best: dict[str, MemoryView] = {}
    for view in committed:
        if view.meta.kind != "PREFERENCE" or (view.content.scope or "default") not in rank:
            continue
        slot = view.content.slot or view.meta.name
        key = (rank[view.content.scope or "default"], 1 if view.meta.origin == "INFERRED" else 0)
        have = best.get(slot)
        if have is None or key < (
            rank[have.content.scope or "default"],
            1 if have.meta.origin == "INFERRED" else 0,
        ):
            best[slot] = view
    for view in best.values():
        if fits(view):
            bundle.preferences.append(view)
            taken.add(view.meta.name)
    turns = [
        m
        for m in store.thread_turns(owner, thread)
        if listable(m, now, {"PENDING", "COMMITTED"}, include_tainted=False)
    ]
    recent_metas = turns[-recent:] if recent else []
    rows = store.fetch([m.rid for m in recent_metas], ("content",))
    chosen: list[TurnView] = []
    for meta in reversed(recent_metas):  # newest first when the budget is short
        row = rows.get(meta.rid)
        if row is None:
            continue
        try:
            turn_view = store.view_of(row[0], row[1])
        except RecordDeleted:
            continue
        if isinstance(turn_view, TurnView) and fits(turn_view):
            chosen.append(turn_view)
    bundle.recent_turns = list(reversed(chosen))
    if query_text.strip() or query_vector is not None:
        hits = retriever.search(
            owner, query_text, query_vector, top_k, None, mode=MODE_HYBRID, include_turns=False
        )
        for hit in hits:
            found = hit.view
            if (
                isinstance(found, MemoryView)
                and found.meta.name not in taken
                and found.meta.kind != "SUMMARY"
                and fits(found)
            ):
                bundle.memories.append((found, hit.score))
                taken.add(found.meta.name)
    summaries = sorted(
        (v for v in committed if v.meta.kind == "SUMMARY"), key=lambda v: -v.meta.update_time
    )
    for view in summaries[:MAX_SUMMARIES]:
        if view.meta.name not in taken and fits(view):
            bundle.summaries.append(view)
    refs: list[tuple[str, int]] = [(v.meta.name, v.version) for v in bundle.open_items]
    refs += [(v.meta.name, v.version) for v in bundle.preferences]
    refs += [(v.meta.name, v.meta.version) for v in bundle.recent_turns]
    refs += [(v.meta.name, v.version) for v, _ in bundle.memories]
    refs += [(v.meta.name, v.version) for v in bundle.summaries]
    bundle.refs = refs
    bundle.manifest_name = store_manifest(store, owner, thread, refs, now)
    return bundle


def store_manifest(
    store: Store, owner: str, thread: str, refs: list[tuple[str, int]], now: float
) -> str:
    """Store a manifest (ids and versions only) and return its name."""
    manifest_id = new_id()

    def apply(txn: lmdb.Transaction) -> None:
        body = {"refs": refs, "create_time": now, "thread": thread}
        txn.put(
            _manifest_key(owner, manifest_id), json.dumps(body).encode(), db=store.db["manifests"]
        )

    store.writer.run(WriteOp(apply))
    return f"owners/{owner}/manifests/{manifest_id}"


def get_manifest(store: Store, owner: str, manifest_id: str) -> dict[str, Any]:
    """A stored manifest: {refs, create_time, thread}.

    Raises:
        NotFound: no such manifest.
    """
    with store.env.begin() as txn:
        raw = txn.get(_manifest_key(owner, manifest_id), db=store.db["manifests"])
    if raw is None:
        raise NotFound(f"owners/{owner}/manifests/{manifest_id} not found")
    data: dict[str, Any] = json.loads(bytes(raw))
    data["refs"] = [tuple(r) for r in data["refs"]]
    return data


def _manifest_key(owner: str, manifest_id: str) -> bytes:
    return f"{owner}\x00{manifest_id}".encode()
