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
(name, version) returned — is stored by the store (ids only) and returned; an
assistant turn that names it in ``context_manifest`` has those records as its
lineage. What may be offered at all (visibility) the store decides.

Thread rules: any thread (writes go through the store's writer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from server.retrieval._query import MODE_HYBRID, Retriever
from server.store import MemoryView, Store, TurnView, scope_chain

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
    committed = store.committed_memories(owner)
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
    chosen: list[TurnView] = []
    for turn_view in reversed(store.recent_turns(owner, thread, recent)):
        if fits(turn_view):  # newest first when the budget is short
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
    bundle.manifest_name = store.put_manifest(owner, thread, refs, now)
    return bundle
