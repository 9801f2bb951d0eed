# Generated from lethe/client/_memories_async.py by scripts/gen_sync_client.py: do not edit.
# Edit the source and run `.venv/bin/python scripts/gen_sync_client.py`.
"""The ``lethe.v1.Memories`` methods of the client.

Memories, their versions and statuses, and preferences: a method group of
:class:`lethe.client.Client`, which documents the errors, deadlines and
retries every method shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from google.protobuf import field_mask_pb2

from lethe.client._base_sync import ClientBase
from lethe.client._build import build
from lethe.client._types import DurationLike, EnumOr, MessageOr
from lethe.v1 import common_pb2, memories_pb2

__all__ = ["MemoriesMethods"]


class MemoriesMethods(ClientBase):
    """The methods of ``lethe.v1.Memories``, one per RPC."""

    def create_memory(
        self,
        parent: str,
        memory: MessageOr[memories_pb2.Memory],
        *,
        memory_id: str = "",
        retention: DurationLike | None = None,
        timeout: float | None = None,
    ) -> memories_pb2.Memory:
        """``Memories.CreateMemory``: publish a memory with its lineage.

        Args:
            parent: ``owners/{owner}``.
            memory: the memory (``kind`` and ``text`` at least; ``state``
                ``COMMITTED`` commits it when its sources are committed).
            memory_id: the id; "" lets the server choose.
            retention: how long it may live from now (seconds, ``timedelta`` or
                ``Duration``; the owner's default still applies if sooner); None:
                the owner's default only.
            timeout: deadline in seconds (default: the client's).

        Returns:
            The stored memory (version 1, or the next version of a forgotten id).

        Raises:
            AlreadyExists: the id is taken. SlotConflict: a second active fact
            on the slot and scope (``subject`` names the holder). SourceDeleted,
            SourceStale, SourceSealed: a source is gone, at another version, or
            sealed. DimensionMismatch: the embedding's dimension.
        """
        request = build(
            memories_pb2.CreateMemoryRequest,
            {"parent": parent, "memory_id": memory_id, "memory": memory, "retention": retention},
        )
        return self._call(self.stubs.memories.CreateMemory, request, timeout)

    def get_memory(
        self, name: str, *, version: int = 0, timeout: float | None = None
    ) -> memories_pb2.Memory:
        """``Memories.GetMemory``.

        Args:
            name: ``owners/{owner}/memories/{memory}``.
            version: an explicit version, 0 for the current one.
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound: never existed, or no such version. RecordDeleted: deleted
            or expired. Sealed: sealed in a repair.
        """
        request = memories_pb2.GetMemoryRequest(name=name, version=version)
        return self._call(self.stubs.memories.GetMemory, request, timeout)

    def list_memories(
        self,
        parent: str,
        *,
        kinds: Iterable[EnumOr[memories_pb2.Memory.Kind.ValueType]] = (),
        states: Iterable[EnumOr[common_pb2.State.ValueType]] = (),
        statuses: Iterable[EnumOr[memories_pb2.Memory.Status.ValueType]] = (),
        page_size: int = 0,
        page_token: str = "",
        order_by: str = "",
        timeout: float | None = None,
    ) -> memories_pb2.ListMemoriesResponse:
        """``Memories.ListMemories``: one page of an owner's memories, by id or creation.

        Args:
            parent: ``owners/{owner}``.
            kinds: kinds to list (default all).
            states: states to list (default ``PENDING`` and ``COMMITTED``).
            statuses: statuses to list (default all).
            page_size: memories per page (0: 100; at most 1000); may change
                from page to page.
            page_token: ``next_page_token`` of the previous page (of a request
                with the same other arguments).
            order_by: "" or ``"name"``: id order; ``"create_time"``: creation
                order, oldest first (an update keeps a memory's place).
            timeout: deadline in seconds (default: the client's).

        Raises:
            BadField: an unknown ``order_by`` or enum value, a negative
                ``page_size``, or a ``page_token`` this server process did not
                issue for these arguments.
        """
        request = build(
            memories_pb2.ListMemoriesRequest,
            {
                "parent": parent,
                "kinds": kinds,
                "states": states,
                "statuses": statuses,
                "page_size": page_size,
                "page_token": page_token,
                "order_by": order_by,
            },
        )
        return self._call(self.stubs.memories.ListMemories, request, timeout)

    def iter_memories(
        self,
        parent: str,
        *,
        kinds: Iterable[EnumOr[memories_pb2.Memory.Kind.ValueType]] = (),
        states: Iterable[EnumOr[common_pb2.State.ValueType]] = (),
        statuses: Iterable[EnumOr[memories_pb2.Memory.Status.ValueType]] = (),
        page_size: int = 0,
        order_by: str = "",
        timeout: float | None = None,
    ) -> Iterator[memories_pb2.Memory]:
        """Every memory of an owner, page after page (``ListMemories``; arguments as there)."""
        kinds, states, statuses = list(kinds), list(states), list(statuses)
        token = ""
        while True:
            page = self.list_memories(
                parent,
                kinds=kinds,
                states=states,
                statuses=statuses,
                page_size=page_size,
                page_token=token,
                order_by=order_by,
                timeout=timeout,
            )
            yield from page.memories
            token = page.next_page_token
            if not token:
                return

    def update_memory(
        self,
        memory: MessageOr[memories_pb2.Memory],
        *,
        update_mask: field_mask_pb2.FieldMask | Sequence[str] | None = None,
        expected_version: int = 0,
        allow_missing: bool = False,
        retention: DurationLike | None = None,
        timeout: float | None = None,
    ) -> memories_pb2.Memory:
        """``Memories.UpdateMemory``: a new version (a correction, for facts and preferences).

        With ``allow_missing`` it is an upsert, one call: a memory that does
        not exist is created under ``memory.name`` (``memory`` whole, as
        :meth:`create_memory` takes it: ``kind`` required, ``state``
        ``COMMITTED`` commits; ``update_mask`` not applied), one that exists
        is updated (its ``kind`` must be ``memory.kind``).

        Args:
            memory: the memory with its ``name`` and the new field values.
            update_mask: the fields to change (``["text"]``); None changes the
                mutable fields the server takes by default.
            expected_version: the etag: refuse unless this is the current
                version (0: no check).
            allow_missing: create the memory if it does not exist (AIP-134).
            retention: with ``allow_missing``, the created memory's retention
                (as :meth:`create_memory`'s); not applied to an existing memory.
            timeout: deadline in seconds (default: the client's).

        Returns:
            The new version; with ``allow_missing``, the created memory when
            its ``create_time`` equals its ``update_time``.

        Raises:
            NotFound / RecordDeleted: the memory (with ``allow_missing``:
            ``RecordDeleted`` for a deleted or expired memory whose deletion is
            not complete yet, ``NotFound`` for a non-zero ``expected_version``
            on a missing one). VersionMismatch: ``expected_version`` is not
            current. SlotConflict, SourceDeleted, SourceStale, SourceSealed: as
            :meth:`create_memory`. Sealed: sealed in a repair. BadField:
            ``memory.kind`` is not the existing memory's kind. Aborted: with
            ``allow_missing``, the id kept changing hands under the call
            (created and forgotten meanwhile); retry.
        """
        request = build(
            memories_pb2.UpdateMemoryRequest,
            {
                "memory": memory,
                "update_mask": update_mask,
                "expected_version": expected_version,
                "allow_missing": allow_missing,
                "retention": retention,
            },
        )
        return self._call(self.stubs.memories.UpdateMemory, request, timeout)

    def batch_update_memories(
        self,
        parent: str,
        requests: Sequence[MessageOr[memories_pb2.UpdateMemoryRequest]],
        *,
        timeout: float | None = None,
    ) -> list[memories_pb2.Memory]:
        """``Memories.BatchUpdateMemories``: up to 1000 updates or upserts, all or none.

        Each request is what :meth:`update_memory` sends, as a message or a
        mapping of its arguments (``{"memory": {...}, "update_mask":
        ["text"], "expected_version": 2, "allow_missing": True,
        "retention": 3600}``); every ``memory.name`` is a memory of
        ``parent``, each at most once. Either every request is written, in
        one server transaction, or none is.

        Args:
            parent: ``owners/{owner}``.
            requests: 1 to 1000 ``UpdateMemoryRequest`` (or mappings).
            timeout: deadline in seconds (default: the client's).

        Returns:
            The written memories, in request order (a created one's
            ``create_time`` equals its ``update_time``).

        Raises:
            BadField: no requests or more than 1000, a name not under
            ``parent`` or given twice, or a request :meth:`update_memory`
            would refuse (the field names it: ``requests[3].memory.text``).
            Any error of :meth:`update_memory`, for the first request
            refused (its message starts ``requests[3]:``); nothing is written.
        """
        request = build(
            memories_pb2.BatchUpdateMemoriesRequest, {"parent": parent, "requests": list(requests)}
        )
        response = self._call(self.stubs.memories.BatchUpdateMemories, request, timeout)
        return list(response.memories)

    def transition_memory(
        self,
        name: str,
        *,
        status: EnumOr[memories_pb2.Memory.Status.ValueType],
        expected_version: int = 0,
        evidence: MessageOr[common_pb2.SourceRef] | None = None,
        note: str = "",
        timeout: float | None = None,
    ) -> memories_pb2.Memory:
        """``Memories.TransitionMemory``: move a memory along its kind's state machine.

        Args:
            name: the memory.
            status: the target status (``"FULFILLED"``, ``"ANSWERED"``, …).
            expected_version: the etag (0: no check).
            evidence: the record that closes it, at its exact version.
            note: a note kept with the new version (content: encrypted).
            timeout: deadline in seconds (default: the client's).

        Raises:
            IllegalTransition: the kind's state machine forbids it.
            VersionMismatch: ``expected_version`` is not current. NotFound /
            RecordDeleted: the memory. SourceDeleted, SourceStale, SourceSealed:
            the evidence.
        """
        request = build(
            memories_pb2.TransitionMemoryRequest,
            {
                "name": name,
                "expected_version": expected_version,
                "status": status,
                "evidence": evidence,
                "note": note,
            },
        )
        return self._call(self.stubs.memories.TransitionMemory, request, timeout)

    def resolve_preference(
        self, parent: str, *, slot: str, scope: str = "", timeout: float | None = None
    ) -> memories_pb2.ResolvePreferenceResponse:
        """``Memories.ResolvePreference``: the applicable preference and the candidates.

        Args:
            parent: ``owners/{owner}``.
            slot: the preference's slot (``"reply.language"``).
            scope: the scope asked about; the narrowest applicable one wins.
            timeout: deadline in seconds (default: the client's).
        """
        request = build(
            memories_pb2.ResolvePreferenceRequest, {"parent": parent, "slot": slot, "scope": scope}
        )
        return self._call(self.stubs.memories.ResolvePreference, request, timeout)
