"""The ``lethe.v1.Repairs`` servicer.

Leaving is not concluding: no timer concludes, commits or destroys a repair.
``ConcludeRepair`` with ``DESTROY`` shreds the repair thread's ring (everything
sealed and appended is gone; a content-free receipt remains);
``PRESERVE_RESTRICTED`` keeps it sealed, and reopening then needs
``acknowledge_restricted``; ``DISTILL`` stores ``lesson_text`` as a committed
``LESSON`` memory whose only link is the repair's name (in its ``scope``), then
destroys the rest.
"""

from __future__ import annotations

import threading

import grpc

from lethe.v1 import repairs_pb2, repairs_pb2_grpc, threads_pb2
from server._names import parse_thread
from server.edge import authorize
from server.errors import FailedPrecondition, InvalidArgument, Reason
from server.lifecycle import Lifecycle
from server.retrieval import Retriever
from server.services._common import MAX_TEXT_BYTES, check_text
from server.services._convert import memory_proto, receipt_proto, thread_proto, turn_proto
from server.store import (
    REPAIR_CONCLUDED,
    REPAIR_CONTINUED,
    REPAIR_PAUSED,
    MemoryContent,
    MemoryDraft,
    Store,
)

_OUTCOMES = {
    threads_pb2.RepairInfo.DESTROY: "DESTROY",
    threads_pb2.RepairInfo.PRESERVE_RESTRICTED: "PRESERVE_RESTRICTED",
    threads_pb2.RepairInfo.DISTILL: "DISTILL",
}


class RepairsService(repairs_pb2_grpc.RepairsServicer):
    """``lethe.v1.Repairs``."""

    def __init__(self, store: Store, retriever: Retriever, lifecycle: Lifecycle) -> None:
        self.store = store
        self.retriever = retriever
        self.lifecycle = lifecycle
        # One conclusion at a time per repair: the state check, the lesson and
        # the shred must not interleave with another ConcludeRepair.
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def SealRepair(  # noqa: N802
        self, request: repairs_pb2.SealRepairRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Thread:
        """``Repairs.SealRepair``: seal a turn and every later one into a new repair thread."""
        name = parse_thread(request.thread, "thread")
        authorize(name.owner)
        if request.from_seq < 1:
            raise InvalidArgument("from_seq", "must be >= 1")
        return thread_proto(self.lifecycle.seal(name.owner, name.thread, request.from_seq))

    def ReopenRepair(  # noqa: N802
        self, request: repairs_pb2.ReopenRepairRequest, context: grpc.ServicerContext
    ) -> repairs_pb2.ReopenRepairResponse:
        """``Repairs.ReopenRepair``: reopen a repair and return what it holds."""
        name = parse_thread(request.name, "name")
        authorize(name.owner)
        meta = self.store.repair(name.owner, name.thread).meta
        allowed = [REPAIR_PAUSED, REPAIR_CONTINUED]
        if meta.repair_outcome == "PRESERVE_RESTRICTED":
            if not request.acknowledge_restricted:
                raise FailedPrecondition(
                    f"{request.name} is restricted; reopen with acknowledge_restricted",
                    reason=Reason.RESTRICTED,
                    subject=request.name,
                )
            allowed.append(REPAIR_CONCLUDED)
        repair = self.store.set_repair_state(name.owner, name.thread, allowed, REPAIR_CONTINUED)
        sealed, own, memories = self.store.repair_contents(name.owner, name.thread)
        return repairs_pb2.ReopenRepairResponse(
            repair=thread_proto(repair),
            turns=[turn_proto(v) for v in [*sealed, *own]],
            memories=[memory_proto(v) for v in memories],
        )

    def PauseRepair(  # noqa: N802
        self, request: repairs_pb2.PauseRepairRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Thread:
        """``Repairs.PauseRepair``: pause a ``CONTINUED`` repair."""
        name = parse_thread(request.name, "name")
        authorize(name.owner)
        repair = self.store.set_repair_state(
            name.owner, name.thread, [REPAIR_CONTINUED, REPAIR_PAUSED], REPAIR_PAUSED
        )
        return thread_proto(repair)

    def ConcludeRepair(  # noqa: N802
        self, request: repairs_pb2.ConcludeRepairRequest, context: grpc.ServicerContext
    ) -> repairs_pb2.ConcludeRepairResponse:
        """``Repairs.ConcludeRepair``: conclude a repair with one outcome."""
        name = parse_thread(request.name, "name")
        authorize(name.owner)
        if request.outcome not in _OUTCOMES:
            raise InvalidArgument("outcome", "must be DESTROY, PRESERVE_RESTRICTED or DISTILL")
        outcome = _OUTCOMES[request.outcome]
        lesson_text = check_text(
            request.lesson_text, "lesson_text", limit=MAX_TEXT_BYTES, required=outcome == "DISTILL"
        )
        if lesson_text and outcome != "DISTILL":
            raise InvalidArgument("lesson_text", "only with DISTILL")
        with self._lock(request.name):
            return self._conclude(name.owner, name.thread, request.name, outcome, lesson_text)

    def _conclude(
        self, owner: str, repair_id: str, full_name: str, outcome: str, lesson_text: str
    ) -> repairs_pb2.ConcludeRepairResponse:
        meta = self.store.repair(owner, repair_id).meta
        open_states = (REPAIR_PAUSED, REPAIR_CONTINUED)
        restricted = meta.repair_outcome == "PRESERVE_RESTRICTED"
        if meta.repair_state not in open_states and not restricted:
            raise FailedPrecondition(
                f"{full_name} is already concluded",
                reason=Reason.ILLEGAL_TRANSITION,
                subject=full_name,
            )
        response = repairs_pb2.ConcludeRepairResponse()
        if outcome == "PRESERVE_RESTRICTED":
            repair = self.store.set_repair_state(
                owner, repair_id, [*open_states, REPAIR_CONCLUDED], REPAIR_CONCLUDED, outcome
            )
            response.repair.CopyFrom(thread_proto(repair))
            return response
        lesson = None
        if outcome == "DISTILL":
            lesson = MemoryDraft("LESSON", MemoryContent(lesson_text, "", full_name, None))
            lesson.embedding = self.retriever.embed_texts([lesson_text], owner=owner)[0]
        repair, entry, made = self.lifecycle.conclude(owner, repair_id, outcome, lesson)
        if made is not None:
            response.lesson.CopyFrom(memory_proto(made))
        response.repair.CopyFrom(thread_proto(repair))
        response.receipt.CopyFrom(receipt_proto(entry, self.store.sign_receipt))
        return response
