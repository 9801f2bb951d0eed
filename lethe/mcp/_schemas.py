"""The tools of ``lethe mcp``: their names, what each tells the model, and their input schemas.

Data only (no I/O): :data:`TOOLS` lists one :class:`ToolSpec` per tool, in
the order ``tools/list`` answers them. Every input schema is a strict JSON
Schema 2020-12 object: ``additionalProperties: false`` at every level,
enums for every closed set (roles, kinds, directions, triggers, statuses,
outcomes, modes), and the bounds of the API (docs/design/API.md, "Views and
sizes"): at most 1000 turns, names or sources per call, texts up to 64 KiB
(counted here in characters; the server counts UTF-8 bytes), ``top_k``
1..1000, slots and scopes up to 1024, a forget reason up to 256. No schema
uses ``anyOf`` / ``oneOf`` at its top level (some hosts refuse them there);
a rule that spans two arguments ("``names`` or ``range``") is checked by the
tool and refused with ``BAD_FIELD``.

Resource names follow the API's grammar (:mod:`lethe.names`): a thread
argument takes an id (``chat-1``, inside the session's owner) or a full name
(``owners/alice/threads/chat-1``).

Imports only the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_BATCH",
    "MAX_TEXT",
    "RULES",
    "TOOLS",
    "ToolSpec",
    "tool_spec",
]

MAX_TEXT = 65536
"""Longest text a tool takes, in characters (the server's limit is 64 KiB of UTF-8)."""
MAX_BATCH = 1000
"""Most turns, names or sources in one call (the API's batch limit)."""
MAX_SHORT = 1024
"""Longest slot, scope, speaker or graph-edge part, in characters (1024 bytes on the server)."""
MAX_REASON = 256
"""Longest forget reason, in characters (256 bytes on the server; kept in plaintext)."""

_ID = r"[a-z0-9][a-z0-9-]{0,62}"
_OWNER = rf"owners/{_ID}"
_TURN = rf"{_OWNER}/threads/{_ID}/turns/[1-9][0-9]{{0,18}}"
_MEMORY = rf"{_OWNER}/memories/{_ID}"

ROLES = ("USER", "ASSISTANT", "SYSTEM", "TOOL")
KINDS = (
    "FACT",
    "OPEN_QUESTION",
    "GOAL",
    "COMMITMENT",
    "PENDING_POINT",
    "PREFERENCE",
    "SUMMARY",
    "GRAPH_EDGE",
    "ANNOTATION",
    "REFLECTION",
    "LESSON",
)
DIRECTIONS = ("ABOUT_PERSON", "OWED_BY_SYSTEM")
TRIGGERS = (
    "CORRECTION_ONLY",
    "ANSWERED",
    "PROGRESS_OR_ABANDONED",
    "RESUMED_OR_RELEASED",
    "FULFILLED_CANCELLED_EXPIRED_OR_BROKEN",
)
CLOSING_STATUSES = (
    "ACTIVE",
    "ANSWERED",
    "ACHIEVED",
    "ABANDONED",
    "FULFILLED",
    "CANCELLED",
    "EXPIRED",
    "BROKEN",
    "RESUMED",
    "RELEASED",
)
OUTCOMES = ("DESTROY", "PRESERVE_RESTRICTED", "DISTILL")
MODES = ("HYBRID", "DENSE", "LEXICAL")

RULES = (
    "Lethe is this user's memory, and it forgets reliably. The rules: new turns "
    "and new memories are PENDING until committed; a pending record is seen only "
    "in its own thread and expires (72 h by default) unless committed, so commit "
    "what the user wants kept and reject what they do not. Committed memory is "
    "found from every thread. Memories carry lineage: the exact turns and "
    "memories (at their versions) they were made from. Forgetting is final: it "
    "deletes the record, everything derived from it, and its keys, which makes "
    "every backup copy unreadable too; the answer is a receipt of names and "
    "counts, never content. A painful stretch of a conversation can be sealed "
    "into a repair, where it waits, unseen, until the repair is concluded. "
    "A refused call answers an error whose text starts with Lethe's reason "
    "(RECORD_DELETED, OWNER_NOT_ALLOWED, SOURCE_DELETED, BAD_FIELD, ...)."
)
"""The server's ``instructions``: the rules every tool follows, in plain words."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool as ``tools/list`` shows it.

    Attributes:
        name: the tool's name (``remember_turns``).
        title: a short human title.
        description: what it does and the rules it follows, for the model.
        input_schema: its strict JSON Schema (an object schema).
        read_only: it changes nothing (MCP's ``readOnlyHint``).
        destructive: it deletes (MCP's ``destructiveHint``).
        idempotent: calling it twice with the same arguments does no more
            than once (MCP's ``idempotentHint``).
    """

    name: str
    title: str
    description: str
    input_schema: dict[str, Any] = field(repr=False)
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False


# ---------------------------------------------------------------------- fragments


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A strict object schema: only ``properties``, ``required`` ones present."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


def _text(description: str, max_length: int = MAX_TEXT) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_length, "description": description}


