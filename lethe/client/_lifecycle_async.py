"""The ``lethe.v1.Lifecycle`` methods of the client.

Commit, expiry, forgetting, lineage and audit: a method group of
:class:`lethe.client.AsyncClient`, which documents the errors, deadlines and
retries every method shares.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc

from lethe.client._base_async import AsyncClientBase
from lethe.client._build import build
from lethe.client._errors import error_from_rpc
from lethe.client._routing import routed
from lethe.client._types import DurationLike, EnumOr, MessageOr, TimeLike
from lethe.v1 import common_pb2, lifecycle_pb2

__all__ = ["AsyncLifecycleMethods"]


class AsyncLifecycleMethods(AsyncClientBase):
    """The methods of ``lethe.v1.Lifecycle``, one per RPC."""

    async def commit(
        self,
        names: Iterable[str],
        *,
        include_sources: bool = False,
        timeout: float | None = None,
    ) -> lifecycle_pb2.CommitResponse:
        """``Lifecycle.Commit``: make pending turns and memories memory.

        Args:
            names: turn or memory names of one owner.
            include_sources: also commit the pending sources of the named memories.
            timeout: deadline in seconds (default: the client's).

        Returns:
            ``committed``: every record committed, at its version.

        Raises:
            SourcePending: a memory's source is pending (pass ``include_sources``).
            NotFound / RecordDeleted: a named record. Sealed: a sealed record.
        """
        request = build(
            lifecycle_pb2.CommitRequest, {"names": names, "include_sources": include_sources}
        )
        return await self._call(self.stubs.lifecycle.Commit, request, timeout)

    async def extend_pending(
        self,
        names: Iterable[str],
        *,
        ttl: DurationLike | None = None,
        timeout: float | None = None,
    ) -> lifecycle_pb2.ExtendPendingResponse:
        """``Lifecycle.ExtendPending``: push back the expiry of pending records.

        Args:
            names: pending turn or memory names of one owner.
            ttl: the new lifetime from now (seconds, ``timedelta`` or ``Duration``).
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound / RecordDeleted: a named record.
        """
        request = build(lifecycle_pb2.ExtendPendingRequest, {"names": names, "ttl": ttl})
        return await self._call(self.stubs.lifecycle.ExtendPending, request, timeout)

    async def set_retention(
        self,
        names: Iterable[str],
        *,
        expire_time: TimeLike | None = None,
        ttl: DurationLike | None = None,
        clear: bool = False,
        timeout: float | None = None,
    ) -> lifecycle_pb2.SetRetentionResponse:
        """``Lifecycle.SetRetention``: how long records, threads or an owner's new records live.

        From their expiry on, reads treat them as forgotten (``RecordDeleted``),
        what was derived from them too; the sweeper then forgets them with a
        receipt (reason ``RETENTION``). Not retried.

        Args:
            names: turn, memory or thread names of one owner, or ``owners/{o}``
                alone (its default for the records created from now on).
            expire_time: when they expire (aware ``datetime``, epoch seconds or
                ``Timestamp``); not for an owner.
            ttl: how long from now (for an owner: from each new record's creation).
            clear: remove the retention instead.
            timeout: deadline in seconds (default: the client's).

        Returns:
            ``records`` changed, ``expire_time``, and for an owner ``owner_default``.

        Raises:
            NotFound / RecordDeleted: a named record. Sealed: a sealed record or a
            repair thread. BadField: not exactly one of ``expire_time``, ``ttl``
            and ``clear``.
        """
        request = build(
            lifecycle_pb2.SetRetentionRequest,
            {"names": names, "expire_time": expire_time, "ttl": ttl, "clear": clear},
        )
        return await self._call(self.stubs.lifecycle.SetRetention, request, timeout)

    async def forget(
        self,
        names: Iterable[str] = (),
        *,
        range: MessageOr[lifecycle_pb2.TurnRange] | None = None,
        responses: EnumOr[lifecycle_pb2.ForgetRequest.Responses.ValueType] | None = None,
        reason: str = "",
        echoes: EnumOr[common_pb2.EchoAction.ValueType] | None = None,
        echo_guard: DurationLike | None = None,
        timeout: float | None = None,
    ) -> common_pb2.DeletionReceipt:
        """``Lifecycle.Forget``: delete records, every descendant, and their keys.

        Returns when the deletion is effective for every reader. Not retried.

        Args:
            names: turn, memory, thread or owner names (one owner).
            range: a ``TurnRange`` (``{"thread": …, "from_seq": 3, "to_seq": 7}``).
            responses: ``TAINT`` (default) or ``DELETE`` responses built on
                what is forgotten.
            reason: kept on the receipt; must not carry content (≤ 256 bytes).
            echoes: what to do with records that repeat a forgotten text
                without declaring it: ``REPORT``, ``TAINT`` (default),
                ``FORGET`` or ``IGNORE``.
            echo_guard: how long a later write that echoes a forgotten text is
                refused or tainted (seconds, ``timedelta`` or ``Duration``; 0:
                no guard; default: the server's ``--echo-guard-window``).
            timeout: deadline in seconds (default: the client's).

        Returns:
            The receipt: identifiers and counts, never content.

        Raises:
            NotFound / RecordDeleted: a named record.
        """
        request = build(
            lifecycle_pb2.ForgetRequest,
            {
                "names": names,
                "range": range,
                "responses": responses,
                "reason": reason,
                "echoes": echoes,
                "echo_guard": echo_guard,
            },
        )
        return await self._call(self.stubs.lifecycle.Forget, request, timeout)

    async def get_lineage(
        self,
        name: str,
        *,
        direction: EnumOr[lifecycle_pb2.GetLineageRequest.Direction.ValueType] | None = None,
        max_depth: int = 0,
        timeout: float | None = None,
    ) -> lifecycle_pb2.GetLineageResponse:
        """``Lifecycle.GetLineage``: the lineage edges around a record (names only).

        Args:
            name: a turn or memory.
            direction: ``ANCESTORS`` or ``DESCENDANTS``.
            max_depth: how far (0: the server's default).
            timeout: deadline in seconds (default: the client's).
        """
        request = build(
            lifecycle_pb2.GetLineageRequest,
            {"name": name, "direction": direction, "max_depth": max_depth},
        )
        return await self._call(self.stubs.lifecycle.GetLineage, request, timeout)

    async def list_deletions(
        self,
        parent: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> lifecycle_pb2.ListDeletionsResponse:
        """``Lifecycle.ListDeletions``: one page of an owner's deletion receipts.

        Args:
            parent: ``owners/{owner}``.
            page_size: receipts per page (0: 100; at most 1000).
            page_token: ``next_page_token`` of the previous page.
            timeout: deadline in seconds (default: the client's).
        """
        request = build(
            lifecycle_pb2.ListDeletionsRequest,
            {"parent": parent, "page_size": page_size, "page_token": page_token},
        )
        return await self._call(self.stubs.lifecycle.ListDeletions, request, timeout)

    async def iter_deletions(
        self, parent: str, *, page_size: int = 0, timeout: float | None = None
    ) -> AsyncIterator[common_pb2.DeletionReceipt]:
        """Every deletion receipt of an owner, page after page (``ListDeletions``)."""
        token = ""
        while True:
            page = await self.list_deletions(
                parent, page_size=page_size, page_token=token, timeout=timeout
            )
            for item in page.receipts:
                yield item
            token = page.next_page_token
            if not token:
                return

    async def audit(
        self, parent: str, *, timeout: float | None = None
    ) -> lifecycle_pb2.AuditReport:
        """``Lifecycle.Audit``: orphans, stale summaries, key and index drift (all 0 when healthy).

        Args:
            parent: ``owners/{owner}``.
            timeout: deadline in seconds (default: the client's).
        """
        request = lifecycle_pb2.AuditRequest(parent=parent)
        return await self._call(self.stubs.lifecycle.Audit, request, timeout)

    async def get_server_info(self, *, timeout: float | None = None) -> lifecycle_pb2.ServerInfo:
        """``Lifecycle.GetServerInfo``: the store's id and the public keys that sign its receipts.

        Verify a receipt with them offline: :func:`lethe.receipts.verify_receipt`
        (``[k.public_key for k in info.receipt_keys]``).

        Args:
            timeout: deadline in seconds (default: the client's).
        """
        request = lifecycle_pb2.GetServerInfoRequest()
        return await self._call(self.stubs.lifecycle.GetServerInfo, request, timeout)

    async def export_owner(
        self, parent: str, *, include_sealed: bool = False, timeout: float | None = None
    ) -> AsyncIterator[lifecycle_pb2.ExportItem]:
        """``Lifecycle.ExportOwner``: every item of an owner's export, in the stream's order.

        The header first, the summary last (an export without it is incomplete);
        :func:`lethe.remote.export_owner` writes them to a JSON Lines file and
        :func:`lethe.remote.read_export` reads one back. Not retried: a broken
        export is started again.

        Args:
            parent: ``owners/{owner}``.
            include_sealed: also sealed repair material.
            timeout: seconds for the whole stream; None (default): no deadline.

        Raises:
            LetheError: the call failed (raised while iterating).
        """
        request = build(
            lifecycle_pb2.ExportOwnerRequest, {"parent": parent, "include_sealed": include_sealed}
        )
        # Typed with the blocking stubs: the call of either flavour iterates its items.
        call: Any = self.stubs.lifecycle.ExportOwner(
            request, metadata=routed(self.metadata, request), timeout=timeout
        )
        try:
            async for item in call:
                yield item
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
