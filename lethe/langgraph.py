"""``LetheStore``: LangGraph's long-term memory interface on a Lethe server.

The interface is ``langgraph.store.base.BaseStore``.

Install the extra: ``pip install 'lethe-store-client[langgraph]'`` (or
``lethe-store[langgraph]``); it brings ``langgraph-checkpoint``, where
``BaseStore`` lives. Everything else is :mod:`lethe.client`.

The mapping
-----------

Owner
    A store serves one owner (``LetheStore(client, owner="alice")``): every
    namespace lives inside ``owners/alice``. With ``owner=None`` the first
    namespace label names the owner (``("alice", "memories")`` is the
    namespace ``("alice", "memories")`` inside ``owners/alice``), so one store
    serves every owner its token may act for; then ``search`` and
    ``list_namespaces`` need a prefix whose first label is that owner id, as
    no call spans owners. The namespace is kept whole either way, so
    ``("alice", "prefs")`` names the same item in both kinds of store.
Item → memory
    Each item is one committed memory of ``kind`` (default ``FACT``; every
    kind's memories are the owner's memory, found by ``Search`` and
    ``AssembleContext``). Its id is ``lg-`` and 40 hex digits of
    HMAC-SHA256 over the namespace and key (keyed by ``id_key``), so neither
    appears in the clear; they travel, with the value, in the memory's
    encrypted ``metadata`` (``{"langgraph": {"namespace": [...], "key": ...,
    "value": {...}}}``). Its ``text``, what Lethe indexes, is the value's
    ``fields`` (LangGraph's JSON paths, default ``"$"``: the whole value as
    JSON), at most 64 KiB. ``created_at`` / ``updated_at`` are the memory's
    ``create_time`` / ``update_time``.
``put``
    Commits: what is put is searchable when ``put`` returns. A second ``put``
    of the key is ``UpdateMemory``: a new version (a ``FACT``'s old version
    becomes ``SUPERSEDED``); ``created_at`` stays the first put's. A put is
    one call whatever wrote the key before (this store, another instance, or
    nobody): ``UpdateMemory`` with ``allow_missing``, which creates the
    memory when none holds its name and updates it otherwise, in one server
    transaction. While a concurrent delete is purging the key the server
    answers ``RECORD_DELETED`` and the put is sent again (backing off) until
    the purge is done, so a ``put`` racing a ``delete`` of its key lands after
    it instead of failing. A ``ttl`` on an update adds a ``SetRetention`` (see
    ``ttl`` below); on a creation it travels in the one call. A ``put`` is
    that one ``UpdateMemory``; the puts of a ``batch`` are sent together
    (``batch`` below).
``delete`` (and ``put`` of ``None``)
    Is a Lethe ``Forget``: the memory is tombstoned, everything derived from
    it goes too, its key is destroyed (crypto-shredding), and a receipt is
    kept. A later ``put`` of the key creates it again. The deletes of one
    ``batch`` are one ``Forget`` per owner (one receipt naming them all);
    when one of them is gone already, that ``Forget`` is refused whole and
    each is forgotten on its own (a receipt each). It looks for no echoes
    (``echoes: IGNORE``): a store's items are keys its caller manages, so
    deleting one never touches another item whose value repeats it, and a
    later ``put`` of the same value is accepted, as in ``InMemoryStore``. An
    echo guard that another ``Forget`` of the owner set still applies to a
    ``put`` (``EchoesForgotten``).
``search``
    Without ``query``: the owner's items under the prefix, filtered, in
    creation order, oldest first (an update keeps an item's place, a key
    deleted and put again comes last): within one namespace,
    ``InMemoryStore``'s insertion order. Namespaces and values are
    encrypted, so the server cannot narrow the listing: it lists the owner's
    memories in creation order (``ListMemories``, ``order_by="create_time"``)
    page by page (the first 32 items or twice ``offset + limit``, each next
    one sized from the match rate so far, at most 4 times larger and 1000),
    the prefix and filter are applied as each page arrives, and the listing
    stops once ``offset + limit`` items matched. So the cost grows with the
    items created before the last one returned: a filter matching early
    items reads a page or two (p50 6 ms at 10k items,
    ``bench/bench_langgraph.py``); a filter matching nothing, or a prefix
    whose items were created last, reads every item of the
    owner (p50 0.8 to 1.2 s at 10k items). With ``query`` and an ``index`` with
    ``embed`` (below): every item of the owner under the prefix, filtered,
    ranked by the cosine similarity of the query's vector and each item's
    (the best of its fields' vectors), as LangGraph's stores rank and score
    (so it reads every item, as ``list_namespaces`` does). With ``query``
    and no ``embed``: Lethe's ``Search`` (``HYBRID``: BM25 and dense, fused)
    over memories of ``kind``, best first, filtered after retrieval (at most
    1000 hits are examined, so a query whose matches rank below that returns
    fewer than ``limit``); ``score`` is Lethe's fused rank score, not a
    similarity (an exact match scores about 0.4). ``filter`` follows
    LangGraph's semantics: equality of nested values, and ``$eq``, ``$ne``,
    ``$gt``, ``$gte``, ``$lt``, ``$lte``.
``index``
    ``fields`` (LangGraph's JSON paths) choose the memory's text. With
    ``embed`` (and ``dims``) the store embeds on the client, as LangGraph's
    stores do: each put's texts at ``fields`` (or the put's ``index`` list)
    are embedded with ``embed_documents`` (``aembed_documents`` in
    ``abatch``), once per batch, before anything is sent, and the vectors
    travel in the item's encrypted metadata; a query is embedded with
    ``embed_query``. ``distance_type`` ``"inner_product"`` (the dot product)
    or ``"l2"`` (the negated Euclidean distance) scores as LangGraph's
    Postgres store does, instead of cosine similarity. The server still
    embeds the memory's text for Lethe's own ``Search`` and
    ``AssembleContext`` (its embedder need not match).
``index=False`` (at ``put``)
    The item is stored, got and listed, but holds no text to find: its
    memory's text is ``(unindexed)`` and query searches skip it (with an
    ``embed`` index it comes after the scored items with score None, as in
    ``InMemoryStore``).
``list_namespaces``
    Namespaces holding at least one item, with LangGraph's prefix / suffix
    conditions (``"*"`` matches any label), ``max_depth``, ``limit`` and
    ``offset``; sorted.
``batch``
    Every operation is checked first (labels, owner, keys, JSON values,
    ``ttl``), and the puts' texts are embedded (an ``index`` with ``embed``),
    as LangGraph's SQL stores do: a batch with one bad
    operation raises before any call is sent. Reads (get, search,
    list_namespaces) see the state before the batch's writes, and of several
    writes to one key the last wins, as in ``InMemoryStore``. The calls are
    pipelined on the one channel, at most ``PIPELINE_DEPTH`` (8) in flight:
    the reads, then the deletes, then the puts. The puts go per owner in
    chunks of at most 1000 (``MAX_BATCH_REQUESTS``) and about 4 MiB of text
    and metadata (``MAX_BATCH_BYTES``), each chunk one
    ``BatchUpdateMemories`` of ``UpdateMemory`` requests with
    ``allow_missing`` (written in one server transaction, all or none; a
    creation carries its ``ttl``), then one ``SetRetention`` per distinct
    ``ttl`` of the updated items (at most 1000 names each); a batch of one
    put is one ``UpdateMemory``. A chunk the server refuses for one of its
    puts (a put racing a delete of its key, ``RECORD_DELETED`` or
    ``ABORTED``; a value over the limits) wrote nothing: its puts are then
    sent one ``UpdateMemory`` each, as a lone ``put`` is, so the race and
    the refusal behave as for single puts. A write the
    server refuses at admission (``TooManyRequests``: the token's bound on
    calls in flight, which other users of the token share) is sent again
    after the refusal's ``RetryInfo`` delay, for about 10 s; a write the
    server refuses otherwise (``BadField``, ``OwnerNotAllowed``) raises
    after the batch's other writes were applied. ``abatch`` awaits the embedding, then
    sends the calls from the event loop's default executor (the blocking
    client is thread-safe). The puts of one chunk share one ``created_at``
    (one transaction); an owner's chunks are sent one after another, so the
    puts are created in the batch's order (the order a search without
    ``query`` lists them in), except the puts of a refused chunk, sent again
    on their own and concurrently.

Differences from ``InMemoryStore`` (each tested in
``tests/lethe/test_langgraph.py``)
    - values are JSON: they travel as a ``google.protobuf.Struct``, so a number
      is a double (an integer beyond ±2**53 loses precision; an integral float
      such as ``2.0`` comes back as the int ``2``), a tuple comes back as a
      list, and a value JSON cannot hold (bytes, sets, datetimes, NaN) is
      refused with ``TypeError`` or ``ValueError`` at ``put``;
    - ``created_at`` survives updates (``InMemoryStore`` resets it);
    - a search with ``query`` is ranked by Lethe's own retrieval, where
      ``InMemoryStore`` without an index ignores the query and returns
      insertion order with ``score`` None; a search over several namespaces
      without ``query`` is in creation order across them (``InMemoryStore``
      groups by namespace, each in insertion order); within one namespace
      the two orders are the same (an update keeps an item's place, a key
      deleted and put again comes last; a key written twice in one
      ``batch`` keeps the place of its first write, its last write winning);
    - ``list_namespaces`` lists only namespaces holding an item
      (``InMemoryStore`` also lists namespaces that were only read, or
      emptied by deletes).

``ttl`` (minutes, ``put``'s or the store's ``TTLConfig`` ``default_ttl``)
    Is the memory's retention (``Lifecycle.SetRetention``; on a new item
    ``UpdateMemory``'s ``retention``, in the same call): once it ends every
    read treats the item as deleted — ``get`` returns None, ``search`` and
    ``list_namespaces`` skip it — at once, and the server's sweeper then
    forgets it with a receipt (reason ``RETENTION``), its key destroyed. A
    ``put`` without ``ttl`` of an item that had one removes it. Reads with
    ``refresh_ttl`` (``TTLConfig`` ``refresh_on_read``, on by default) give
    the items they return their ``ttl`` again from now. The ``ttl`` travels in
    the item's encrypted metadata.

Limits, with a clear error, never silently
    - values or texts over Lethe's limits raise :class:`lethe.client.BadField`
      (an item's vectors count towards its metadata's size);
    - a ``put`` of a key whose ``ttl`` ended, before the server's sweeper
      has forgotten it, raises :class:`lethe.client.RecordDeleted` after
      about 2 s of retries (the expired memory holds its id until then);
    - a ``put`` of a key whose memory a store of another ``kind`` wrote
      raises :class:`lethe.client.BadField` (a memory's kind is immutable).

LangGraph's own store tests (``langgraph-checkpoint``'s ``tests/test_store.py``
unchanged, and the SQLite and Postgres stores' with their fixtures adapted,
fetched from their sdists at test time) run against this store on a real
server: ``tests/langgraph_suite/``; docs/api-guide.md lists what fails, and why.

Errors of the server surface as :mod:`lethe.client` errors (a token not
allowed for the owner raises :class:`lethe.client.OwnerNotAllowed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    get_text_at_path,
    tokenize_path,
)
from langgraph.store.base.embed import ensure_embeddings

from lethe._langgraph_items import (
    _ADMISSION_TRIES,
    _DEFAULT_ID_KEY,
    _RACE_TRIES,
    _UNINDEXED_TEXT,
    FIRST_PAGE,
    MAX_PAGE,
    _Found,
    _next_page,
    _Plan,
    _rank,
    _utc,
    _Write,
    chunks_of,
)
from lethe._langgraph_items import META as _META
from lethe._langgraph_values import (
    check_labels,
    condition_holds,
    from_value,
    matches_filter,
    similarity,
    truncate,
)
from lethe.client import (
    Aborted,
    AlreadyExists,
    Client,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RecordDeleted,
    TooManyRequests,
)
from lethe.names import ID_RE
from lethe.v1 import memories_pb2

__all__ = ["LetheStore"]

MAX_TEXT_BYTES = 64 * 1024
"""Largest indexed text of an item (UTF-8 bytes): Lethe's limit on a memory's text."""
SEARCH_WINDOW = 1000
"""Most hits one query search examines (Lethe's ``top_k`` ceiling)."""
PIPELINE_DEPTH = 8
"""Most calls one ``batch`` keeps in flight: half the server's default per-token
bound on calls in flight (``max_inflight_per_principal``, 16), so that the
token's other calls still get in."""
MAX_BATCH_REQUESTS = 1000
"""Most puts one ``BatchUpdateMemories`` call carries (the server's bound)."""
MAX_BATCH_BYTES = 4 * 1024 * 1024
"""Most bytes of texts and metadata (as JSON) one ``BatchUpdateMemories`` call
carries: a quarter of the server's default message bound (16 MiB), leaving room
for the ``Struct`` encoding and the reply, which echoes every memory."""
_REFUSED = (NotFound, Aborted, InvalidArgument, AlreadyExists, FailedPrecondition)
"""A batch call refused for one of its puts: each put of the chunk is sent on its own."""
_T = TypeVar("_T")
_R = TypeVar("_R")


class LetheStore(BaseStore):
    """A LangGraph ``BaseStore`` whose items are Lethe memories (see the module docstring).

    Use it wherever LangGraph takes a store (``graph.compile(store=...)``,
    ``create_react_agent(..., store=...)``), or directly (``put``, ``get``,
    ``search``, ``delete``, ``list_namespaces`` and their ``a``-prefixed
    coroutines).
    """

    supports_ttl = True

    def __init__(
        self,
        client: Client | None = None,
        *,
        target: str | None = None,
        token: str | None = None,
        owner: str | None = None,
        kind: str = "FACT",
        fields: Sequence[str] = ("$",),
        id_key: bytes | None = None,
        index: Mapping[str, Any] | None = None,
        ttl: Mapping[str, Any] | None = None,
        **client_options: Any,
    ) -> None:
        """Bind the store to a client and an owner.

        Args:
            client: a :class:`lethe.client.Client`; the store does not close it.
            target: ``HOST:PORT``, to build a client (with ``token``) instead.
            token: the bearer token, with ``target``.
            owner: the owner id every namespace lives in, or None to read the
                owner id from each namespace's first label.
            kind: the ``Memory.Kind`` name of the items' memories.
            fields: JSON paths of a value whose text Lethe indexes (LangGraph's
                ``index["fields"]``); ``"$"`` is the whole value.
            id_key: secret key (at least 16 bytes) of the ids' HMAC; without
                it the ids are an unkeyed digest, which someone who guesses a
                namespace and key could confirm (ids are not encrypted). Keep
                it: another key addresses other ids.
            index: LangGraph's index config: ``fields`` (it overrides
                ``fields``) and, optionally, ``embed`` (an ``Embeddings``, a
                function, or a ``"provider:model"`` string, as LangGraph's
                ``ensure_embeddings`` takes) with ``dims``: then each put's
                fields are embedded on the client and query searches are
                ranked by cosine similarity (``distance_type``
                ``"inner_product"`` or ``"l2"``, as LangGraph's Postgres
                store takes, score otherwise; the module docstring, "index").
            ttl: LangGraph's ``TTLConfig``: ``default_ttl`` (minutes) for puts
                that give none, ``refresh_on_read`` (default True);
                ``sweep_interval_minutes`` is the server's business (its
                ``--sweep-interval``) and is ignored.
            **client_options: more :class:`lethe.client.Client` arguments, with ``target``.

        Raises:
            ValueError: neither ``client`` nor ``target`` and ``token`` (or
                both); an owner that is not a Lethe id; an unknown kind; an
                ``id_key`` shorter than 16 bytes.
            ValueError: ``index`` with ``dims`` but no ``embed``; an unknown
                ``distance_type``.
        """
        if (client is None) == (target is None):
            raise ValueError("give either a client or target and token")
        if client is None:
            if not token:
                raise ValueError("target needs a token")
            client = Client(str(target), token, **client_options)
            self._owns_client = True
        else:
            self._owns_client = False
        if owner is not None and not ID_RE.fullmatch(owner):
            raise ValueError(f"owner {owner!r} is not a Lethe id ([a-z0-9][a-z0-9-]{{0,62}})")
        if (
            kind not in memories_pb2.Memory.Kind.DESCRIPTOR.values_by_name
            or kind == "KIND_UNSPECIFIED"
        ):
            raise ValueError(f"unknown memory kind {kind!r}")
        if id_key is not None and len(id_key) < 16:
            raise ValueError("id_key must be at least 16 bytes")
        self.index_config: dict[str, Any] | None = None
        self.embeddings: Any = None
        if index is not None:
            fields = index.get("fields") or fields
            if index.get("embed") is not None:
                self.index_config = dict(index)
                self.embeddings = ensure_embeddings(index["embed"])
                similarity([1.0], [1.0], index.get("distance_type") or "cosine")  # known?
            elif index.get("dims") is not None:
                raise ValueError("an index with dims needs embed (or give only fields)")
        self.client = client
        self.owner = owner
        self.kind = kind
        self.fields = tuple(fields)
        self._paths = [(p, tokenize_path(p) if p != "$" else p) for p in self.fields]
        self._id_key = id_key or _DEFAULT_ID_KEY
        self.ttl_config = dict(ttl) if ttl is not None else None  # type: ignore[assignment]
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # -- lifetime -----------------------------------------------------------------------

    def close(self) -> None:
        """End the store's pipeline threads; close the client if this store built it."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> LetheStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the mapping ------------------------------------------------------------------

    def _owner_of(self, namespace: Sequence[str]) -> str:
        if self.owner is not None:
            return self.owner
        if not namespace or not ID_RE.fullmatch(namespace[0]):
            raise InvalidNamespaceError(
                f"namespace {tuple(namespace)} must start with a Lethe owner id "
                "([a-z0-9][a-z0-9-]{0,62}) when the store has no owner"
            )
        return namespace[0]

    def memory_name(self, namespace: Sequence[str], key: str) -> str:
        """The Lethe resource name of an item: ``owners/{owner}/memories/lg-<40 hex>``.

        Raises:
            InvalidNamespaceError: a bad label, or no owner label when the store has no owner.
        """
        check_labels(namespace)
        owner = self._owner_of(namespace)
        address = json.dumps([list(namespace), key], ensure_ascii=False, separators=(",", ":"))
        digest = hmac.new(self._id_key, address.encode(), hashlib.sha256).hexdigest()
        return f"owners/{owner}/memories/lg-{digest[:40]}"

    def _text(self, value: Mapping[str, Any], index: list[str] | None) -> str:
        paths = self._paths if index is None else [(p, tokenize_path(p)) for p in index]
        texts: list[str] = []
        for _path, tokens in paths:
            if tokens == "$":
                texts.append(json.dumps(value, ensure_ascii=False))
            else:
                texts.extend(get_text_at_path(value, tokens))
        text = "\n".join(t for t in texts if t.strip())
        if not text.strip():  # nothing at the fields: index the whole value
            text = json.dumps(value, ensure_ascii=False)
        return truncate(text, MAX_TEXT_BYTES)

    def _item(
        self,
        memory: memories_pb2.Memory,
        prefix: tuple[str, ...] = (),
        flt: Mapping[str, Any] | None = None,
    ) -> _Found | None:
        """The item a memory holds, if it is one of this store's under ``prefix`` passing ``flt``.

        The namespace is checked before the value is decoded, the filter before
        the name is checked (an HMAC) and the ``Item`` built: a listing decodes
        little of what it skips.
        """
        if not memory.HasField("metadata"):
            return None
        entry = memory.metadata.fields.get(_META)
        if entry is None or entry.WhichOneof("kind") != "struct_value":
            return None
        fields = entry.struct_value.fields
        raw = fields.get("namespace")
        namespace = tuple(str(label) for label in from_value(raw) or ()) if raw else ()
        if namespace[: len(prefix)] != prefix:
            return None
        raw = fields.get("value")
        value = from_value(raw) if raw is not None else None
        if not isinstance(value, dict) or not matches_filter(value, flt):
            return None
        raw = fields.get("key")
        key = str(from_value(raw)) if raw is not None else ""
        if memory.name != self.memory_name(namespace, key):
            return None  # another store's item (other id_key or owner mode), or not ours
        item = Item(
            value=value,
            key=key,
            namespace=namespace,
            created_at=_utc(memory.create_time),
            updated_at=_utc(memory.update_time),
        )
        return _Found(item, memory, fields)

    # -- operations --------------------------------------------------------------------

    def _ttl(self, memory: memories_pb2.Memory) -> float | None:
        """The LangGraph ``ttl`` (minutes) an item was put with, or None."""
        if not memory.HasField("metadata") or _META not in memory.metadata.fields:
            return None
        data = memory.metadata.fields[_META]
        ttl = data.struct_value.fields.get("ttl") if data.HasField("struct_value") else None
        return ttl.number_value if ttl is not None and ttl.HasField("number_value") else None

    def _refresh(self, memories: Iterable[memories_pb2.Memory]) -> None:
        """Give items just read their ``ttl`` again from now (LangGraph's refresh on read)."""
        by_ttl: dict[float, list[str]] = {}
        for memory in memories:
            ttl = self._ttl(memory)
            if ttl:
                by_ttl.setdefault(ttl, []).append(memory.name)
        for ttl, names in by_ttl.items():
            for i in range(0, len(names), 1000):
                with contextlib.suppress(NotFound):  # deleted meanwhile: nothing to refresh
                    self._admitted(self.client.set_retention, names[i : i + 1000], ttl=ttl * 60)

    def _get(self, op: GetOp) -> Item | None:
        name = self.memory_name(op.namespace, op.key)
        try:
            memory = self.client.get_memory(name)
        except NotFound:  # never existed, or deleted (RecordDeleted), or expired
            return None
        found = self._item(memory)
        if found is not None and getattr(op, "refresh_ttl", False):
            self._refresh([memory])
        return None if found is None else found.item

    def _prepare(self, op: PutOp) -> _Write:
        """Check a put whole and build what it writes; nothing is sent.

        Raises:
            InvalidNamespaceError: an empty namespace, a bad label, or no owner
                label when the store has no owner.
            TypeError / ValueError: a value JSON cannot hold; a ``ttl`` that is
                not positive.
        """
        check_labels(op.namespace)
        if not op.namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        if not isinstance(op.key, str):
            raise TypeError(f"key must be a string, not {type(op.key).__name__}")
        name = self.memory_name(op.namespace, op.key)
        if op.value is None:
            return _Write(name, None, None, None)
        value = dict(op.value)
        json.dumps(value, allow_nan=False)  # TypeError / ValueError for non-JSON values
        item: dict[str, Any] = {"namespace": list(op.namespace), "key": op.key, "value": value}
        if op.ttl is not None:
            if op.ttl <= 0:
                raise ValueError("ttl must be positive (minutes)")
            item["ttl"] = float(op.ttl)
        if op.index is False:
            item["indexed"] = False
            return _Write(name, _UNINDEXED_TEXT, {_META: item}, op.ttl)
        paths = op.index if isinstance(op.index, list) else None
        text = self._text(value, paths)
        embed: tuple[str, ...] = ()
        if self.embeddings is not None:
            tokenized = self._paths if paths is None else [(p, tokenize_path(p)) for p in paths]
            embed = tuple(t for _p, tokens in tokenized for t in get_text_at_path(value, tokens))
        return _Write(name, text, {_META: item}, op.ttl, embed)

    def _write(self, write: _Write) -> None:
        """Apply one prepared put: one upsert, sent again while a delete of the key completes.

        The server answers ``RECORD_DELETED`` while a deleted (or expired)
        memory still holds the key's id; a delete racing the put is purged
        within its ``Forget``, so the put lands once that has returned. It
        answers ``ABORTED`` when the id changed hands under it several times
        in a row (puts and deletes of the key racing): sent again too.

        Raises:
            lethe.client.RecordDeleted: still so after about 2 s (an expired
                item whose id the server's sweeper has not freed yet).
            lethe.client.LetheError: any other refusal of the server.
        """
        for attempt in range(_RACE_TRIES):
            try:
                self._upsert(write)
                return
            except (RecordDeleted, Aborted):  # no etag is sent: never VersionMismatch
                if attempt == _RACE_TRIES - 1:
                    raise
                time.sleep(min(0.001 * 2**attempt, 0.1))

    def _admitted(self, call: Callable[..., _R], *args: Any, **kwargs: Any) -> _R:
        """A write call, sent again while the server refuses it at admission.

        The server refuses a call past its per-token bound on calls in flight
        (``TooManyRequests``) before it does anything, so sending it again is
        safe for a write too (the client retries only reads on its own). The
        wait is the refusal's ``RetryInfo`` delay, else 10 ms doubling, at
        most 1 s each, for about 10 s in all.

        Raises:
            lethe.client.TooManyRequests: still refused after :data:`_ADMISSION_TRIES`.
        """
        for attempt in range(_ADMISSION_TRIES):
            try:
                return call(*args, **kwargs)
            except TooManyRequests as refused:
                if attempt == _ADMISSION_TRIES - 1:
                    raise
                time.sleep(min(refused.retry_delay or 0.01 * 2**attempt, 1.0))
        raise AssertionError("unreachable")  # the last attempt returned or raised

    def _request(self, write: _Write) -> dict[str, Any]:
        """The ``UpdateMemoryRequest`` (as a mapping) that creates or updates a put's item."""
        memory = {
            "name": write.name,
            "kind": self.kind,
            "text": write.text,
            "metadata": write.metadata,
            "state": "COMMITTED",
        }
        return {
            "memory": memory,
            "update_mask": ["text", "metadata"],
            "allow_missing": True,
            "retention": write.ttl * 60 if write.ttl is not None else None,
        }

    def _upsert(self, write: _Write) -> None:
        """Create or update an item in one call, and its retention as ``write.ttl`` (minutes) says.

        A creation takes its retention in the same call; an update that must
        set or clear one adds a ``SetRetention``.

        Raises:
            RecordDeleted: a deleted or expired memory still holds the item's id.
        """
        request = self._request(write)
        memory = request.pop("memory")
        updated = self._admitted(self.client.update_memory, memory, **request)
        self._retain([(write, updated)])

    def _retain(self, written: Sequence[tuple[_Write, memories_pb2.Memory]]) -> None:
        """Give updated items the retention their puts ask for (a creation has it already).

        One ``SetRetention`` per distinct ``ttl`` (at most 1000 names each)
        for the updates with a ``ttl``; an update without one whose memory
        expires is cleared when an earlier put of this store gave it a ``ttl``
        (an owner's default retention is kept), one item at a time.
        """
        by_ttl: dict[float, list[str]] = {}
        for write, updated in written:
            if updated.create_time == updated.update_time:
                continue  # created, with its retention
            if write.ttl is not None:
                by_ttl.setdefault(write.ttl, []).append(updated.name)
            elif updated.HasField("expire_time"):
                # It expires: by this store's ttl of an earlier put (removed now, as
                # a put without ttl asks), or by the owner's default (kept).
                earlier = self.client.get_memory(updated.name, version=updated.version - 1)
                if self._ttl(earlier):
                    self._admitted(self.client.set_retention, [updated.name], clear=True)
        for ttl, names in by_ttl.items():
            for i in range(0, len(names), MAX_BATCH_REQUESTS):
                chunk = names[i : i + MAX_BATCH_REQUESTS]
                self._admitted(self.client.set_retention, chunk, ttl=ttl * 60)

    def _put_all(self, writes: Sequence[_Write]) -> None:
        """Apply a batch's puts: one ``BatchUpdateMemories`` per chunk of an owner's puts.

        The chunks (:func:`~lethe._langgraph_items.chunks_of`) of one owner
        are sent one after another, so its puts are created in the batch's
        order; owners' chunks are
        pipelined, at most ``PIPELINE_DEPTH`` owners in flight. A chunk of one
        put, and a batch of one, is :meth:`_write`
        (``UpdateMemory``). A chunk the server refuses for one of its puts
        (``_REFUSED``: a put racing a delete of its key, a value over the
        limits, …) wrote nothing; each of its puts is then sent on its own
        (:meth:`_write`), after the other chunks, so a put racing a delete
        lands after it and the refused put alone raises, as before.

        Raises:
            lethe.client.LetheError: the first refusal (in chunk order), once
                every chunk and every put sent on its own has finished.
        """
        if len(writes) <= 1:
            self._run_all(self._write, writes)
            return
        refused: list[list[_Write]] = []

        def send(chunk: list[_Write]) -> None:
            if len(chunk) == 1:
                self._write(chunk[0])
                return
            owner = chunk[0].name.split("/")[1]
            try:
                written = self._admitted(
                    self.client.batch_update_memories,
                    f"owners/{owner}",
                    [self._request(w) for w in chunk],
                )
            except _REFUSED:
                refused.append(chunk)
                return
            self._retain(list(zip(chunk, written, strict=True)))

        def send_in_order(chunks: list[list[_Write]]) -> None:
            first: Exception | None = None
            for chunk in chunks:  # one after another: created in the batch's order
                try:
                    send(chunk)
                except Exception as exc:  # the owner's other chunks are still sent
                    first = first or exc
            if first is not None:
                raise first

        by_owner: dict[str, list[list[_Write]]] = {}
        for chunk in chunks_of(writes, MAX_BATCH_REQUESTS, MAX_BATCH_BYTES):
            by_owner.setdefault(chunk[0].name.split("/")[1], []).append(chunk)
        error: BaseException | None = None
        try:
            self._run_all(send_in_order, list(by_owner.values()))
        except Exception as exc:  # raised once the refused chunks' puts are sent too
            error = exc
        self._run_all(self._write, [w for chunk in refused for w in chunk])
        if error is not None:
            raise error

    def _delete(self, names: Sequence[str]) -> None:
        """Forget items, in one ``Forget`` per owner when every name is live.

        A name that is gone (never put, or deleted meanwhile) makes the whole
        ``Forget`` refuse with nothing deleted; then each name is forgotten on
        its own, the gone ones skipped.
        """
        by_owner: dict[str, list[str]] = {}
        for name in names:
            by_owner.setdefault(name.split("/")[1], []).append(name)

        def forget(group: list[str]) -> None:
            self._admitted(self.client.forget, group, reason="langgraph delete", echoes="IGNORE")

        def forget_each(name: str) -> None:
            with contextlib.suppress(NotFound):  # nothing to delete: never put, or gone
                forget([name])

        for group in by_owner.values():
            try:
                forget(group)
            except NotFound:
                if len(group) > 1:
                    self._run_all(forget_each, group)

    def _run_all(self, fn: Callable[[_T], None], items: Sequence[_T]) -> None:
        """Call ``fn`` on each of ``items``, at most ``PIPELINE_DEPTH`` at once.

        Every call finishes before the first error (in ``items`` order) is raised.
        """
        if len(items) <= 1:
            for item in items:
                fn(item)
            return
        futures = [self._executor().submit(fn, item) for item in items]
        errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(PIPELINE_DEPTH, thread_name_prefix="lethe-store")
            return self._pool

    def _owner_items(
        self,
        owner: str,
        prefix: tuple[str, ...] = (),
        flt: Mapping[str, Any] | None = None,
        wanted: int | None = None,
    ) -> list[_Found]:
        """The items of this store in ``owner`` under ``prefix`` passing ``flt``, oldest first.

        The owner's committed memories of ``kind`` are listed in creation
        order (``ListMemories`` ``order_by="create_time"``: an update keeps an
        item's place) and decrypted by the server page by page; only those
        under ``prefix`` have their value decoded.

        Args:
            owner: the owner id.
            prefix: namespace labels the items start with.
            flt: LangGraph's ``filter`` (None: every item).
            wanted: stop once this many items matched (None: read every page).
                The first page is :data:`FIRST_PAGE` or twice ``wanted``
                memories, each next one :data:`PAGE_GROWTH` times larger (or
                less, :func:`_next_page`), at most the server's 1000: a search
                whose matches come early reads little, one whose matches come
                late or never reads every item.

        Returns:
            The matching items in creation order, at most ``wanted``, each key
            once (a key deleted and put again while the pages are read is
            listed again at the end: its first listing is kept).
        """
        out: list[_Found] = []
        if wanted is not None and wanted <= 0:
            return out
        size = MAX_PAGE if wanted is None else min(MAX_PAGE, max(FIRST_PAGE, 2 * wanted))
        token = ""
        read = 0
        seen: set[str] = set()  # a key deleted and put again while paging comes again at the end
        while True:
            page = self.client.list_memories(
                f"owners/{owner}",
                kinds=[self.kind],
                states=["COMMITTED"],
                order_by="create_time",
                page_size=size,
                page_token=token,
            )
            for memory in page.memories:
                found = self._item(memory, prefix, flt)
                if found is not None and memory.name not in seen:
                    seen.add(memory.name)
                    out.append(found)
                    if len(out) == wanted:
                        return out
            token = page.next_page_token
            if not token:
                return out
            read += len(page.memories)
            size = _next_page(size, read, len(out), wanted)

    def _scope_owner(self, prefix: Sequence[str], what: str) -> str:
        if self.owner is not None:
            return self.owner
        if not prefix or prefix[0] == "*":
            raise NotImplementedError(
                f"{what} without an owner label: this store has no owner, so the prefix "
                "must start with the owner id (no Lethe call spans owners)"
            )
        return self._owner_of(prefix)

    def _search(self, op: SearchOp, query_vector: list[float] | None = None) -> list[SearchItem]:
        """A ``SearchOp``: a listing, a vector search (``query_vector``), or Lethe's ``Search``."""
        prefix = tuple(op.namespace_prefix)
        check_labels(prefix)
        owner = self._scope_owner(prefix, "search")
        page: list[tuple[_Found, float | None]]
        if not op.query:  # creation order: read only up to the last item returned
            listed = self._owner_items(owner, prefix, op.filter, op.offset + op.limit)
            page = [(f, None) for f in listed[op.offset : op.offset + op.limit]]
            return self._found(op, page)
        if query_vector is not None:  # a ranking needs every item
            listed = self._owner_items(owner, prefix, op.filter)
            distance = (self.index_config or {}).get("distance_type") or "cosine"
            return self._found(op, _rank(listed, query_vector, op.offset, op.limit, distance))
        wanted = op.offset + op.limit
        top_k = min(SEARCH_WINDOW, max(10, 4 * wanted))
        while True:
            hits = self.client.search(
                f"owners/{owner}", query_text=op.query, top_k=top_k, kinds=[self.kind]
            ).hits
            kept: list[tuple[_Found, float | None]] = []
            for hit in hits:
                found = (
                    self._item(hit.memory, prefix, op.filter) if hit.HasField("memory") else None
                )
                if found is not None and found.indexed:
                    kept.append((found, float(hit.score)))
            if len(kept) >= wanted or len(hits) < top_k or top_k >= SEARCH_WINDOW:
                return self._found(op, kept[op.offset : op.offset + op.limit])
            top_k = min(SEARCH_WINDOW, top_k * 4)

    def _found(self, op: SearchOp, page: list[tuple[_Found, float | None]]) -> list[SearchItem]:
        """A search's page as ``SearchItem`` s, their ``ttl`` refreshed if the op asks."""
        if getattr(op, "refresh_ttl", False):
            self._refresh(f.memory for f, _ in page)
        return [
            SearchItem(
                f.item.namespace,
                f.item.key,
                f.item.value,
                f.item.created_at,
                f.item.updated_at,
                score=score,
            )
            for f, score in page
        ]

    def _list_scope(self, op: ListNamespacesOp) -> str:
        """The owner a listing reads, its conditions checked.

        Raises:
            InvalidNamespaceError: a bad label in a condition.
            NotImplementedError: no owner label when the store has no owner.
        """
        conditions = tuple(op.match_conditions or ())
        for condition in conditions:
            check_labels([label for label in condition.path if label != "*"])
        prefixes = [c.path for c in conditions if c.match_type == "prefix"]
        return self._scope_owner(prefixes[0] if prefixes else (), "list_namespaces")

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = tuple(op.match_conditions or ())
        owner = self._list_scope(op)
        namespaces = {f.item.namespace for f in self._owner_items(owner)}
        selected = [ns for ns in namespaces if all(condition_holds(c, ns) for c in conditions)]
        if op.max_depth is not None:
            result = sorted({ns[: op.max_depth] for ns in selected})
        else:
            result = sorted(selected)
        return result[op.offset : op.offset + op.limit]

    # -- BaseStore ----------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run LangGraph store operations (see the module docstring, ``batch``).

        Every operation is checked before any call is sent: a batch with one
        bad operation writes nothing. Reads see the state before the batch's
        writes; of several writes to one ``(namespace, key)`` the last wins.
        The calls are pipelined, at most ``PIPELINE_DEPTH`` in flight: the
        gets, then one ``Forget`` per owner for the deletes, then the puts in
        ``BatchUpdateMemories`` chunks (see the module docstring).

        Args:
            ops: ``GetOp``, ``SearchOp``, ``ListNamespacesOp`` and ``PutOp``.

        Returns:
            One result per operation: an ``Item`` or None, a list of
            ``SearchItem``, a list of namespaces, or None for a put.

        Raises:
            InvalidNamespaceError: a bad label, or no owner label when the store
                has no owner (nothing is written).
            NotImplementedError: a search or listing without an owner label
                when the store has no owner (nothing is written).
            TypeError / ValueError: a value JSON cannot hold; a ``ttl`` that is
                not positive; an unknown operation (nothing is written).
            lethe.client.LetheError: the server refused a call (e.g.
                ``OwnerNotAllowed``, ``BadField`` for a value over the limits);
                the other writes of the batch were still applied.
        """
        plan = self._plan(ops)
        if self.embeddings is not None:
            texts = plan.texts()
            docs = self.embeddings.embed_documents(texts) if texts else []
            queries = {q: self.embeddings.embed_query(q) for q in plan.queries()}
            plan.embedded(dict(zip(texts, docs, strict=True)), queries)
        return self._execute(plan)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch`, its embedding awaited and its calls in the loop's default executor.

        The same results and errors as :meth:`batch`; the ``index``'s
        ``embed`` runs as ``aembed_documents`` / ``aembed_query`` (an async
        embedding function serves here, a sync one in ``batch``).
        """
        plan = self._plan(ops)
        if self.embeddings is not None:
            texts = plan.texts()
            docs = await self.embeddings.aembed_documents(texts) if texts else []
            queries = {q: await self.embeddings.aembed_query(q) for q in plan.queries()}
            plan.embedded(dict(zip(texts, docs, strict=True)), queries)
        return await asyncio.get_running_loop().run_in_executor(None, self._execute, plan)

    def _plan(self, ops: Iterable[Op]) -> _Plan:
        """Check every operation of a batch and build its writes; nothing is sent.

        Raises:
            InvalidNamespaceError, NotImplementedError, TypeError, ValueError:
                as :meth:`batch` says.
        """
        plan = _Plan(list(ops))
        for op in plan.ops:
            if isinstance(op, PutOp):
                write = self._prepare(op)
                # The last write of a key wins, in the place of its first (as
                # InMemoryStore's batch: a dict keeps a key where it was first put).
                plan.writes[write.name] = write
            elif isinstance(op, GetOp):
                self.memory_name(op.namespace, op.key)
            elif isinstance(op, SearchOp):
                check_labels(op.namespace_prefix)
                self._scope_owner(op.namespace_prefix, "search")
            elif isinstance(op, ListNamespacesOp):
                self._list_scope(op)
            else:
                raise ValueError(f"Unknown operation type: {type(op)}")
        return plan

    def _execute(self, plan: _Plan) -> list[Result]:
        """Send a checked (and embedded) batch: the reads, the deletes, then the puts."""
        ops = plan.ops
        results: list[Result] = [None] * len(ops)

        def read(i: int) -> None:
            op = ops[i]
            if isinstance(op, GetOp):
                results[i] = self._get(op)
            elif isinstance(op, SearchOp):
                vector = plan.query_vectors.get(op.query) if op.query else None
                results[i] = self._search(op, vector)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list_namespaces(op)

        self._run_all(read, [i for i, op in enumerate(ops) if not isinstance(op, PutOp)])
        self._delete([w.name for w in plan.writes.values() if w.text is None])
        self._put_all([w for w in plan.writes.values() if w.text is not None])
        return results
