"""The ``lethe.v1.Memories`` servicer.

Validation follows API.md: a memory's text is at most 64 KiB of UTF-8 and
required unless it is a ``GRAPH_EDGE`` with an edge; at most 1000 sources,
each a turn or memory of the same owner at a version ≥ 1; direction, trigger
and status default from the kind and may not contradict it.
``TransitionMemory`` follows each kind's state machine
(:data:`server.store._shapes.TRANSITIONS`); ``ResolvePreference`` picks the
narrowest applicable scope, ``EXPLICIT`` before ``INFERRED``.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import duration_pb2, json_format

from lethe.v1 import common_pb2, memories_pb2, memories_pb2_grpc, threads_pb2
from server import _tagger as tagger
from server._names import check_id, new_id, parse_memory, parse_owner, parse_record
from server._steps import step
from server.edge import authorize
from server.errors import InvalidArgument, Reason
from server.retrieval import Retriever, echo_shingles
from server.services._common import (
    MAX_BATCH,
    MAX_TEXT_BYTES,
    STEP_TURNS,
    check_text,
    check_vector,
    enum_name,
    fit,
    owner_page,
    page_tokens,
    retention,
    seconds,
    states,
)
from server.services._convert import memory_proto
from server.store import (
    COMMITTED,
    KIND_DEFAULTS,
    PENDING,
    MemoryContent,
    MemoryDraft,
    MemoryView,
    MemoryWrite,
    SlotConflict,
    Store,
    TurnDraft,
)

MAX_FIELD_BYTES = 1024
MAX_METADATA_BYTES = 256 * 1024
"""Largest ``Memory.metadata``, as compact JSON in UTF-8 (bytes)."""
_ORDERS = {"", "name", "create_time"}
"""``ListMemoriesRequest.order_by`` values: id order ("" or "name") or creation order."""
_MASK_PATHS = {"text", "slot", "scope", "edge", "sources", "due_time", "embedding", "metadata"}


def _metadata(memory: memories_pb2.Memory) -> dict[str, Any] | None:
    """``memory.metadata`` as a JSON object, or None when it is not set.

    Raises:
        InvalidArgument: larger than ``MAX_METADATA_BYTES``, or a number that
            is not finite (JSON has no NaN or infinity).
    """
    if not memory.HasField("metadata"):
        return None
    try:
        data: dict[str, Any] = json_format.MessageToDict(memory.metadata)
        encoded = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    except (json_format.Error, ValueError):
        raise InvalidArgument("memory.metadata", "numbers must be finite") from None
    if len(encoded) > MAX_METADATA_BYTES:
        raise InvalidArgument("memory.metadata", f"at most {MAX_METADATA_BYTES} bytes as JSON")
    return data


MAX_TAGS = 32


def _embedded_text(content: MemoryContent) -> str:
    """What the server embeds of a memory: its text, or its graph edge's words."""
    return content.text or (" ".join(content.edge) if content.edge else "")


def _sources(refs: Any, owner: str) -> list[tuple[str, int]]:
    if len(refs) > MAX_BATCH:
        raise InvalidArgument("memory.sources", f"at most {MAX_BATCH} sources")
    out: list[tuple[str, int]] = []
    seen = set()
    for i, ref in enumerate(refs):
        field = f"memory.sources[{i}]"
        if parse_record(ref.name, f"{field}.name").owner != owner:
            raise InvalidArgument(f"{field}.name", "must name a record of the same owner")
        if ref.version < 1:
            raise InvalidArgument(f"{field}.version", "must be the exact version (>= 1)")
        if ref.name in seen:
            raise InvalidArgument(f"{field}.name", "named twice")
        seen.add(ref.name)
        out.append((ref.name, int(ref.version)))
    return out


