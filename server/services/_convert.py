"""Store objects to protobuf messages: threads, turns, memories, hits, receipts and more.

The kinds: threads, turns, memories, hits, receipts, events and context
bundles. The servicers build their own small responses (lists, lineage edges,
SourceRefs) around these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import timestamp_pb2

from lethe.v1 import common_pb2, memories_pb2, retrieval_pb2, threads_pb2
from server.retrieval import ContextBundle
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


def set_time(ts: timestamp_pb2.Timestamp, seconds: float) -> None:
    """Set ``ts`` to float seconds since the epoch, at microsecond precision.

    ``ts`` is marked present, even at the epoch.
    """
    ts.SetInParent()
    micros = round(seconds * 1_000_000)
    ts.seconds, rem = divmod(micros, 1_000_000)
    ts.nanos = rem * 1000


def timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    """A Timestamp from float seconds since the epoch (microsecond precision)."""
    ts = timestamp_pb2.Timestamp()
    set_time(ts, seconds)
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
    if meta.expire_time:
        set_time(thread.expire_time, meta.expire_time)
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
    """A Turn message; without ``text`` its text and speaker are left out.

    That is the reply of an append that did not ask for ``echo_text``.
    """
    turn = threads_pb2.Turn()
    fill_turn(turn, view, text=text)
    return turn


def fill_turn(turn: threads_pb2.Turn, view: TurnView, *, text: bool = True) -> None:
    """Write ``view`` into the empty ``turn`` (:func:`turn_proto`), in place.

    A message built inside its reply (``reply.hits.add().turn``) is not copied
    into it afterwards, which costs more than building it.
    """
    meta = view.meta
    turn.name = meta.name
    turn.seq = meta.seq
    turn.role = meta.role  # type: ignore[assignment]
    if text:
        turn.speaker = view.speaker
        turn.text = view.text
    set_time(turn.time, meta.time)
    turn.state = _STATES[meta.state]
    turn.version = meta.version
    set_time(turn.create_time, meta.create_time)
    turn.tainted = meta.tainted
    turn.context_manifest = meta.context_manifest
    for n, v in meta.context_refs:
        turn.context_refs.add(name=n, version=v)
    if meta.state in (PENDING, COMMITTED) and meta.expire_time:
        set_time(turn.expire_time, meta.expire_time)
    if view.embedding is not None:
        turn.embedding.extend(view.embedding.tolist())


def receipt_proto(
    entry: DeletionEntry, sign: Callable[[common_pb2.DeletionReceipt], object]
) -> common_pb2.DeletionReceipt:
    """A signed DeletionReceipt from a deletion-log entry (ids and counts only).

    Args:
        entry: the log entry.
        sign: names the store on the receipt and signs it in place
            (:meth:`server.store.Store.sign_receipt`).
    """
    receipt = common_pb2.DeletionReceipt(
        name=entry.name,
        targets=entry.targets,
        cascaded=entry.cascaded,
        tainted=entry.tainted,
        rebuilds_requested=entry.rebuilds_requested,
        request_time=timestamp(entry.request_time),
        reason=entry.reason,
        deleted=entry.deleted,
        echo_action=common_pb2.EchoAction.Value(entry.echo_action),
        echoes_found=entry.echoes_found,
        echoes_acted=entry.echoes_acted,
        echoes=entry.echoes,
        echo_texts=entry.echo_texts,
    )
    if entry.echo_guard_expire_time:
        receipt.echo_guard_expire_time.CopyFrom(timestamp(entry.echo_guard_expire_time))
    for dest, status in entry.destinations.items():
        d = receipt.destinations.add(name=dest, done=status.done)
        if status.done:
            d.complete_time.CopyFrom(timestamp(status.time))
    if entry.complete_time:
        receipt.complete_time.CopyFrom(timestamp(entry.complete_time))
    if entry.shred_horizon_time:
        receipt.shred_horizon_time.CopyFrom(timestamp(entry.shred_horizon_time))
    sign(receipt)
    return receipt


def memory_proto(view: MemoryView) -> memories_pb2.Memory:
    """A Memory message of one version (embeddings are input only)."""
    memory = memories_pb2.Memory()
    fill_memory(memory, view)
    return memory


def fill_memory(memory: memories_pb2.Memory, view: MemoryView) -> None:
    """Write ``view`` into the empty ``memory`` (:func:`memory_proto`), in place.

    In place for the same reason as :func:`fill_turn`.
    """
    meta = view.meta
    memory.name = meta.name
    memory.kind = memories_pb2.Memory.Kind.Value(meta.kind)
    memory.text = view.content.text
    memory.state = _STATES[meta.state]
    memory.version = view.version
    memory.status = memories_pb2.Memory.Status.Value(view.status)
    memory.slot = view.content.slot
    memory.scope = view.content.scope
    for n, v in view.sources:
        memory.sources.add(name=n, version=v)
    memory.supersedes = meta.supersedes if view.version == meta.version else 0
    set_time(memory.create_time, meta.create_time)
    set_time(memory.update_time, meta.update_time)
    if meta.direction:
        memory.direction = memories_pb2.Memory.Direction.Value(meta.direction)
    if meta.trigger:
        memory.trigger = memories_pb2.Trigger.Value(meta.trigger)
    if meta.origin:
        memory.origin = memories_pb2.Memory.Origin.Value(meta.origin)
    if meta.due_time:
        set_time(memory.due_time, meta.due_time)
    if meta.state in (PENDING, COMMITTED) and meta.expire_time:
        set_time(memory.expire_time, meta.expire_time)
    if view.content.metadata is not None:
        memory.metadata.update(view.content.metadata)
    if view.content.edge is not None:
        subject, predicate, obj = view.content.edge
        memory.edge.SetInParent()
        memory.edge.subject = subject
        memory.edge.predicate = predicate
        memory.edge.object = obj


def hit_proto(view: TurnView | MemoryView, score: float) -> retrieval_pb2.Hit:
    """A Hit message: ``score`` and the turn or memory of ``view``."""
    hit = retrieval_pb2.Hit()
    fill_hit(hit, view, score)
    return hit


def fill_hit(hit: retrieval_pb2.Hit, view: TurnView | MemoryView, score: float) -> None:
    """Write a hit into the empty ``hit`` in place (``reply.hits.add()``).

    In place for the same reason as :func:`fill_turn`.
    """
    hit.score = score
    if isinstance(view, TurnView):
        fill_turn(hit.turn, view)
    else:
        fill_memory(hit.memory, view)


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
    """A ContextBundle message (see :mod:`server.retrieval._context`)."""
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
