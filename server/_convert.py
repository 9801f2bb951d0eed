"""Store objects to protobuf messages: threads, turns, memories, hits, receipts,
events and context bundles. The servicers build their own small responses
(lists, lineage edges, SourceRefs) around these."""

from __future__ import annotations

from typing import Any

from google.protobuf import timestamp_pb2

from lethe.v1 import common_pb2, memories_pb2, retrieval_pb2, threads_pb2
from server._context import ContextBundle
from server.store import (
    COMMITTED,
    PENDING,
    SEALED,
    DeletionEntry,
    EventRow,
    MemoryView,
    ThreadView,
    TurnView,
)

_STATES = {PENDING: common_pb2.PENDING, COMMITTED: common_pb2.COMMITTED, SEALED: common_pb2.SEALED}
STATE_NAMES = {v: k for k, v in _STATES.items()}


def timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    """A Timestamp from float seconds since the epoch (microsecond precision)."""
    ts = timestamp_pb2.Timestamp()
    micros = round(seconds * 1_000_000)
    ts.seconds, rem = divmod(micros, 1_000_000)
    ts.nanos = rem * 1000
    return ts


def thread_proto(view: ThreadView) -> threads_pb2.Thread:
    meta = view.meta
    thread = threads_pb2.Thread(
        name=f"owners/{meta.owner}/threads/{meta.thread}",
        kind=threads_pb2.Thread.Kind.Value(meta.kind),
        title=view.title,
        create_time=timestamp(meta.create_time),
        update_time=timestamp(meta.update_time),
        last_seq=meta.last_seq,
    )
    if meta.kind == "REPAIR":
        thread.repair.CopyFrom(
            threads_pb2.RepairInfo(
                source_thread=f"owners/{meta.owner}/threads/{meta.repair_source}",
                from_seq=meta.repair_from_seq,
                state=threads_pb2.RepairInfo.State.Value(meta.repair_state),
                outcome=threads_pb2.RepairInfo.Outcome.Value(meta.repair_outcome)
                if meta.repair_outcome
                else threads_pb2.RepairInfo.OUTCOME_UNSPECIFIED,
            )
        )
    return thread


def turn_proto(view: TurnView, *, text: bool = True) -> threads_pb2.Turn:
    """A Turn message; without ``text`` its text and speaker are left out (the
    reply of an append that did not ask for ``echo_text``)."""
    meta = view.meta
    turn = threads_pb2.Turn(
        name=meta.name,
        seq=meta.seq,
        role=meta.role,  # type: ignore[arg-type]
        speaker=view.speaker if text else "",
        text=view.text if text else "",
        time=timestamp(meta.time),
        state=_STATES[meta.state],
        version=meta.version,
        create_time=timestamp(meta.create_time),
        tainted=meta.tainted,
        context_manifest=meta.context_manifest,
        context_refs=[common_pb2.SourceRef(name=n, version=v) for n, v in meta.context_refs],
    )
    if meta.state == PENDING and meta.expire_time:
        turn.expire_time.CopyFrom(timestamp(meta.expire_time))
    if view.embedding is not None:
        turn.embedding.extend(view.embedding.tolist())
    return turn


def receipt_proto(entry: DeletionEntry) -> common_pb2.DeletionReceipt:
    """A DeletionReceipt from a deletion-log entry (ids and counts only)."""
    receipt = common_pb2.DeletionReceipt(
        name=entry.name,
        targets=entry.targets,
        cascaded=entry.cascaded,
        tainted=entry.tainted,
        rebuilds_requested=entry.rebuilds_requested,
        request_time=timestamp(entry.request_time),
        reason=entry.reason,
        deleted=entry.deleted,
    )
    for dest, status in entry.destinations.items():
        d = receipt.destinations.add(name=dest, done=status.done)
        if status.done:
            d.complete_time.CopyFrom(timestamp(status.time))
    if entry.complete_time:
        receipt.complete_time.CopyFrom(timestamp(entry.complete_time))
    if entry.shred_horizon_time:
        receipt.shred_horizon_time.CopyFrom(timestamp(entry.shred_horizon_time))
    return receipt


def memory_proto(view: MemoryView) -> memories_pb2.Memory:
    """A Memory message of one version (embeddings are input only)."""
    meta = view.meta
    memory = memories_pb2.Memory(
        name=meta.name,
        kind=memories_pb2.Memory.Kind.Value(meta.kind),
        text=view.content.text,
        state=_STATES[meta.state],
        version=view.version,
        status=memories_pb2.Memory.Status.Value(view.status),
        slot=view.content.slot,
        scope=view.content.scope,
        sources=[common_pb2.SourceRef(name=n, version=v) for n, v in view.sources],
        supersedes=meta.supersedes if view.version == meta.version else 0,
        create_time=timestamp(meta.create_time),
        update_time=timestamp(meta.update_time),
    )
    if meta.direction:
        memory.direction = memories_pb2.Memory.Direction.Value(meta.direction)
    if meta.trigger:
        memory.trigger = memories_pb2.Trigger.Value(meta.trigger)
    if meta.origin:
        memory.origin = memories_pb2.Memory.Origin.Value(meta.origin)
    if meta.due_time:
        memory.due_time.CopyFrom(timestamp(meta.due_time))
    if meta.state == PENDING and meta.expire_time:
        memory.expire_time.CopyFrom(timestamp(meta.expire_time))
    if view.content.metadata is not None:
        memory.metadata.update(view.content.metadata)
    if view.content.edge is not None:
        subject, predicate, obj = view.content.edge
        memory.edge.CopyFrom(
            memories_pb2.GraphEdge(subject=subject, predicate=predicate, object=obj)
        )
    return memory


def hit_proto(view: TurnView | MemoryView, score: float) -> retrieval_pb2.Hit:
    if isinstance(view, TurnView):
        return retrieval_pb2.Hit(score=score, turn=turn_proto(view))
    return retrieval_pb2.Hit(score=score, memory=memory_proto(view))


def event_proto(event: EventRow, receipt: common_pb2.DeletionReceipt | None) -> Any:
    """An Event message from a stored event (ids only)."""
    from lethe.v1 import events_pb2

    out = events_pb2.Event(
        id=event.id,
        type=events_pb2.EventType.Value(event.type),
        time=timestamp(event.time),
        subject=event.subject,
        sources=[common_pb2.SourceRef(name=n, version=v) for n, v in event.sources],
    )
    if receipt is not None:
        out.receipt.CopyFrom(receipt)
    return out


def bundle_proto(bundle: ContextBundle) -> retrieval_pb2.ContextBundle:
    """A ContextBundle message (see :mod:`server._context`)."""
    return retrieval_pb2.ContextBundle(
        manifest=retrieval_pb2.ContextManifest(
            name=bundle.manifest_name,
            refs=[common_pb2.SourceRef(name=n, version=v) for n, v in bundle.refs],
            create_time=timestamp(bundle.create_time),
        ),
        recent_turns=[turn_proto(v) for v in bundle.recent_turns],
        preferences=[memory_proto(v) for v in bundle.preferences],
        open_items=[memory_proto(v) for v in bundle.open_items],
        memories=[hit_proto(v, score) for v, score in bundle.memories],
        summaries=[memory_proto(v) for v in bundle.summaries],
    )
