"""The gRPC servicers: request validation, authorisation of the named owner,
and calls into the store, retriever and lifecycle.

Each handler is wrapped by :func:`rpc`, the one boundary where exceptions
become ``google.rpc.Status`` (STYLE.md, "Exceptions inside, status at the
edge"). Limits (API.md, "Views and sizes"): at most 1000 turns per append and
1000 names per call, texts at most 64 KiB of UTF-8, page size default 100 and
at most 1000, ``top_k`` 1..1000 (0 means 10).
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import re
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

import grpc
import numpy as np
from google.protobuf import duration_pb2, timestamp_pb2
from grpc_status import rpc_status

from lethe.v1 import (
    common_pb2,
    lifecycle_pb2,
    lifecycle_pb2_grpc,
    memories_pb2,
    retrieval_pb2,
    retrieval_pb2_grpc,
    threads_pb2,
    threads_pb2_grpc,
)
from server._auth import authorize
from server._context import DEFAULT_MAX_CHARS, DEFAULT_RECENT, assemble
from server._context import DEFAULT_TOP_K as DEFAULT_CONTEXT_TOP_K
from server._convert import (
    STATE_NAMES,
    bundle_proto,
    hit_proto,
    receipt_proto,
    thread_proto,
    timestamp,
    turn_proto,
)
from server._lifecycle import Lifecycle
from server._names import (
    MemoryName,
    OwnerName,
    ThreadName,
    TurnName,
    check_id,
    new_id,
    parse_manifest,
    parse_owner,
    parse_record,
    parse_target,
    parse_thread,
    parse_turn,
)
from server._search import MODE_DENSE, MODE_HYBRID, MODE_LEXICAL, Retriever
from server.errors import InvalidArgument, LetheError, Reason
from server.store import COMMITTED, PENDING, Store, TurnDraft, TurnMeta, TurnView

_log = logging.getLogger(__name__)

MAX_TEXT_BYTES = 64 * 1024
MAX_SPEAKER_BYTES = 1024
MAX_TITLE_BYTES = 4096
MAX_BATCH = 1000
MAX_DIM = 4096
MAX_TTL_SECONDS = 366 * 24 * 3600.0
MAX_REASON_BYTES = 256
DEFAULT_PAGE = 100
MAX_PAGE = 1000
DEFAULT_TOP_K = 10
MAX_TOP_K = 1000
MAX_LINEAGE_DEPTH = 100
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")

F = TypeVar("F", bound=Callable[..., Any])


def abort(context: grpc.ServicerContext, error: BaseException) -> None:
    """Abort the call with the ``google.rpc.Status`` of ``error`` (raises)."""
    context.abort_with_status(rpc_status.to_status(_status(error)))


def _status(error: BaseException) -> Any:
    from server.errors import to_rpc_status

    return to_rpc_status(error)


def rpc(method: F) -> F:
    """The error boundary around every handler.

    A LetheError keeps its code and details; anything else is logged (type
    and traceback frames, never the message, which could quote content) and
    answered ``INTERNAL``.
    """

    @functools.wraps(method)
    def handler(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except LetheError as exc:
            abort(context, exc)
        except Exception as exc:
            _log.error(
                "internal error in %s: %s\n%s",
                method.__qualname__,
                type(exc).__name__,
                "".join(traceback.format_tb(exc.__traceback__)),
            )
            abort(context, exc)
        return None

    return handler  # type: ignore[return-value]


# ---------------------------------------------------------------------- validation helpers


def _utf8_len(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def check_text(value: str, field: str, *, limit: int, required: bool) -> str:
    """Raises InvalidArgument when empty (if required) or over ``limit`` bytes."""
    if required and not value.strip():
        raise InvalidArgument(field, "must not be empty")
    if _utf8_len(value) > limit:
        raise InvalidArgument(field, f"must be at most {limit} bytes of UTF-8")
    return value


def check_vector(values: Any, field: str) -> np.ndarray[Any, np.dtype[np.float32]] | None:
    """A finite, non-zero ``(d,) float32`` vector with 1 ≤ d ≤ 4096, or None if empty."""
    if len(values) == 0:
        return None
    if len(values) > MAX_DIM:
        raise InvalidArgument(field, f"at most {MAX_DIM} dimensions")
    vec = np.asarray(values, dtype=np.float32)
    if not np.all(np.isfinite(vec)):
        raise InvalidArgument(field, "must be finite (no NaN or infinity)")
    if not float(np.dot(vec.astype(np.float64), vec.astype(np.float64))) > 0.0:
        raise InvalidArgument(field, "must not be the zero vector")
    return vec


def _seconds(ts: timestamp_pb2.Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def _duration(d: duration_pb2.Duration, field: str, default: float) -> float:
    if d.seconds == 0 and d.nanos == 0:
        return default
    value = d.seconds + d.nanos / 1e9
    if not 0 < value <= MAX_TTL_SECONDS or d.nanos < 0 or d.nanos >= 1_000_000_000:
        raise InvalidArgument(field, f"must be positive and at most {MAX_TTL_SECONDS:.0f} s")
    return value


def _page_size(value: int) -> int:
    if value < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return min(value or DEFAULT_PAGE, MAX_PAGE)


def _encode_token(parent: str, after: str) -> str:
    raw = json.dumps({"p": parent, "a": after}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_token(token: str, parent: str) -> str:
    if not token:
        return ""
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if data["p"] == parent and isinstance(data["a"], str):
            return str(data["a"])
    except (ValueError, KeyError, TypeError):
        pass
    raise InvalidArgument("page_token", "not a token from a previous page of this listing")


def owner_page(request: Any) -> tuple[str, int, str]:
    """The authorised owner of a list request's ``parent``, its page size and the
    position its ``page_token`` resumes after (the shared head of every List method).

    Raises:
        InvalidArgument: bad parent, page size or token. PermissionDenied: owner.
    """
    owner = parse_owner(request.parent, "parent")
    authorize(owner)
    return owner, _page_size(request.page_size), _decode_token(request.page_token, request.parent)


def _states(values: Any) -> set[str]:
    if not values:
        return {PENDING, COMMITTED}
    out = set()
    for i, value in enumerate(values):
        if value not in STATE_NAMES:
            raise InvalidArgument(f"states[{i}]", "unknown state")
        out.add(STATE_NAMES[value])
    return out


def _kind_names(values: Any, field: str) -> list[str]:
    out = []
    for i, value in enumerate(values):
        if value not in memories_pb2.Memory.Kind.values() or value == 0:
            raise InvalidArgument(f"{field}[{i}]", "unknown kind")
        out.append(memories_pb2.Memory.Kind.Name(value))
    return out


def _view(value: int) -> bool:
    if value not in (common_pb2.VIEW_UNSPECIFIED, common_pb2.BASIC, common_pb2.FULL):
        raise InvalidArgument("view", "unknown view")
    return value == common_pb2.FULL


def _source_refs(refs: Any, owner: str, field: str) -> list[tuple[str, int]]:
    out = []
    for i, ref in enumerate(refs):
        name = ref.name
        target = parse_target(name, f"{field}[{i}].name")
        if target.owner != owner:
            raise InvalidArgument(f"{field}[{i}].name", "must name a record of the same owner")
        if ref.version < 0:
            raise InvalidArgument(f"{field}[{i}].version", "must not be negative")
        out.append((name, int(ref.version)))
    return out


# ---------------------------------------------------------------------- Threads


class ThreadsService(threads_pb2_grpc.ThreadsServicer):
    """``lethe.v1.Threads``."""

    def __init__(
        self,
        store: Store,
        retriever: Retriever,
        pending_ttl: float,
        proposer: Callable[[str, list[TurnMeta], threads_pb2.AppendTurnsRequest], list[Any]]
        | None = None,
        check_tags: Callable[[str, threads_pb2.AppendTurnsRequest], None] | None = None,
    ) -> None:
        self.store = store
        self.retriever = retriever
        self.pending_ttl = pending_ttl
        # Turns -> candidate memories (client tags, or the write-time rules).
        self.proposer = proposer
        self.check_tags = check_tags

    @rpc
    def CreateThread(  # noqa: N802
        self, request: threads_pb2.CreateThreadRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Thread:
        owner = parse_owner(request.parent, "parent")
        authorize(owner)
        thread = check_id(request.thread_id, "thread_id") if request.thread_id else new_id()
        title = check_text(request.title, "title", limit=MAX_TITLE_BYTES, required=False)
        return thread_proto(self.store.create_thread(owner, thread, title))

    @rpc
    def GetThread(  # noqa: N802
        self, request: threads_pb2.GetThreadRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Thread:
        name = parse_thread(request.name, "name")
        authorize(name.owner)
        return thread_proto(self.store.get_thread(name.owner, name.thread))

    @rpc
    def ListThreads(  # noqa: N802
        self, request: threads_pb2.ListThreadsRequest, context: grpc.ServicerContext
    ) -> threads_pb2.ListThreadsResponse:
        owner, size, after = owner_page(request)
        views, nxt = self.store.list_threads(owner, after, size, request.include_repairs)
        return threads_pb2.ListThreadsResponse(
            threads=[thread_proto(v) for v in views],
            next_page_token=_encode_token(request.parent, nxt) if nxt else "",
        )

    def _drafts(self, request: threads_pb2.AppendTurnsRequest, owner: str) -> list[TurnDraft]:
        if not request.turns:
            raise InvalidArgument("turns", "at least one turn is required")
        if len(request.turns) > MAX_BATCH:
            raise InvalidArgument("turns", f"at most {MAX_BATCH} turns per call")
        drafts = []
        for i, turn in enumerate(request.turns):
            field = f"turns[{i}]"
            if turn.role not in (
                common_pb2.USER,
                common_pb2.ASSISTANT,
                common_pb2.SYSTEM,
                common_pb2.TOOL,
            ):
                raise InvalidArgument(f"{field}.role", "must be USER, ASSISTANT, SYSTEM or TOOL")
            text = check_text(turn.text, f"{field}.text", limit=MAX_TEXT_BYTES, required=True)
            speaker = check_text(
                turn.speaker, f"{field}.speaker", limit=MAX_SPEAKER_BYTES, required=False
            )
            when = None
            if turn.HasField("time"):
                if not 0 <= turn.time.nanos < 1_000_000_000 or not (
                    0 <= turn.time.seconds <= 253402300799
                ):
                    raise InvalidArgument(f"{field}.time", "out of range")
                when = _seconds(turn.time)
            manifest = turn.context_manifest
            if manifest:
                try:
                    manifest_owner = parse_manifest(manifest, f"{field}.context_manifest").owner
                except InvalidArgument:
                    manifest_owner = ""
                if manifest_owner != owner:
                    raise InvalidArgument(
                        f"{field}.context_manifest", "must be a manifest name of the same owner"
                    )
            drafts.append(
                TurnDraft(
                    role=int(turn.role),
                    speaker=speaker,
                    text=text,
                    time=when,
                    embedding=check_vector(turn.embedding, f"{field}.embedding"),
                    context_manifest=manifest,
                    context_refs=_source_refs(turn.context_refs, owner, f"{field}.context_refs"),
                    commit=turn.commit,
                    pending_ttl=_duration(
                        turn.pending_ttl, f"{field}.pending_ttl", self.pending_ttl
                    ),
                )
            )
        return drafts

    @rpc
    def AppendTurns(  # noqa: N802
        self, request: threads_pb2.AppendTurnsRequest, context: grpc.ServicerContext
    ) -> threads_pb2.AppendTurnsResponse:
        name = parse_thread(request.parent, "parent")
        authorize(name.owner)
        if request.request_id and not _REQUEST_ID_RE.fullmatch(request.request_id):
            raise InvalidArgument("request_id", "must match [A-Za-z0-9._:-]{1,128}")
        drafts = self._drafts(request, name.owner)
        if self.check_tags is not None:
            self.check_tags(name.owner, request)
        embedder = self.retriever.embedder
        for i, draft in enumerate(drafts):
            if (
                embedder
                and draft.embedding is not None
                and draft.embedding.shape[0] != embedder.dim
            ):
                raise InvalidArgument(
                    f"turns[{i}].embedding",
                    f"dimension {draft.embedding.shape[0]} differs from the server embedder's "
                    f"{embedder.dim}",
                    reason=Reason.DIMENSION_MISMATCH,
                )
        if request.request_id:
            prior = self.store.find_request(name.owner, name.thread, request.request_id)
            if prior is not None:
                return self._replay(prior)
        missing = [i for i, d in enumerate(drafts) if d.embedding is None]
        vectors = self.retriever.embed_texts(
            [_indexed_text(drafts[i].speaker, drafts[i].text) for i in missing]
        )
        for i, vec in zip(missing, vectors, strict=True):
            drafts[i].embedding = vec
        metas, retried = self.store.append_turns(
            name.owner, name.thread, drafts, request.request_id
        )
        if retried:
            return self._replay([m.rid for m in metas])
        self.retriever.on_write(name.owner, metas)
        proposed = self.proposer(name.owner, metas, request) if self.proposer else []
        return threads_pb2.AppendTurnsResponse(
            turns=[
                turn_proto(TurnView(meta, draft.text, draft.speaker))
                for meta, draft in zip(metas, drafts, strict=True)
            ],
            proposed=proposed,
        )

    def _replay(self, rids: list[int]) -> threads_pb2.AppendTurnsResponse:
        """The first result of a retried append, through the visibility rules:
        a turn since deleted, expired, sealed or tainted is left out."""
        return threads_pb2.AppendTurnsResponse(
            turns=[turn_proto(v) for v in self.store.replay_turns(rids)]
        )

    @rpc
    def ListTurns(  # noqa: N802
        self, request: threads_pb2.ListTurnsRequest, context: grpc.ServicerContext
    ) -> threads_pb2.ListTurnsResponse:
        name = parse_thread(request.parent, "parent")
        authorize(name.owner)
        size = _page_size(request.page_size)
        after = _decode_token(request.page_token, request.parent)
        if after and not re.fullmatch(r"[1-9][0-9]{0,17}", after):
            raise InvalidArgument("page_token", "not a token from a previous page of this listing")
        views, nxt = self.store.list_turns(
            name.owner,
            name.thread,
            int(after) if after else 0,
            size,
            states=_states(request.states),
            include_tainted=request.include_tainted,
            with_embedding=_view(request.view),
        )
        return threads_pb2.ListTurnsResponse(
            turns=[turn_proto(v) for v in views],
            next_page_token=_encode_token(request.parent, str(nxt)) if nxt else "",
        )

    @rpc
    def GetTurn(  # noqa: N802
        self, request: threads_pb2.GetTurnRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Turn:
        name = parse_turn(request.name, "name")
        authorize(name.owner)
        full = _view(request.view)
        return turn_proto(self.store.get_turn(name.owner, name.thread, name.seq, full))


def _indexed_text(speaker: str, text: str) -> str:
    """What the server embeds for a turn: ``speaker: text`` (the speaker's name
    carries meaning in questions such as "When did Caroline ...")."""
    return f"{speaker}: {text}" if speaker else text


# ---------------------------------------------------------------------- Retrieval


class RetrievalService(retrieval_pb2_grpc.RetrievalServicer):
    """``lethe.v1.Retrieval``."""

    @rpc
    def AssembleContext(  # noqa: N802
        self, request: retrieval_pb2.AssembleContextRequest, context: grpc.ServicerContext
    ) -> retrieval_pb2.ContextBundle:
        thread = parse_thread(request.thread, "thread")
        authorize(thread.owner)
        for field in ("max_chars", "recent_turns", "top_k"):
            if getattr(request, field) < 0:
                raise InvalidArgument(field, "must not be negative")
        if request.top_k > MAX_TOP_K:
            raise InvalidArgument("top_k", f"must be in 0..{MAX_TOP_K} (0 = 5)")
        if request.recent_turns > MAX_PAGE:
            raise InvalidArgument("recent_turns", f"must be in 0..{MAX_PAGE} (0 = 10)")
        check_text(request.query_text, "query_text", limit=MAX_TEXT_BYTES, required=False)
        check_text(request.scope, "scope", limit=1024, required=False)
        query_vec = check_vector(request.query_embedding, "query_embedding")
        vec = None
        if query_vec is not None or request.query_text.strip():
            vec = self.retriever.query_vector(
                thread.owner, request.query_text, [] if query_vec is None else query_vec.tolist()
            )
        bundle = assemble(
            self.retriever.store,
            self.retriever,
            thread.owner,
            thread.thread,
            request.query_text,
            vec,
            max_chars=request.max_chars or DEFAULT_MAX_CHARS,
            recent=request.recent_turns or DEFAULT_RECENT,
            top_k=request.top_k or DEFAULT_CONTEXT_TOP_K,
            scope=request.scope,
        )
        return bundle_proto(bundle)

    @rpc
    def GetContextManifest(  # noqa: N802
        self, request: retrieval_pb2.GetContextManifestRequest, context: grpc.ServicerContext
    ) -> retrieval_pb2.ContextManifest:
        name = parse_manifest(request.name, "name")
        authorize(name.owner)
        row = self.retriever.store.get_manifest(name.owner, name.manifest)
        return retrieval_pb2.ContextManifest(
            name=request.name,
            refs=[common_pb2.SourceRef(name=n, version=v) for n, v in row.refs],
            create_time=timestamp(row.create_time),
        )

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever

    @rpc
    def Search(  # noqa: N802
        self, request: retrieval_pb2.SearchRequest, context: grpc.ServicerContext
    ) -> retrieval_pb2.SearchResponse:
        owner = parse_owner(request.parent, "parent")
        authorize(owner)
        top_k = request.top_k or DEFAULT_TOP_K
        if not 1 <= top_k <= MAX_TOP_K:
            raise InvalidArgument("top_k", f"must be in 1..{MAX_TOP_K}")
        check_text(request.query_text, "query_text", limit=MAX_TEXT_BYTES, required=False)
        query_vec = check_vector(request.query_embedding, "query_embedding")
        pending_thread = None
        if request.thread:
            thread = parse_thread(request.thread, "thread")
            if thread.owner != owner:
                raise InvalidArgument("thread", "must be a thread of parent")
            self.retriever.store.get_thread(owner, thread.thread)  # NOT_FOUND / RECORD_DELETED
            if request.include_pending:
                pending_thread = thread.thread
        elif request.include_pending:
            raise InvalidArgument("include_pending", "requires thread")
        modes = {
            retrieval_pb2.SearchRequest.MODE_UNSPECIFIED: MODE_HYBRID,
            retrieval_pb2.SearchRequest.HYBRID: MODE_HYBRID,
            retrieval_pb2.SearchRequest.DENSE: MODE_DENSE,
            retrieval_pb2.SearchRequest.LEXICAL: MODE_LEXICAL,
        }
        if request.mode not in modes:
            raise InvalidArgument("mode", "unknown mode")
        mode = modes[request.mode]
        kinds = frozenset(_kind_names(request.kinds, "kinds"))
        if query_vec is None and not request.query_text.strip():
            raise InvalidArgument("query_text", "query_text or query_embedding is required")
        if mode == MODE_LEXICAL and not request.query_text.strip():
            raise InvalidArgument("query_text", "LEXICAL search needs query_text")
        vec = None
        if mode != MODE_LEXICAL:
            vec = self.retriever.query_vector(
                owner, request.query_text, [] if query_vec is None else query_vec.tolist()
            )
        if mode == MODE_DENSE and vec is None and self.retriever.embedder is None:
            raise InvalidArgument(
                "query_embedding", "DENSE search needs query_embedding: this server has no embedder"
            )
        hits = self.retriever.search(
            owner,
            request.query_text,
            vec,
            top_k,
            pending_thread,
            mode=mode,
            kinds=kinds,
            include_turns=not request.kinds or request.include_turns,
        )
        return retrieval_pb2.SearchResponse(hits=[hit_proto(h.view, h.score) for h in hits])


# ---------------------------------------------------------------------- Lifecycle


def _record_names_owner(names: Sequence[str]) -> str:
    """The one owner of 1..1000 turn or memory names (Commit, ExtendPending).

    Raises:
        InvalidArgument: empty, too many, malformed, or several owners.
    """
    if not names:
        raise InvalidArgument("names", "at least one name is required")
    if len(names) > MAX_BATCH:
        raise InvalidArgument("names", f"at most {MAX_BATCH} names per call")
    owners = {parse_record(name, f"names[{i}]").owner for i, name in enumerate(names)}
    if len(owners) != 1:
        raise InvalidArgument("names", "all names must belong to one owner")
    return owners.pop()


class LifecycleService(lifecycle_pb2_grpc.LifecycleServicer):
    """``lethe.v1.Lifecycle``."""

    @rpc
    def ExtendPending(  # noqa: N802
        self, request: lifecycle_pb2.ExtendPendingRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.ExtendPendingResponse:
        authorize(_record_names_owner(request.names))
        if not request.HasField("ttl"):
            raise InvalidArgument("ttl", "required")
        ttl = _duration(request.ttl, "ttl", 0.0)
        if ttl <= 0:
            raise InvalidArgument("ttl", "must be positive")
        metas = self.store.extend_pending(list(dict.fromkeys(request.names)), ttl)
        return lifecycle_pb2.ExtendPendingResponse(
            records=[common_pb2.SourceRef(name=m.name, version=m.version) for m in metas]
        )

    def __init__(self, store: Store, retriever: Retriever, lifecycle: Lifecycle) -> None:
        self.store = store
        self.retriever = retriever
        self.lifecycle = lifecycle

    @rpc
    def Commit(  # noqa: N802
        self, request: lifecycle_pb2.CommitRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.CommitResponse:
        owner = _record_names_owner(request.names)
        authorize(owner)
        names = list(dict.fromkeys(request.names))  # a name given twice is committed once
        metas = self.store.commit_records(names, request.include_sources)
        self.retriever.on_write(owner, metas)
        return lifecycle_pb2.CommitResponse(
            committed=[common_pb2.SourceRef(name=m.name, version=m.version) for m in metas]
        )

    @rpc
    def GetLineage(  # noqa: N802
        self, request: lifecycle_pb2.GetLineageRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.GetLineageResponse:
        target = parse_target(request.name, "name")
        if not isinstance(target, TurnName | MemoryName):
            raise InvalidArgument("name", "must be a turn or memory name")
        authorize(target.owner)
        if request.direction not in (1, 2):
            raise InvalidArgument("direction", "must be ANCESTORS or DESCENDANTS")
        if not 0 <= request.max_depth <= MAX_LINEAGE_DEPTH:
            raise InvalidArgument("max_depth", f"must be in 0..{MAX_LINEAGE_DEPTH} (0 = 10)")
        self.store.check_live(request.name)
        edges = self.store.lineage(
            request.name,
            request.direction == lifecycle_pb2.GetLineageRequest.ANCESTORS,
            request.max_depth or 10,
        )
        return lifecycle_pb2.GetLineageResponse(
            edges=[
                lifecycle_pb2.LineageEdge(
                    source=common_pb2.SourceRef(name=s, version=sv),
                    derivative=common_pb2.SourceRef(name=d, version=dv),
                )
                for (s, sv), (d, dv) in edges
            ]
        )

    @rpc
    def ListDeletions(  # noqa: N802
        self, request: lifecycle_pb2.ListDeletionsRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.ListDeletionsResponse:
        owner, size, after = owner_page(request)
        entries, nxt = self.store.list_deletions(owner, after, size)
        return lifecycle_pb2.ListDeletionsResponse(
            receipts=[receipt_proto(e) for e in entries],
            next_page_token=_encode_token(request.parent, nxt) if nxt else "",
        )

    @rpc
    def Audit(  # noqa: N802
        self, request: lifecycle_pb2.AuditRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.AuditReport:
        owner = parse_owner(request.parent, "parent")
        authorize(owner)
        counts = self.lifecycle.audit(owner)
        return lifecycle_pb2.AuditReport(**asdict(counts))

    @rpc
    def Forget(  # noqa: N802
        self, request: lifecycle_pb2.ForgetRequest, context: grpc.ServicerContext
    ) -> common_pb2.DeletionReceipt:
        if len(request.names) > MAX_BATCH:
            raise InvalidArgument("names", f"at most {MAX_BATCH} names per call")
        parsed: list[tuple[str, OwnerName | ThreadName | TurnName | MemoryName]] = []
        for i, name in enumerate(request.names):
            if name not in {n for n, _ in parsed}:  # a name given twice is forgotten once
                parsed.append((name, parse_target(name, f"names[{i}]")))
        owners = [t.owner for _, t in parsed]
        ranges: list[tuple[str, int, int]] = []
        if request.HasField("range"):
            rng = request.range
            thread = parse_thread(rng.thread, "range.thread")
            if not 1 <= rng.from_seq <= rng.to_seq:
                raise InvalidArgument("range", "need 1 <= from_seq <= to_seq")
            owners.append(thread.owner)
            authorize(thread.owner)
            ranges.append((thread.thread, int(rng.from_seq), int(rng.to_seq)))
        if not owners:
            raise InvalidArgument("names", "name at least one record, or a range")
        if len(set(owners)) != 1:
            raise InvalidArgument("names", "all names must belong to one owner")
        owner = owners[0]
        authorize(owner)
        reason = check_text(request.reason, "reason", limit=MAX_REASON_BYTES, required=False)
        if request.responses not in (0, 1, 2):
            raise InvalidArgument("responses", "must be TAINT or DELETE")
        entry = self.lifecycle.forget(
            owner,
            turns=[(t.thread, t.seq) for _, t in parsed if isinstance(t, TurnName)],
            ranges=ranges,
            threads=[t.thread for _, t in parsed if isinstance(t, ThreadName)],
            whole_owner=any(isinstance(t, OwnerName) for _, t in parsed),
            memories=[t.memory for _, t in parsed if isinstance(t, MemoryName)],
            delete_responses=request.responses == lifecycle_pb2.ForgetRequest.DELETE,
            reason=reason or "FORGET",
        )
        return receipt_proto(entry)