def _enum(values: tuple[str, ...], description: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values), "description": description}


def _int(low: int, high: int, description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high, "description": description}


def _bool(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def _names(pattern: str, description: str, *, min_items: int = 1) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {"type": "string", "pattern": f"^(?:{pattern})$"},
        "minItems": min_items,
        "maxItems": MAX_BATCH,
        "uniqueItems": True,
        "description": description,
    }


def _name(pattern: str, description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": f"^(?:{pattern})$", "description": description}


_THREAD = _name(
    rf"(?:{_OWNER}/threads/)?{_ID}",
    "The conversation: an id such as `chat-1` (in this session's owner) or a full "
    "name `owners/{owner}/threads/{id}`. Default: the session's thread, if it has one.",
)
_RECORD = rf"{_TURN}|{_MEMORY}"
_REF = _obj(
    {
        "name": _name(_RECORD, "A turn or memory name."),
        "version": _int(1, 2**62, "Its exact version (a turn's is always 1)."),
    },
    ("name", "version"),
)
_SOURCES = {
    "type": "array",
    "items": _REF,
    "maxItems": MAX_BATCH,
    "description": "Lineage: the turns and memories this was made from, each at the exact "
    "version it was made from. Forgetting any of them forgets this too.",
}


# ---------------------------------------------------------------------- the tools

_REMEMBER = ToolSpec(
    name="remember_turns",
    title="Remember conversation turns",
    description=(
        "Write turns of a conversation to Lethe. They are PENDING by default: visible "
        "only in this thread (search_memory with the thread, assemble_context), never "
        "in the user's general memory, and they expire (72 h by default) unless "
        "committed. Commit them later with `commit`, or pass commit=true when the user "
        "clearly wants them kept. A thread that does not exist yet is created; without "
        "a thread (and no session thread) a new one is started and its name returned. "
        "For an assistant reply built from assembled context, set its context_manifest "
        "to the manifest assemble_context returned: forgetting any record in it then "
        "taints the reply. Answers the turns' names, seqs and states, and any candidate "
        "memories Lethe proposed (PENDING; see list_pending)."
    ),
    input_schema=_obj(
        {
            "thread": _THREAD,
            "turns": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_BATCH,
                "description": "The turns, in the order they were said.",
                "items": _obj(
                    {
                        "role": _enum(ROLES, "Who said it."),
                        "text": _text("What was said."),
                        "speaker": _text("Optional display name.", MAX_SHORT),
                        "context_manifest": _name(
                            rf"{_OWNER}/manifests/{_ID}",
                            "For an ASSISTANT turn: the manifest assemble_context returned "
                            "for the input this reply was written from.",
                        ),
                    },
                    ("role", "text"),
                ),
            },
            "commit": _bool(
                "Store the turns COMMITTED (the user's memory, found from every thread) "
                "instead of PENDING. Default false."
            ),
        },
        ("turns",),
    ),
)

