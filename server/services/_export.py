"""``Lifecycle.ExportOwner``: everything of one owner its token may read, as a stream.

An async generator on the event loop (as ``Events.Watch``, :mod:`server.edge._edge`):
each page is read on a worker (:meth:`server.edge.StreamContext.run`) through the
store's own listings, so the export sees exactly what reads see — never an
expired, forgotten or (unless asked for) sealed record — and converted with the
same functions as every response. The order: the header; the threads; each
conversation thread's turns in seq order; with ``include_sealed`` each repair's
sealed stretch and own turns; the memories, every stored version oldest first
(sealed ones with ``include_sealed``); the receipts; the summary. The lineage
edges of each page's derivatives follow that page.

Thread rules: the generator runs on the event loop; the reads on workers.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from lethe.v1 import common_pb2, lifecycle_pb2
from server._names import parse_owner
from server.edge import StreamContext, authorize
from server.errors import NotFound
from server.services._convert import (
    memory_proto,
    receipt_proto,
    set_time,
    thread_proto,
    turn_proto,
)
from server.store import COMMITTED, PENDING, MemoryView, Store, TurnView

PAGE = 200
"""Records read per worker job (one read transaction each)."""
EDGE_CHUNK = 1000
"""Derivatives whose edges are read per worker job."""


def _derivatives(records: Sequence[TurnView | MemoryView]) -> list[str]:
    """Names of the records that have lineage (a response's context, a memory's sources)."""
    out = []
    for view in records:
        if isinstance(view, MemoryView):
            if view.sources:
                out.append(view.meta.name)
        elif view.meta.context_refs or view.meta.context_manifest:
            out.append(view.meta.name)
    return out


class _Export:
    """One export in progress: the owner, the store, the counts for the summary."""

    def __init__(self, store: Store, owner: str, include_sealed: bool, context: StreamContext):
        self.store = store
        self.owner = owner
        self.include_sealed = include_sealed
        self.context = context
        self.summary = lifecycle_pb2.ExportSummary()

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self.context.run(functools.partial(fn, *args, **kwargs))

    def item(self, **kwargs: Any) -> lifecycle_pb2.ExportItem:
        return lifecycle_pb2.ExportItem(**kwargs)

    async def edges(self, records: Sequence[TurnView | MemoryView]) -> list[Any]:
        names = _derivatives(records)
        out = []
        for i in range(0, len(names), EDGE_CHUNK):
            found = await self.run(self.store.lineage_edges, names[i : i + EDGE_CHUNK])
            for (source, sv), (derivative, dv) in found:
                out.append(
                    self.item(
                        edge=lifecycle_pb2.LineageEdge(
                            source=common_pb2.SourceRef(name=source, version=sv),
                            derivative=common_pb2.SourceRef(name=derivative, version=dv),
                        )
                    )
                )
        self.summary.edges += len(out)
        return out

    async def threads(self) -> tuple[list[Any], list[str], list[str]]:
        """``(thread items, conversation thread ids, repair thread ids)``."""
        items: list[Any] = []
        conversations: list[str] = []
        repairs: list[str] = []
        after = ""
        while True:
            page, after = await self.run(
                self.store.list_threads, self.owner, after, PAGE, self.include_sealed
            )
            for view in page:
                (repairs if view.meta.repair_source else conversations).append(view.meta.thread)
                items.append(self.item(thread=thread_proto(view)))
            self.summary.threads += len(page)
            if not after:
                return items, conversations, repairs

    async def turns_of(self, thread: str) -> AsyncIterator[list[Any]]:
        seq = 0
        while True:
            try:
                page, seq = await self.run(
                    self.store.list_turns,
                    self.owner,
                    thread,
                    seq,
                    PAGE,
                    states={PENDING, COMMITTED},
                    include_tainted=True,
                    with_embedding=False,
                )
            except NotFound:  # forgotten while the export ran (RecordDeleted is a NotFound)
                return
            self.summary.turns += len(page)
            yield [self.item(turn=turn_proto(v)) for v in page] + await self.edges(page)
            if not seq:
                return

    async def repair(self, repair_id: str) -> tuple[list[Any], list[str]]:
        """A repair's sealed stretch and own turns, and the ids of its sealed memories."""
        try:
            stretch, own, memories = await self.run(
                self.store.repair_contents, self.owner, repair_id
            )
        except NotFound:
            return [], []
        turns = [*stretch, *own]
        self.summary.turns += len(turns)
        items = [self.item(turn=turn_proto(v)) for v in turns] + await self.edges(turns)
        return items, [m.meta.memory_id for m in memories]

    async def memories(self, sealed: Sequence[str]) -> AsyncIterator[list[Any]]:
        def page_of(after: str) -> tuple[list[MemoryView], str]:
            current, nxt = self.store.list_memories(
                self.owner, after, PAGE, kinds=set(), states={PENDING, COMMITTED}, statuses=set()
            )
            versions = [
                v for c in current for v in self.store.memory_versions(self.owner, c.meta.memory_id)
            ]
            return versions, nxt

        def sealed_page(ids: Sequence[str]) -> tuple[list[MemoryView], str]:
            versions = [
                v
                for memory_id in ids
                for v in self.store.memory_versions(self.owner, memory_id, include_sealed=True)
            ]
            return versions, ""

        after = ""
        while True:
            versions, after = await self.run(page_of, after)
            yield await self.memory_items(versions)
            if not after:
                break
        for i in range(0, len(sealed), PAGE):
            versions, _ = await self.run(sealed_page, sealed[i : i + PAGE])
            yield await self.memory_items(versions)

    async def memory_items(self, versions: Sequence[MemoryView]) -> list[Any]:
        self.summary.memory_versions += len(versions)
        current = [v for v in versions if v.version == v.meta.version]
        return [self.item(memory=memory_proto(v)) for v in versions] + await self.edges(current)

    async def receipts(self) -> AsyncIterator[list[Any]]:
        after = ""
        while True:
            entries, after = await self.run(self.store.list_deletions, self.owner, after, PAGE)
            self.summary.receipts += len(entries)
            yield [self.item(receipt=receipt_proto(e, self.store.sign_receipt)) for e in entries]
            if not after:
                return


async def export_items(
    store: Store, request: lifecycle_pb2.ExportOwnerRequest, context: StreamContext
) -> AsyncIterator[lifecycle_pb2.ExportItem]:
    """The items of ``Lifecycle.ExportOwner``, in the order the module docstring gives.

    Raises:
        InvalidArgument: a malformed ``parent``.
        PermissionDenied: the token may not act for the owner.
    """
    owner = parse_owner(request.parent, "parent")
    authorize(owner)
    export = _Export(store, owner, request.include_sealed, context)
    header = lifecycle_pb2.ExportHeader(
        owner=f"owners/{owner}", store_id=store.store_id, include_sealed=request.include_sealed
    )
    set_time(header.export_time, time.time())
    yield export.item(header=header)
    threads, conversations, repairs = await export.threads()
    for item in threads:
        yield item
    for thread in conversations:
        async for items in export.turns_of(thread):
            for item in items:
                yield item
    sealed: list[str] = []
    for repair_id in repairs:
        items, memory_ids = await export.repair(repair_id)
        sealed.extend(memory_ids)
        for item in items:
            yield item
    async for items in export.memories(sealed):
        for item in items:
            yield item
    async for items in export.receipts():
        for item in items:
            yield item
    yield export.item(summary=export.summary)
