"""The ``lethe.v1.Repairs`` methods of the client.

Sealing a conversation for repair, and concluding it: a method group of
:class:`lethe.client.AsyncClient`, which documents the errors, deadlines and
retries every method shares.
"""

from __future__ import annotations

from lethe.client._base_async import AsyncClientBase
from lethe.client._build import build
from lethe.client._types import EnumOr
from lethe.v1 import repairs_pb2, threads_pb2

__all__ = ["AsyncRepairsMethods"]


class AsyncRepairsMethods(AsyncClientBase):
    """The methods of ``lethe.v1.Repairs``, one per RPC."""

    async def seal_repair(
        self, thread: str, *, from_seq: int, timeout: float | None = None
    ) -> threads_pb2.Thread:
        """``Repairs.SealRepair``: seal ``from_seq`` and every later turn into a repair thread.

        Args:
            thread: the conversation thread.
            from_seq: the first sealed turn's seq.
            timeout: deadline in seconds (default: the client's).

        Returns:
            The new repair thread (``PAUSED``).

        Raises:
            NotFound / RecordDeleted: the thread or the turn.
        """
        request = repairs_pb2.SealRepairRequest(thread=thread, from_seq=from_seq)
        return await self._call(self.stubs.repairs.SealRepair, request, timeout)

    async def reopen_repair(
        self, name: str, *, acknowledge_restricted: bool = False, timeout: float | None = None
    ) -> repairs_pb2.ReopenRepairResponse:
        """``Repairs.ReopenRepair``: continue a repair with its sealed context.

        Args:
            name: the repair thread.
            acknowledge_restricted: needed for a ``PRESERVE_RESTRICTED`` repair.
            timeout: deadline in seconds (default: the client's).

        Raises:
            Restricted: a restricted repair without the acknowledgement.
            NotFound / RecordDeleted: the repair.
        """
        request = repairs_pb2.ReopenRepairRequest(
            name=name, acknowledge_restricted=acknowledge_restricted
        )
        return await self._call(self.stubs.repairs.ReopenRepair, request, timeout)

    async def pause_repair(self, name: str, *, timeout: float | None = None) -> threads_pb2.Thread:
        """``Repairs.PauseRepair``: step away from a repair; nothing is committed or destroyed.

        Raises:
            NotFound / RecordDeleted: the repair. IllegalTransition: it is concluded.
        """
        request = repairs_pb2.PauseRepairRequest(name=name)
        return await self._call(self.stubs.repairs.PauseRepair, request, timeout)

    async def conclude_repair(
        self,
        name: str,
        *,
        outcome: EnumOr[threads_pb2.RepairInfo.Outcome.ValueType],
        lesson_text: str = "",
        timeout: float | None = None,
    ) -> repairs_pb2.ConcludeRepairResponse:
        """``Repairs.ConcludeRepair``: ``DESTROY``, ``PRESERVE_RESTRICTED`` or ``DISTILL``.

        Args:
            name: the repair thread.
            outcome: how it ends.
            lesson_text: the agreed lesson, for ``DISTILL``.
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound / RecordDeleted: the repair. IllegalTransition: already concluded.
        """
        request = build(
            repairs_pb2.ConcludeRepairRequest,
            {"name": name, "outcome": outcome, "lesson_text": lesson_text},
        )
        return await self._call(self.stubs.repairs.ConcludeRepair, request, timeout)