_STORE = ToolSpec(
    name="store_memory",
    title="Store a typed memory",
    description=(
        "Store a typed memory: a FACT about the person (one active fact per slot and "
        "scope), an OPEN_QUESTION, a GOAL, a COMMITMENT the assistant owes (with a "
        "due_time it is surfaced when due), a PENDING_POINT, a PREFERENCE (slot, "
        "scope, origin), a SUMMARY, a GRAPH_EDGE, an ANNOTATION, a REFLECTION or a "
        "LESSON. Direction, trigger and status default from the kind. Name its "
        "sources (the turns and memories it was made from, at their versions): it is "
        "never more visible or durable than they are, and forgetting one forgets it. "
        "It is PENDING (a candidate) unless commit=true and every source is committed. "
        "To change an existing fact use correct_fact, not a second fact."
    ),
    input_schema=_obj(
        {
            "kind": _enum(KINDS, "What the memory is."),
            "text": _text("The memory, in words."),
            "sources": _SOURCES,
            "commit": _bool(
                "Commit it now (granted only when every source is committed). Default false."
            ),
            "direction": _enum(DIRECTIONS, "Default from the kind."),
            "trigger": _enum(TRIGGERS, "What closes it; default from the kind."),
            "slot": _text("For a FACT or PREFERENCE: e.g. `dinner.guest_count`.", MAX_SHORT),
            "scope": _text("Dot-separated, broad to narrow (`work.project-x`).", MAX_SHORT),
            "origin": _enum(("EXPLICIT", "INFERRED"), "For a PREFERENCE; default EXPLICIT."),
            "due_time": {
                "type": "string",
                "format": "date-time",
                "description": "For a COMMITMENT: when it falls due, RFC 3339 with an offset "
                "(`2026-12-01T09:00:00Z`).",
            },
            "edge": _obj(
                {
                    "subject": _text("Subject.", MAX_SHORT),
                    "predicate": _text("Predicate.", MAX_SHORT),
                    "object": _text("Object.", MAX_SHORT),
                },
                ("subject", "predicate", "object"),
            ),
            "memory_id": _name(_ID, "Optional id; default: Lethe chooses one."),
        },
        ("kind", "text"),
    ),
)

_SEARCH = ToolSpec(
    name="search_memory",
    title="Search memory",
    description=(
        "Search the user's committed memory (turns and memories), best first. With a "
        "thread (the argument, or the session's thread) that thread's PENDING turns "
        "are searched too, and no other thread's: pending material serves only its "
        "own conversation. Forgotten, expired, sealed, superseded and tainted records "
        "are never returned."
    ),
    input_schema=_obj(
        {
            "query": _text("What to look for."),
            "thread": _THREAD,
            "include_pending": _bool(
                "Also search the thread's pending turns. Default true when a thread is "
                "given or the session has one; false searches committed memory only."
            ),
            "top_k": _int(1, 1000, "How many hits. Default 10."),
            "kinds": {
                "type": "array",
                "items": {"type": "string", "enum": list(KINDS)},
                "uniqueItems": True,
                "maxItems": len(KINDS),
                "description": "Only memories of these kinds (turns too if include_turns).",
            },
            "include_turns": _bool("With kinds: also search turns. Default false."),
            "mode": _enum(MODES, "HYBRID (default: lexical and dense fused), DENSE or LEXICAL."),
        },
        ("query",),
    ),
    read_only=True,
    idempotent=True,
)

_ASSEMBLE = ToolSpec(
    name="assemble_context",
    title="Assemble context for a reply",
    description=(
        "Gather what to know before replying in a thread: open items (due commitments "
        "first), applicable preferences, the thread's recent turns (pending included), "
        "relevant committed memories and summaries, within max_chars. Lethe stores a "
        "manifest naming every record returned; pass its name as context_manifest on "
        "the reply you store with remember_turns, so that forgetting any of those "
        "records later taints the reply."
    ),
    input_schema=_obj(
        {
            "thread": _THREAD,
            "query": _text("What the next reply is about (finds relevant memories)."),
            "max_chars": _int(1, 1_000_000, "Budget of the whole bundle. Default 8000."),
            "recent_turns": _int(1, 1000, "How many recent turns. Default 10."),
            "top_k": _int(1, 1000, "How many relevant memories. Default 5."),
            "scope": _text("Scope preferences are resolved in.", MAX_SHORT),
        }
    ),
)

_LIST_PENDING = ToolSpec(
    name="list_pending",
    title="List pending material",
    description=(
        "List what waits for a decision: the thread's PENDING turns (the argument or "
        "the session's thread; none without one) and the owner's PENDING memories, "
        "including candidates Lethe proposed (commitments, open questions). Each shows "
        "when it expires. Decide with `commit` (keep) or `reject` (forget)."
    ),
    input_schema=_obj(
        {
            "thread": _THREAD,
            "limit": _int(1, 1000, "At most this many turns and this many memories. Default 100."),
        }
    ),
    read_only=True,
    idempotent=True,
)