class MemoriesService(memories_pb2_grpc.MemoriesServicer):
    """``lethe.v1.Memories``."""

    def __init__(
        self, store: Store, retriever: Retriever, pending_ttl: float, *, rules: bool = True
    ) -> None:
        self.store = store
        self.retriever = retriever
        self.pending_ttl = pending_ttl
        self.rules = rules  # the write-time rules (``--tagger rules``)
        self.page_tokens = page_tokens()

    def _draft(self, memory: memories_pb2.Memory, owner: str, *, creating: bool) -> MemoryDraft:
        kind = enum_name(memories_pb2.Memory.Kind, memory.kind, "memory.kind")
        if creating and not kind:
            raise InvalidArgument("memory.kind", "required")
        text = check_text(memory.text, "memory.text", limit=MAX_TEXT_BYTES, required=False)
        slot = check_text(memory.slot, "memory.slot", limit=MAX_FIELD_BYTES, required=False)
        scope = check_text(memory.scope, "memory.scope", limit=MAX_FIELD_BYTES, required=False)
        edge = None
        if memory.HasField("edge"):
            parts = (memory.edge.subject, memory.edge.predicate, memory.edge.object)
            for name, part in zip(("subject", "predicate", "object"), parts, strict=True):
                check_text(part, f"memory.edge.{name}", limit=MAX_FIELD_BYTES, required=True)
            edge = parts
        if creating:
            if kind == "GRAPH_EDGE" and edge is None:
                raise InvalidArgument("memory.edge", "required for GRAPH_EDGE")
            if not text.strip() and edge is None:
                raise InvalidArgument("memory.text", "must not be empty")
        direction = enum_name(memories_pb2.Memory.Direction, memory.direction, "memory.direction")
        trigger = enum_name(memories_pb2.Trigger, memory.trigger, "memory.trigger")
        status = enum_name(memories_pb2.Memory.Status, memory.status, "memory.status")
        origin = enum_name(memories_pb2.Memory.Origin, memory.origin, "memory.origin")
        if creating and kind == "PREFERENCE" and not origin:
            origin = "EXPLICIT"  # a preference the client states is explicit
        if kind:
            want_direction, want_trigger, want_status = KIND_DEFAULTS[kind]
            for field, given, want in (
                ("memory.direction", direction, want_direction),
                ("memory.trigger", trigger, want_trigger),
                ("memory.status", status, want_status),
            ):
                if given and want and given != want:
                    raise InvalidArgument(field, f"{given} contradicts kind {kind} ({want})")
                if given and not want:
                    raise InvalidArgument(field, f"kind {kind} takes no {field.split('.')[1]}")
        embedding = check_vector(memory.embedding, "memory.embedding")
        embedder = self.retriever.embedder
        if embedder and embedding is not None and embedding.shape[0] != embedder.dim:
            raise InvalidArgument(
                "memory.embedding",
                f"dimension {embedding.shape[0]} differs from the server embedder's {embedder.dim}",
                reason=Reason.DIMENSION_MISMATCH,
            )
        return MemoryDraft(
            kind=kind,
            content=MemoryContent(text, slot, scope, edge, metadata=_metadata(memory)),
            sources=_sources(memory.sources, owner),
            direction=direction,
            trigger=trigger,
            status=status,
            origin=origin,
            due_time=seconds(memory.due_time) if memory.HasField("due_time") else 0.0,
            embedding=embedding,
        )

    def _embed(self, draft: MemoryDraft, owner: str) -> None:
        """Embed a draft that has no client vector, once the owner's vectors are current.

        Either way, with a client vector too, the owner's vectors are made the
        embedder's first (a change of embedder re-embeds them).
        """
        self.retriever.ensure_vectors(owner)
        if draft.embedding is None:
            text = _embedded_text(draft.content)
            draft.embedding = (
                self.retriever.embed_texts([text], owner=owner)[0] if text.strip() else None
            )

    def candidates(
        self, owner: str, request: threads_pb2.AppendTurnsRequest, drafts: list[TurnDraft]
    ) -> list[list[MemoryDraft]]:
        """The candidate memories of each turn of an append, validated and embedded before storing.

        They are the client's own ``tags`` where it ``tagged`` the turn,
        otherwise what the write-time rules of :mod:`server._tagger` propose.
        The store writes them with the turns, in one transaction.

        Raises:
            InvalidArgument: more than ``MAX_TAGS`` tags on a turn, or a malformed
                tag (the field names the turn and tag); nothing is stored.
        """
        out: list[list[MemoryDraft]] = []
        for i, (turn, draft) in enumerate(zip(request.turns, drafts, strict=True)):
            if i and i % STEP_TURNS == 0:
                step()  # a long append's tagging in steps (server._steps)
            if len(turn.tags) > MAX_TAGS:
                raise InvalidArgument(f"turns[{i}].tags", f"at most {MAX_TAGS} tags per turn")
            found: list[MemoryDraft] = []
            if turn.tagged or turn.tags:
                for j, tag in enumerate(turn.tags):
                    try:
                        found.append(self._draft(tag, owner, creating=True))
                    except InvalidArgument as exc:
                        raise InvalidArgument(
                            f"turns[{i}].tags[{j}].{exc.field.removeprefix('memory.')}",
                            exc.description,
                            reason=exc.reason,
                        ) from None
            elif self.rules:
                role = common_pb2.Role.Name(common_pb2.Role.ValueType(draft.role))
                when = draft.time if draft.time is not None else time.time()
                found.extend(
                    MemoryDraft(
                        proposal.kind,
                        MemoryContent(proposal.text),
                        due_time=proposal.due_time or 0.0,
                        origin="INFERRED",
                    )
                    for proposal in tagger.propose(role, turn.text, when)
                )
            for candidate in found:
                self._embed(candidate, owner)
            out.append(found)
        return out

    def CreateMemory(  # noqa: N802
        self, request: memories_pb2.CreateMemoryRequest, context: grpc.ServicerContext
    ) -> memories_pb2.Memory:
        """``Memories.CreateMemory``: publish a memory with its lineage, in one transaction."""
        owner = parse_owner(request.parent, "parent")
        authorize(owner)
        memory_id = check_id(request.memory_id, "memory_id") if request.memory_id else new_id()
        ret = request.retention if request.HasField("retention") else None
        draft = self._new_draft(request.memory, ret, owner)
        return self._written(
            owner,
            lambda: self.store.create_memory(
                owner,
                memory_id,
                draft,
                commit=request.memory.state == common_pb2.COMMITTED,
                pending_ttl=self.pending_ttl,
                shingler=echo_shingles,
            ),
        )

    def _new_draft(
        self, memory: memories_pb2.Memory, ret: duration_pb2.Duration | None, owner: str
    ) -> MemoryDraft:
        """A memory that may be created, checked (:meth:`_checked_new`) and embedded."""
        draft = self._checked_new(memory, ret, owner)
        self._embed(draft, owner)
        return draft

    def _checked_new(
        self, memory: memories_pb2.Memory, ret: duration_pb2.Duration | None, owner: str
    ) -> MemoryDraft:
        """A memory that may be created, checked as ``CreateMemory`` checks one.

        Raises:
            InvalidArgument: a ``state`` other than ``PENDING`` or
                ``COMMITTED``, a bad ``retention``, or a bad memory field.
        """
        if memory.state not in (0, common_pb2.PENDING, common_pb2.COMMITTED):
            raise InvalidArgument("memory.state", "must be PENDING or COMMITTED")
        draft = self._draft(memory, owner, creating=True)
        if ret is not None:
            draft.retention = retention(ret, "retention")
        return draft

    def _written(self, owner: str, write: Callable[[], MemoryView]) -> memories_pb2.Memory:
        """Run one memory's store write, announce a slot conflict, index what it wrote.

        Raises:
            SlotConflict: after the ``SLOT_CONFLICT`` event names the holder.
        """
        try:
            view = write()
        except SlotConflict as conflict:
            self.store.emit_event(owner, "SLOT_CONFLICT", conflict.holder)
            raise
        self.retriever.on_write(owner, [view.meta])
        return memory_proto(view)

    def GetMemory(  # noqa: N802
        self, request: memories_pb2.GetMemoryRequest, context: grpc.ServicerContext
    ) -> memories_pb2.Memory:
        """``Memories.GetMemory``: read a memory's current version or an explicit one."""
        name = parse_memory(request.name, "name")
        authorize(name.owner)
        if request.version < 0:
            raise InvalidArgument("version", "must not be negative")
        return memory_proto(self.store.get_memory(name.owner, name.memory, request.version))

    def ListMemories(  # noqa: N802
        self, request: memories_pb2.ListMemoriesRequest, context: grpc.ServicerContext
    ) -> memories_pb2.ListMemoriesResponse:
        """``Memories.ListMemories``: one page of the owner's current memories, filtered.

        In id order, or in creation order (``order_by="create_time"``).
        """
        owner, size, after = owner_page(request, self.page_tokens)
        if request.order_by not in _ORDERS:
            raise InvalidArgument("order_by", f"must be one of {sorted(_ORDERS)}")
        by_creation = request.order_by == "create_time"
        kinds = {enum_name(memories_pb2.Memory.Kind, k, "kinds") for k in request.kinds}
        statuses = {enum_name(memories_pb2.Memory.Status, k, "statuses") for k in request.statuses}
        views, nxt = self.store.list_memories(
            owner,
            after,
            size,
            kinds=kinds - {""},
            states=states(request.states) if request.states else {PENDING, COMMITTED},
            statuses=statuses - {""},
            by_creation=by_creation,
        )
        # The cursor of a page cut short: the last kept memory's id, or its
        # record number in creation order.
        cursors = {v.meta.name: str(v.meta.rid) if by_creation else v.meta.memory_id for v in views}
        memories, nxt = fit([memory_proto(v) for v in views], nxt, lambda m: cursors[m.name])
        return memories_pb2.ListMemoriesResponse(
            memories=memories,
            next_page_token=self.page_tokens.issue(request, nxt),
        )

    def UpdateMemory(  # noqa: N802
        self, request: memories_pb2.UpdateMemoryRequest, context: grpc.ServicerContext
    ) -> memories_pb2.Memory:
        """``Memories.UpdateMemory``: write a new version of a memory (a correction)."""
        name = parse_memory(request.memory.name, "memory.name")
        authorize(name.owner)
        write, embed = self._update_write(request, name.memory)
        self._embed_writes(name.owner, [(write, embed)])
        store_write: Callable[..., MemoryView] = self.store.update_memory
        if request.allow_missing:  # create or update, chosen in the store
            store_write = functools.partial(self.store.upsert_memory, commit=write.commit)
        return self._written(
            name.owner,
            lambda: store_write(
                name.owner,
                name.memory,
                write.draft,
                write.paths,
                write.expected_version,
                self.pending_ttl,
                keep_embedding=write.keep_embedding,
                shingler=echo_shingles,
            ),
        )

    def BatchUpdateMemories(  # noqa: N802
        self, request: memories_pb2.BatchUpdateMemoriesRequest, context: grpc.ServicerContext
    ) -> memories_pb2.BatchUpdateMemoriesResponse:
        """``Memories.BatchUpdateMemories``: up to 1000 ``UpdateMemory`` requests, all or none.

        Every request is checked as ``UpdateMemory`` checks one (a refusal
        names it: ``requests[i].…``), the texts the server embeds are embedded
        in one embedder call, then the store writes them in one write op
        (:meth:`server.store.Store.batch_update_memories`).

        Raises:
            InvalidArgument: no requests or more than ``MAX_BATCH``; a name
                not under ``parent`` or given twice; a request ``UpdateMemory``
                would refuse (the field names it).
            LetheError: the store's first refusal, naming its request; nothing
                is written.
        """
        owner = parse_owner(request.parent, "parent")
        authorize(owner)
        if not request.requests:
            raise InvalidArgument("requests", "at least one request")
        if len(request.requests) > MAX_BATCH:
            raise InvalidArgument("requests", f"at most {MAX_BATCH} requests")
        writes: list[tuple[MemoryWrite, bool]] = []
        seen: set[str] = set()
        for i, item in enumerate(request.requests):
            try:
                name = parse_memory(item.memory.name, "memory.name")
                if name.owner != owner:
                    raise InvalidArgument("memory.name", f"must be a memory of {request.parent}")
                if name.memory in seen:
                    raise InvalidArgument("memory.name", "named twice in the batch")
                seen.add(name.memory)
                writes.append(self._update_write(item, name.memory))
            except InvalidArgument as exc:
                raise InvalidArgument(
                    f"requests[{i}].{exc.field}", exc.description, reason=exc.reason
                ) from None
        self._embed_writes(owner, writes)
        try:
            views = self.store.batch_update_memories(
                owner, [w for w, _ in writes], self.pending_ttl, shingler=echo_shingles
            )
        except SlotConflict as conflict:
            self.store.emit_event(owner, "SLOT_CONFLICT", conflict.holder)
            raise
        self.retriever.on_write(owner, [view.meta for view in views])
        return memories_pb2.BatchUpdateMemoriesResponse(
            memories=[memory_proto(view) for view in views]
        )

    def _update_write(
        self, request: memories_pb2.UpdateMemoryRequest, memory_id: str
    ) -> tuple[MemoryWrite, bool]:
        """An ``UpdateMemory`` request checked as API.md says; its vector is not made yet.

        Returns:
            The write, and whether its vector follows its text (the server
            embeds the text unless the request carries a vector).

        With ``allow_missing`` the memory is checked as ``CreateMemory``
        checks one (it may be created; which applies is decided in the store,
        see ``UpdateMemoryRequest.allow_missing``).

        Raises:
            InvalidArgument: a negative ``expected_version``, an unknown
                ``update_mask`` path, a bad memory field; without
                ``allow_missing`` a set ``kind`` or ``retention``, or empty text.
        """
        if request.expected_version < 0:
            raise InvalidArgument("expected_version", "must not be negative")
        paths = set(request.update_mask.paths)
        unknown = paths - _MASK_PATHS
        if unknown:
            raise InvalidArgument("update_mask", f"unknown or immutable paths {sorted(unknown)}")
        if not paths:
            paths = {"text", "slot", "scope", "edge", "sources", "due_time"}
            if request.memory.embedding:
                paths.add("embedding")
            if request.memory.HasField("metadata"):
                paths.add("metadata")
        owner = parse_memory(request.memory.name, "memory.name").owner
        keep = "text" not in paths and "edge" not in paths and "embedding" not in paths
        if request.allow_missing:
            ret = request.retention if request.HasField("retention") else None
            # The vector of the create, and of the update when its text changes.
            draft = self._checked_new(request.memory, ret, owner)
            embed = True
        else:
            if request.memory.kind:
                raise InvalidArgument("memory.kind", "is immutable")
            if request.HasField("retention"):
                raise InvalidArgument("retention", "applies only with allow_missing")
            draft = self._draft(request.memory, owner, creating=False)
            if "text" in paths and not draft.content.text.strip() and draft.content.edge is None:
                raise InvalidArgument("memory.text", "must not be empty")
            embed = "text" in paths or "edge" in paths  # the vector follows the text
            if not embed and "embedding" not in paths:
                draft.embedding = None
        return MemoryWrite(
            memory_id,
            draft,
            paths,
            expected_version=request.expected_version,
            allow_missing=request.allow_missing,
            commit=request.memory.state == common_pb2.COMMITTED,
            keep_embedding=keep,
        ), embed

    def _embed_writes(self, owner: str, writes: list[tuple[MemoryWrite, bool]]) -> None:
        """Make the owner's vectors current, then embed the writes' texts in one call.

        ``writes``: (write, whether its vector follows its text), as
        :meth:`_update_write` returns them. Only those whose vector follows
        the text and that carry no client vector are embedded; a text with no
        non-space character gets none.
        """
        self.retriever.ensure_vectors(owner)  # before any vector of the owner is written
        todo = [w.draft for w, embed in writes if embed and w.draft.embedding is None]
        texts = [_embedded_text(d.content) for d in todo]
        wanted = [(d, t) for d, t in zip(todo, texts, strict=True) if t.strip()]
        if not wanted:
            return
        vectors = self.retriever.embed_texts([t for _, t in wanted], owner=owner)
        for (draft, _), vector in zip(wanted, vectors, strict=True):
            draft.embedding = vector

    def TransitionMemory(  # noqa: N802
        self, request: memories_pb2.TransitionMemoryRequest, context: grpc.ServicerContext
    ) -> memories_pb2.Memory:
        """``Memories.TransitionMemory``: move a memory along its kind's state machine."""
        name = parse_memory(request.name, "name")
        authorize(name.owner)
        status = enum_name(memories_pb2.Memory.Status, request.status, "status")
        if not status:
            raise InvalidArgument("status", "required")
        if request.expected_version < 0:
            raise InvalidArgument("expected_version", "must not be negative")
        note = check_text(request.note, "note", limit=MAX_TEXT_BYTES, required=False)
        evidence = None
        if request.HasField("evidence"):
            parse_record(request.evidence.name, "evidence.name")
            if request.evidence.version < 1:
                raise InvalidArgument("evidence.version", "must be the exact version (>= 1)")
            evidence = (request.evidence.name, int(request.evidence.version))
        view = self.store.transition_memory(
            name.owner, name.memory, status, request.expected_version, evidence, note
        )
        self.retriever.on_write(name.owner, [view.meta])
        return memory_proto(view)

    def ResolvePreference(  # noqa: N802
        self, request: memories_pb2.ResolvePreferenceRequest, context: grpc.ServicerContext
    ) -> memories_pb2.ResolvePreferenceResponse:
        """``Memories.ResolvePreference``: the preference that applies to a slot in a scope."""
        owner = parse_owner(request.parent, "parent")
        authorize(owner)
        slot = check_text(request.slot, "slot", limit=MAX_FIELD_BYTES, required=True)
        scope = check_text(request.scope, "scope", limit=MAX_FIELD_BYTES, required=False)
        resolved, candidates = self.store.resolve_preference(owner, slot, scope)
        response = memories_pb2.ResolvePreferenceResponse(
            candidates=[memory_proto(v) for v in candidates]
        )
        if resolved is not None:
            response.preference.CopyFrom(memory_proto(resolved))
        return response
