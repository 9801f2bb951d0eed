"""The items side of :mod:`lethe.langgraph`: a checked put, an item as read, a checked batch.

Plain data and pure functions, no calls: :class:`_Write` (a put ready to
send), :class:`_Found` (an item of the store as read, with its memory),
:func:`_rank` (LangGraph's vector ranking over listed items, as
``InMemoryStore`` ranks), :func:`chunks_of` (a batch's puts in calls) and
:class:`_Plan` (a batch's operations, its writes by name and the vectors
embedded for it).

Imports langgraph-checkpoint, the generated protobuf modules and the
standard library.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.store.base import Item, Op, SearchOp

from lethe._langgraph_values import from_value, similarity
from lethe.v1 import memories_pb2

META = "langgraph"
"""The key of an item's entry in its memory's ``metadata``."""
_RACE_TRIES = 24
"""Times a put is sent while a delete of its key completes (``RECORD_DELETED``)."""
_ADMISSION_TRIES = 20
"""Times a write is sent while the server refuses it at admission."""
_DEFAULT_ID_KEY = b"lethe.langgraph.v1"
"""The ids' HMAC key of a store made without ``id_key``."""
_UNINDEXED_TEXT = "(unindexed)"
"""The text of an item put with ``index=False``: a memory needs one; it holds
nothing of the value, and query searches skip the item."""
MAX_PAGE = 1000
"""Most memories one ``ListMemories`` page holds (the server's cap)."""
FIRST_PAGE = 32
"""Fewest memories the first page of a search without ``query`` asks for."""
PAGE_GROWTH = 4
"""How much larger each next page of such a search is than the one before."""


@dataclass(frozen=True, slots=True)
class _Write:
    """A checked put, ready to send: ``text`` None is a delete.

    ``embed``: the texts whose vectors go into ``metadata`` before it is sent
    (the store's ``index`` with ``embed``); empty otherwise.
    """

    name: str
    text: str | None
    metadata: dict[str, Any] | None
    ttl: float | None
    embed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Found:
    """An item of this store as read: the ``Item``, the memory, its metadata's fields."""

    item: Item
    memory: memories_pb2.Memory
    fields: Any  # the item's ``metadata`` entry: a map of str to ``google.protobuf.Value``

    @property
    def indexed(self) -> bool:
        """False for an item put with ``index=False``."""
        flag = self.fields.get("indexed")
        return flag is None or bool(from_value(flag))

    def vectors(self) -> list[list[float]]:
        """The item's embedded vectors (an ``index`` with ``embed``), decoded on demand."""
        found = self.fields.get("vectors")
        return [] if found is None else list(from_value(found))


def _rank(
    listed: list[_Found], query: list[float], offset: int, limit: int, distance: str = "cosine"
) -> list[tuple[_Found, float | None]]:
    """LangGraph's vector search over listed items, as ``InMemoryStore`` ranks.

    Each item scores the best similarity (``distance``: cosine by default)
    of the query with its vectors
    (one per embedded field text, max pooling); best first, ``offset`` and
    ``limit`` over the scored items, then items without vectors (put with
    ``index=False``, or before the store had an ``embed``) fill what is left
    of ``limit`` with score None.
    """
    scored: list[tuple[float, int, _Found]] = []
    scoreless: list[_Found] = []
    for i, found in enumerate(listed):
        vectors = found.vectors()
        if vectors:
            scored.append((max(similarity(query, v, distance) for v in vectors), i, found))
        else:
            scoreless.append(found)
    scored.sort(key=lambda s: (-s[0], s[1]))
    page: list[tuple[_Found, float | None]] = [
        (f, score) for score, _i, f in scored[offset : offset + limit]
    ]
    if len(page) < limit:
        page.extend((f, None) for f in scoreless[: limit - len(page)])
    return page


class _Plan:
    """A checked batch: its operations, its writes by name, and the vectors embedded for it."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.writes: dict[str, _Write] = {}
        self.query_vectors: dict[str, list[float]] = {}

    def texts(self) -> list[str]:
        """The distinct texts the puts need embedded, in first-seen order."""
        return list(dict.fromkeys(t for w in self.writes.values() for t in w.embed))

    def queries(self) -> list[str]:
        """The distinct query texts of the searches."""
        ops = self.ops
        return list(dict.fromkeys(o.query for o in ops if isinstance(o, SearchOp) and o.query))

    def embedded(self, docs: Mapping[str, list[float]], queries: Mapping[str, list[float]]) -> None:
        """Put each write's vectors into its metadata (``vectors``); keep the queries'."""
        for write in self.writes.values():
            if write.embed and write.metadata is not None:
                vectors = [[float(x) for x in docs[t]] for t in write.embed]
                write.metadata[META]["vectors"] = vectors
        self.query_vectors = dict(queries)


def _utc(ts: Any) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=_dt.UTC)


def _next_page(size: int, read: int, matched: int, wanted: int | None) -> int:
    """The size of a listing's next page, after ``read`` memories gave ``matched`` items.

    :data:`PAGE_GROWTH` times ``size``, at most :data:`MAX_PAGE`; when some
    matched and ``wanted`` items are wanted, no more than twice what the match
    rate so far says the rest needs (at least :data:`FIRST_PAGE`): a filter
    matching one item in five, 7 of 10 found in the first 32, asks for 32
    more rather than 128.
    """
    grown = min(MAX_PAGE, size * PAGE_GROWTH)
    if wanted is None or matched == 0 or read == 0:
        return grown
    needed = -(-2 * (wanted - matched) * read // matched)  # ceil(2 * rest / rate)
    return min(grown, max(FIRST_PAGE, needed))


def chunks_of(writes: Sequence[_Write], max_requests: int, max_bytes: int) -> list[list[_Write]]:
    """The puts by owner, in chunks of at most ``max_requests`` puts and ``max_bytes``.

    A put's size is its text's UTF-8 bytes plus its metadata's as JSON; a put
    larger than ``max_bytes`` is a chunk of its own. Within an owner the puts
    keep their order.
    """
    by_owner: dict[str, list[_Write]] = {}
    for write in writes:
        by_owner.setdefault(write.name.split("/")[1], []).append(write)
    chunks: list[list[_Write]] = []
    for group in by_owner.values():
        chunk: list[_Write] = []
        size = 0
        for write in group:
            cost = len((write.text or "").encode()) + len(json.dumps(write.metadata).encode())
            if chunk and (len(chunk) == max_requests or size + cost > max_bytes):
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append(write)
            size += cost
        if chunk:
            chunks.append(chunk)
    return chunks