_COMMIT = ToolSpec(
    name="commit",
    title="Commit pending records",
    description=(
        "Commit PENDING turns or memories: they become the user's memory, found from "
        "every thread, and no longer expire. A memory whose sources are still pending "
        "is refused with SOURCE_PENDING unless include_sources=true commits them too."
    ),
    input_schema=_obj(
        {
            "names": _names(_RECORD, "Turn or memory names."),
            "include_sources": _bool("Also commit the named memories' pending sources."),
        },
        ("names",),
    ),
    idempotent=True,
)

_REJECT = ToolSpec(
    name="reject",
    title="Reject pending records",
    description=(
        "Reject PENDING turns or candidate memories: they are forgotten now instead of "
        "waiting to expire (final, like forget; what was derived from them goes too). "
        "Only pending records: a committed one is refused with ILLEGAL_TRANSITION (use "
        "forget). Answers the deletion receipt."
    ),
    input_schema=_obj({"names": _names(_RECORD, "Pending turn or memory names.")}, ("names",)),
    destructive=True,
)

_CORRECT = ToolSpec(
    name="correct_fact",
    title="Correct a fact",
    description=(
        "Correct a FACT or PREFERENCE: a new version of the same memory with the new "
        "text; the old version becomes SUPERSEDED and is never returned as current. "
        "Never store a second fact to correct one. Pass expected_version (the version "
        "you read) to refuse with VERSION_MISMATCH if it changed meanwhile."
    ),
    input_schema=_obj(
        {
            "name": _name(_MEMORY, "The memory's name."),
            "text": _text("The corrected text."),
            "expected_version": _int(1, 2**62, "The version the correction is based on."),
            "sources": _SOURCES,
        },
        ("name", "text"),
    ),
)

_UPDATE_STATUS = ToolSpec(
    name="update_status",
    title="Move an item along its lifecycle",
    description=(
        "Close or advance an item: an OPEN_QUESTION is ANSWERED; a GOAL ACTIVE "
        "(progress), ACHIEVED or ABANDONED; a COMMITMENT FULFILLED, CANCELLED, EXPIRED "
        "or BROKEN; a PENDING_POINT RESUMED or RELEASED. A move the kind does not allow "
        "is refused with ILLEGAL_TRANSITION. Facts change only by correct_fact."
    ),
    input_schema=_obj(
        {
            "name": _name(_MEMORY, "The memory's name."),
            "status": _enum(CLOSING_STATUSES, "The new status."),
            "expected_version": _int(1, 2**62, "The version the move is based on."),
            "evidence": _REF,
            "note": _text("A note kept with the new version."),
        },
        ("name", "status"),
    ),
)

_FORGET = ToolSpec(
    name="forget",
    title="Forget",
    description=(
        "Forget turns, memories, whole threads, or a range of a thread's turns. This is "
        "final and cannot be undone: the records are deleted, everything derived from "
        "them (facts, summaries, ...) goes with them, replies that were built from them "
        "are tainted (or deleted with responses=DELETE), and their keys are destroyed, "
        "so no backup can bring them back. Use it when the user asks to forget. Answers "
        "a content-free receipt: what was deleted (names and counts) and where it was "
        "cleaned up, never what it said. Give names, a range, or both."
    ),
    input_schema=_obj(
        {
            "names": _names(
                rf"{_RECORD}|{_OWNER}/threads/{_ID}",
                "Turn, memory or thread names.",
                min_items=0,
            ),
            "range": _obj(
                {
                    "thread": _THREAD,
                    "from_seq": _int(1, 2**62, "First turn seq."),
                    "to_seq": _int(1, 2**62, "Last turn seq (at least from_seq)."),
                },
                ("from_seq", "to_seq"),
            ),
            "responses": _enum(
                ("TAINT", "DELETE"),
                "What happens to replies built from what is forgotten. Default TAINT.",
            ),
            "reason": {
                "type": "string",
                "maxLength": MAX_REASON,
                "description": "Kept on the receipt in plaintext: never put content here.",
            },
        }
    ),
    destructive=True,
)

