"""Lethe's messages as the JSON the MCP tools answer (structured content).

Names, versions, states and enum names as strings, times as RFC 3339 UTC
strings; fields that are unset are left out, embeddings never appear. Every
function returns a fresh ``dict`` of JSON values (str, int, float, bool,
lists and dicts of them).

Imports only protobuf and ``lethe.v1``.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import timestamp_pb2

from lethe.v1 import (
    common_pb2,
    lifecycle_pb2,
    memories_pb2,
    repairs_pb2,
    retrieval_pb2,
    threads_pb2,
)

__all__ = [
    "bundle_json",
    "concluded_json",
    "hit_json",
    "lineage_json",
    "memory_json",
    "receipt_json",
    "ref_json",
    "reopened_json",
    "thread_json",
    "time_json",
    "turn_json",
]

JSON = dict[str, Any]


def time_json(ts: timestamp_pb2.Timestamp) -> str | None:
    """``2026-12-01T09:00:00Z`` (RFC 3339, UTC), or None for an unset time."""
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToJsonString()


def _put_time(out: JSON, key: str, ts: timestamp_pb2.Timestamp) -> None:
    text = time_json(ts)
    if text is not None:
        out[key] = text


def ref_json(ref: common_pb2.SourceRef) -> JSON:
    """``{"name", "version"}`` of a source reference."""
    return {"name": ref.name, "version": ref.version}


def turn_json(turn: threads_pb2.Turn) -> JSON:
    """A turn: name, seq, role, state, version, text (when the reply held it), times, taint."""
    out: JSON = {
        "name": turn.name,
        "seq": turn.seq,
        "role": common_pb2.Role.Name(turn.role),
        "state": common_pb2.State.Name(turn.state),
        "version": turn.version,
    }
    if turn.text:
        out["text"] = turn.text
    if turn.speaker:
        out["speaker"] = turn.speaker
    _put_time(out, "time", turn.time)
    _put_time(out, "expire_time", turn.expire_time)
    if turn.tainted:
        out["tainted"] = True
    if turn.context_manifest:
        out["context_manifest"] = turn.context_manifest
    return out


def memory_json(memory: memories_pb2.Memory) -> JSON:
    """A memory: name, kind, text, state, version, status and its shape fields and lineage."""
    m = memories_pb2.Memory
    out: JSON = {
        "name": memory.name,
        "kind": m.Kind.Name(memory.kind),
        "text": memory.text,
        "state": common_pb2.State.Name(memory.state),
        "version": memory.version,
    }
    if memory.status:
        out["status"] = m.Status.Name(memory.status)
    if memory.direction:
        out["direction"] = m.Direction.Name(memory.direction)
    if memory.trigger:
        out["trigger"] = memories_pb2.Trigger.Name(memory.trigger)
    if memory.slot:
        out["slot"] = memory.slot
    if memory.scope:
        out["scope"] = memory.scope
    if memory.origin:
        out["origin"] = m.Origin.Name(memory.origin)
    _put_time(out, "due_time", memory.due_time)
    if memory.HasField("edge"):
        edge = memory.edge
        out["edge"] = {"subject": edge.subject, "predicate": edge.predicate, "object": edge.object}
    if memory.sources:
        out["sources"] = [ref_json(s) for s in memory.sources]
    if memory.supersedes:
        out["supersedes"] = memory.supersedes
    _put_time(out, "expire_time", memory.expire_time)
    return out


def hit_json(hit: retrieval_pb2.Hit) -> JSON:
    """A search hit: ``{"score", "turn": …}`` or ``{"score", "memory": …}``."""
    score = round(float(hit.score), 4)
    if hit.HasField("turn"):
        return {"score": score, "turn": turn_json(hit.turn)}
    return {"score": score, "memory": memory_json(hit.memory)}


def receipt_json(receipt: common_pb2.DeletionReceipt) -> JSON:
    """A deletion receipt: identifiers, counts and times, never content."""
    out: JSON = {
        "name": receipt.name,
        "targets": list(receipt.targets),
        "deleted": receipt.deleted,
        "cascaded": receipt.cascaded,
        "tainted": receipt.tainted,
        "rebuilds_requested": receipt.rebuilds_requested,
        "destinations": [{"name": d.name, "done": d.done} for d in receipt.destinations],
    }
    if receipt.reason:
        out["reason"] = receipt.reason
    _put_time(out, "request_time", receipt.request_time)
    _put_time(out, "complete_time", receipt.complete_time)
    _put_time(out, "shred_horizon_time", receipt.shred_horizon_time)
    return out


def thread_json(thread: threads_pb2.Thread) -> JSON:
    """A thread: name, kind, title and, for a repair, its source, first seq, state, outcome."""
    out: JSON = {"name": thread.name, "kind": threads_pb2.Thread.Kind.Name(thread.kind)}
    if thread.title:
        out["title"] = thread.title
    if thread.HasField("repair"):
        info = thread.repair
        repair: JSON = {
            "source_thread": info.source_thread,
            "from_seq": info.from_seq,
            "state": threads_pb2.RepairInfo.State.Name(info.state),
        }
        if info.outcome:
            repair["outcome"] = threads_pb2.RepairInfo.Outcome.Name(info.outcome)
        out["repair"] = repair
    return out


def bundle_json(bundle: retrieval_pb2.ContextBundle) -> JSON:
    """A context bundle: its manifest's name and size, then each part."""
    return {
        "manifest": bundle.manifest.name,
        "manifest_refs": len(bundle.manifest.refs),
        "open_items": [memory_json(m) for m in bundle.open_items],
        "preferences": [memory_json(m) for m in bundle.preferences],
        "recent_turns": [turn_json(t) for t in bundle.recent_turns],
        "memories": [hit_json(h) for h in bundle.memories],
        "summaries": [memory_json(m) for m in bundle.summaries],
    }


def reopened_json(reply: repairs_pb2.ReopenRepairResponse) -> JSON:
    """A reopened repair: the thread, its sealed turns and memories."""
    return {
        "repair": thread_json(reply.repair),
        "turns": [turn_json(t) for t in reply.turns],
        "memories": [memory_json(m) for m in reply.memories],
    }


def concluded_json(reply: repairs_pb2.ConcludeRepairResponse) -> JSON:
    """A concluded repair: the thread, the receipt, and the lesson when one was distilled."""
    out: JSON = {"repair": thread_json(reply.repair)}
    if reply.HasField("receipt"):
        out["receipt"] = receipt_json(reply.receipt)
    if reply.HasField("lesson"):
        out["lesson"] = memory_json(reply.lesson)
    return out


def lineage_json(reply: lifecycle_pb2.GetLineageResponse) -> list[JSON]:
    """Lineage edges, nearest first: ``[{"source": ref, "derivative": ref}]``."""
    return [
        {"source": ref_json(e.source), "derivative": ref_json(e.derivative)} for e in reply.edges
    ]
