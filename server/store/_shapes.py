"""Shapes of memories (ARCHITECTURE.md, "Shapes"): defaults, state machines, slots and scopes.

In full: each kind's defaults, its state machine, the kinds a correction
supersedes, slots, and preference scopes.

Pure rules; the store applies them in :mod:`server.store._memories`.
"""

from __future__ import annotations

from typing import Any

from server.errors import AlreadyExists, Reason

# Shapes (ARCHITECTURE.md): kind -> (direction, trigger, initial status).
KIND_DEFAULTS: dict[str, tuple[str, str, str]] = {
    "FACT": ("ABOUT_PERSON", "CORRECTION_ONLY", "ACTIVE"),
    "OPEN_QUESTION": ("ABOUT_PERSON", "ANSWERED", "OPEN"),
    "GOAL": ("ABOUT_PERSON", "PROGRESS_OR_ABANDONED", "ACTIVE"),
    "COMMITMENT": ("OWED_BY_SYSTEM", "FULFILLED_CANCELLED_EXPIRED_OR_BROKEN", "OPEN"),
    "PENDING_POINT": ("ABOUT_PERSON", "RESUMED_OR_RELEASED", "PAUSED"),
    "PREFERENCE": ("ABOUT_PERSON", "CORRECTION_ONLY", "ACTIVE"),
    "SUMMARY": ("", "", "ACTIVE"),
    "GRAPH_EDGE": ("", "", "ACTIVE"),
    "ANNOTATION": ("", "", "ACTIVE"),
    "REFLECTION": ("", "", "ACTIVE"),
    "LESSON": ("", "", "ACTIVE"),
}
# Kinds whose update is a correction: the old version becomes SUPERSEDED.
CORRECTED_KINDS = ("FACT", "PREFERENCE")
# Kinds whose (slot, scope) may hold one active memory at a time.
SLOTTED_KINDS = ("FACT", "PREFERENCE")
# The record key (in the owner ring) that keys the slot digests.
SLOT_KEY_ID = "slot-digest"

# TransitionMemory's state machines: kind -> status -> statuses it may move to.
# FACT and PREFERENCE change only by correction (UpdateMemory); the derived
# kinds (SUMMARY, GRAPH_EDGE, ANNOTATION, REFLECTION, LESSON) have no lifecycle
# of their own. A GOAL may "move" ACTIVE -> ACTIVE to record progress.
TRANSITIONS: dict[str, dict[str, frozenset[str]]] = {
    "OPEN_QUESTION": {"OPEN": frozenset({"ANSWERED"})},
    "GOAL": {"ACTIVE": frozenset({"ACTIVE", "ACHIEVED", "ABANDONED"})},
    "COMMITMENT": {"OPEN": frozenset({"FULFILLED", "CANCELLED", "EXPIRED", "BROKEN"})},
    "PENDING_POINT": {"PAUSED": frozenset({"RESUMED", "RELEASED"})},
}


def transition_allowed(kind: str, current: str, target: str) -> bool:
    """Whether ``TransitionMemory`` may move a ``kind`` memory from ``current`` to ``target``."""
    return target in TRANSITIONS.get(kind, {}).get(current, frozenset())


def scope_chain(scope: str) -> list[str]:
    """Applicable scopes, narrowest first: ``a.b`` -> ``a.b``, ``a``, ``default``."""
    parts = [p for p in scope.split(".") if p] if scope else []
    chain = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    return [*chain, "default"] if "default" not in chain else chain


class SlotConflict(AlreadyExists):
    """A second active memory on the same (kind, slot, scope); ``holder`` names the first."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"{holder} already holds this slot and scope", reason=Reason.SLOT_CONFLICT)
        self.holder = holder

    def details(self) -> list[Any]:
        from google.protobuf import any_pb2
        from google.rpc import error_details_pb2

        info = error_details_pb2.ResourceInfo(
            resource_type="lethe.v1.Memory",
            resource_name=self.holder,
            description="holds the slot and scope",
        )
        packed = any_pb2.Any()
        packed.Pack(info)
        return [packed]