_SEAL = ToolSpec(
    name="seal_repair",
    title="Seal a painful stretch into a repair",
    description=(
        "Seal a stretch of a conversation, from turn from_seq to its end, into a "
        "repair thread (PAUSED). The sealed turns leave the conversation and every "
        "search, context and listing; they wait, neither committed nor destroyed, "
        "until the repair is concluded. Use it when a stretch went badly and should "
        "not shape what comes next."
    ),
    input_schema=_obj(
        {"thread": _THREAD, "from_seq": _int(1, 2**62, "The first sealed turn's seq.")},
        ("from_seq",),
    ),
)

_REOPEN = ToolSpec(
    name="reopen_repair",
    title="Reopen a repair",
    description=(
        "Continue a repair: it becomes CONTINUED and its sealed turns come back here, "
        "for this repair only, so nobody has to retell them. A PRESERVE_RESTRICTED "
        "repair needs acknowledge_restricted=true."
    ),
    input_schema=_obj(
        {
            "repair": _name(rf"{_OWNER}/threads/{_ID}", "The repair thread's name."),
            "acknowledge_restricted": _bool("Acknowledge a restricted repair."),
        },
        ("repair",),
    ),
)

_CONCLUDE = ToolSpec(
    name="conclude_repair",
    title="Conclude a repair",
    description=(
        "Conclude a repair with one outcome: DESTROY forgets the sealed stretch (keys "
        "destroyed, final); DISTILL keeps only an agreed lesson (lesson, required) as a "
        "committed memory with no lineage to the stretch, and destroys the rest; "
        "PRESERVE_RESTRICTED keeps it sealed, readable only by a reopen that "
        "acknowledges the restriction. Answers the receipt of what was destroyed."
    ),
    input_schema=_obj(
        {
            "repair": _name(rf"{_OWNER}/threads/{_ID}", "The repair thread's name."),
            "outcome": _enum(OUTCOMES, "How it ends."),
            "lesson": _text("For DISTILL: the agreed lesson, in words that do not retell it."),
        },
        ("repair", "outcome"),
    ),
    destructive=True,
)

_DUE = ToolSpec(
    name="due_commitments",
    title="Due commitments",
    description=(
        "List the OPEN commitments the assistant owes whose due_time has passed (or "
        "falls within within_minutes from now), oldest due first. Close each with "
        "update_status (FULFILLED, CANCELLED, EXPIRED or BROKEN)."
    ),
    input_schema=_obj(
        {
            "within_minutes": _int(0, 525_600, "Also those due this soon. Default 0."),
            "limit": _int(1, 1000, "At most this many. Default 100."),
        }
    ),
    read_only=True,
    idempotent=True,
)

_LINEAGE = ToolSpec(
    name="lineage",
    title="Show lineage",
    description=(
        "Show what a turn or memory was made from (ANCESTORS, the default) or what was "
        "made from it (DESCENDANTS): the edges, each a source and a derivative at their "
        "versions, nearest first. Forgetting a record forgets its descendants."
    ),
    input_schema=_obj(
        {
            "name": _name(_RECORD, "A turn or memory name."),
            "direction": _enum(("ANCESTORS", "DESCENDANTS"), "Which way. Default ANCESTORS."),
            "max_depth": _int(1, 100, "Hops to follow. Default 10."),
        },
        ("name",),
    ),
    read_only=True,
    idempotent=True,
)

TOOLS: tuple[ToolSpec, ...] = (
    _REMEMBER,
    _STORE,
    _SEARCH,
    _ASSEMBLE,
    _LIST_PENDING,
    _COMMIT,
    _REJECT,
    _CORRECT,
    _UPDATE_STATUS,
    _FORGET,
    _SEAL,
    _REOPEN,
    _CONCLUDE,
    _DUE,
    _LINEAGE,
)
"""Every tool, in the order ``tools/list`` answers them."""

_BY_NAME = {spec.name: spec for spec in TOOLS}


def tool_spec(name: str) -> ToolSpec | None:
    """The tool called ``name``, or None when there is none."""
    return _BY_NAME.get(name)
