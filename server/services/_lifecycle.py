"""The ``lethe.v1.Lifecycle`` servicer."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict

import grpc

from lethe.v1 import common_pb2, lifecycle_pb2, lifecycle_pb2_grpc
from server._names import (
    MemoryName,
    OwnerName,
    ThreadName,
    TurnName,
    parse_owner,
    parse_record,
    parse_target,
    parse_thread,
)
from server.edge import StreamContext, authorize
from server.errors import InvalidArgument
from server.lifecycle import Lifecycle
from server.retrieval import Retriever, echo_shingles
from server.services._common import (
    MAX_BATCH,
    MAX_LINEAGE_DEPTH,
    MAX_REASON_BYTES,
    MAX_RETENTION_SECONDS,
    MAX_TTL_SECONDS,
    check_text,
    duration,
    fit,
    owner_page,
    page_tokens,
    retention,
    seconds,
)
from server.services._convert import receipt_proto, set_time
from server.services._export import export_items
from server.store import ECHO_IGNORE, ECHO_TAINT, ForgetTargets, Store


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

    def ExtendPending(  # noqa: N802
        self, request: lifecycle_pb2.ExtendPendingRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.ExtendPendingResponse:
        """``Lifecycle.ExtendPending``: give pending records ``ttl`` from now."""
        authorize(_record_names_owner(request.names))
        if not request.HasField("ttl"):
            raise InvalidArgument("ttl", "required")
        ttl = duration(request.ttl, "ttl", 0.0)
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
        self.page_tokens = page_tokens()

    def Commit(  # noqa: N802
        self, request: lifecycle_pb2.CommitRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.CommitResponse:
        """``Lifecycle.Commit``: commit pending turns and memories in one transaction."""
        owner = _record_names_owner(request.names)
        authorize(owner)
        names = list(dict.fromkeys(request.names))  # a name given twice is committed once
        metas = self.store.commit_records(names, request.include_sources, echo_shingles)
        self.retriever.on_write(owner, metas)
        return lifecycle_pb2.CommitResponse(
            committed=[common_pb2.SourceRef(name=m.name, version=m.version) for m in metas]
        )

    def GetLineage(  # noqa: N802
        self, request: lifecycle_pb2.GetLineageRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.GetLineageResponse:
        """``Lifecycle.GetLineage``: the lineage edges around a live turn or memory."""
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

    def ListDeletions(  # noqa: N802
        self, request: lifecycle_pb2.ListDeletionsRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.ListDeletionsResponse:
        """``Lifecycle.ListDeletions``: one page of the owner's deletion receipts, oldest first."""
        owner, size, after = owner_page(request, self.page_tokens)
        entries, nxt = self.store.list_deletions(owner, after, size)
        receipts, nxt = fit(
            [receipt_proto(e, self.store.sign_receipt) for e in entries],
            nxt,
            lambda r: r.name.rsplit("/", 1)[-1],
        )
        return lifecycle_pb2.ListDeletionsResponse(
            receipts=receipts,
            next_page_token=self.page_tokens.issue(request, nxt),
        )

    def Audit(  # noqa: N802
        self, request: lifecycle_pb2.AuditRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.AuditReport:
        """``Lifecycle.Audit``: audit an owner now (integrity, lineage, keys, loaded indexes)."""
        owner = parse_owner(request.parent, "parent")
        authorize(owner)
        counts = self.lifecycle.audit(owner)
        return lifecycle_pb2.AuditReport(**asdict(counts))

    def GetServerInfo(  # noqa: N802
        self, request: lifecycle_pb2.GetServerInfoRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.ServerInfo:
        """``Lifecycle.GetServerInfo``: the store's id and the public keys of its receipts.

        Any authenticated caller may ask: it names no owner and holds nothing secret.
        """
        return self.store.server_info()

    async def ExportOwner(  # type: ignore[override]  # noqa: N802
        self, request: lifecycle_pb2.ExportOwnerRequest, context: StreamContext
    ) -> AsyncIterator[lifecycle_pb2.ExportItem]:
        """``Lifecycle.ExportOwner``: stream what the owner's token may read (``_export``)."""
        async for item in export_items(self.store, request, context):
            yield item

    def SetRetention(  # noqa: N802
        self, request: lifecycle_pb2.SetRetentionRequest, context: grpc.ServicerContext
    ) -> lifecycle_pb2.SetRetentionResponse:
        """``Lifecycle.SetRetention``: how long records, threads or an owner's new records live."""
        if not request.names:
            raise InvalidArgument("names", "at least one name is required")
        if len(request.names) > MAX_BATCH:
            raise InvalidArgument("names", f"at most {MAX_BATCH} names per call")
        parsed = [parse_target(name, f"names[{i}]") for i, name in enumerate(request.names)]
        owners = {t.owner for t in parsed}
        if len(owners) != 1:
            raise InvalidArgument("names", "all names must belong to one owner")
        owner = owners.pop()
        authorize(owner)
        given = [request.HasField("expire_time"), request.HasField("ttl"), request.clear]
        if sum(given) != 1:
            raise InvalidArgument("ttl", "give exactly one of expire_time, ttl and clear")
        response = lifecycle_pb2.SetRetentionResponse()
        if any(isinstance(t, OwnerName) for t in parsed):
            if len(parsed) != 1:
                raise InvalidArgument("names", "an owner name goes alone")
            if request.HasField("expire_time"):
                raise InvalidArgument("expire_time", "an owner's default is a ttl")
            default = retention(request.ttl, "ttl") if request.HasField("ttl") else 0.0
            self.store.set_owner_retention(owner, default)
            if default:
                response.owner_default.FromNanoseconds(round(default * 1e9))
            return response
        now = time.time()
        until = 0.0
        if request.HasField("ttl"):
            until = now + retention(request.ttl, "ttl")
        elif request.HasField("expire_time"):
            until = seconds(request.expire_time)
            if not now < until <= now + MAX_RETENTION_SECONDS:
                raise InvalidArgument("expire_time", "must be in the future, within 100 years")
        metas = self.store.set_retention(
            owner,
            turns=[(t.thread, t.seq) for t in parsed if isinstance(t, TurnName)],
            memories=[t.memory for t in parsed if isinstance(t, MemoryName)],
            threads=[t.thread for t in parsed if isinstance(t, ThreadName)],
            until=until,
        )
        # The loaded indexes watch when each turn may stop being visible: rebuilt
        # from the store on next use, they watch the new times.
        self.retriever.drop_owner(owner)
        response.records.extend(common_pb2.SourceRef(name=m.name, version=m.version) for m in metas)
        if until:
            set_time(response.expire_time, until)
        return response

    def Forget(  # noqa: N802
        self, request: lifecycle_pb2.ForgetRequest, context: grpc.ServicerContext
    ) -> common_pb2.DeletionReceipt:
        """``Lifecycle.Forget``: forget turns, ranges, memories, threads or a whole owner."""
        if len(request.names) > MAX_BATCH:
            raise InvalidArgument("names", f"at most {MAX_BATCH} names per call")
        parsed: list[tuple[str, OwnerName | ThreadName | TurnName | MemoryName]] = []
        seen: set[str] = set()  # a name given twice is forgotten once
        for i, name in enumerate(request.names):
            if name not in seen:
                seen.add(name)
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
        targets = ForgetTargets.of(
            turns=[(t.thread, t.seq) for _, t in parsed if isinstance(t, TurnName)],
            ranges=ranges,
            threads=[t.thread for _, t in parsed if isinstance(t, ThreadName)],
            whole_owner=any(isinstance(t, OwnerName) for _, t in parsed),
            memories=[t.memory for _, t in parsed if isinstance(t, MemoryName)],
            delete_responses=request.responses == lifecycle_pb2.ForgetRequest.DELETE,
        )
        echoes, echo_guard = _echo_choice(request)
        if targets.whole_owner:
            echoes = ECHO_IGNORE  # nothing of the owner remains to echo
        entry = self.lifecycle.forget(
            owner, targets, reason=reason or "FORGET", echoes=echoes, echo_guard=echo_guard
        )
        return receipt_proto(entry, self.store.sign_receipt)


def _echo_choice(request: lifecycle_pb2.ForgetRequest) -> tuple[str, float | None]:
    """The request's echo action (default ``TAINT``) and guard window (None: the server's).

    Raises:
        InvalidArgument: ``echoes`` is not an ``EchoAction``; ``echo_guard`` is
            negative, over 366 days or malformed.
    """
    if request.echoes not in common_pb2.EchoAction.values():
        raise InvalidArgument("echoes", "must be REPORT, TAINT, FORGET or IGNORE")
    action = (
        ECHO_TAINT
        if request.echoes == common_pb2.ECHO_ACTION_UNSPECIFIED
        else common_pb2.EchoAction.Name(request.echoes)
    )
    if not request.HasField("echo_guard"):
        return action, None
    guard = request.echo_guard
    window = guard.seconds + guard.nanos / 1e9
    if guard.seconds < 0 or guard.nanos < 0 or guard.nanos >= 1_000_000_000:
        raise InvalidArgument("echo_guard", "must not be negative")
    if window > MAX_TTL_SECONDS:
        raise InvalidArgument("echo_guard", f"must be at most {MAX_TTL_SECONDS:.0f} s")
    return action, window
