"""What each tool of ``lethe mcp`` does: calls of the typed client for one session.

Each tool is a coroutine ``(session, arguments) -> dict`` in :data:`HANDLERS`,
called with arguments that already passed the tool's JSON Schema
(:mod:`lethe.mcp._schemas`). It makes its calls through the session's
:class:`lethe.client.AsyncClient` (the caller's token: every guarantee stays
in the Lethe server) and answers JSON (:mod:`lethe.mcp._convert`).

A session acts for one owner: every name a tool is given must lie inside
``owners/{session.owner}``, else the tool refuses with ``OWNER_NOT_ALLOWED``
before any call (and the server would refuse too, when the token may not act
for that owner). Refusals of the tools themselves are :class:`Refusal`;
Lethe's are :class:`lethe.client.LetheError`; :mod:`lethe.mcp._server`
turns both into tool errors.

Imports the standard library, ``lethe.client``, ``lethe.names`` and ``lethe.v1``.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lethe.client import AsyncClient, NotFound, RecordDeleted
from lethe.mcp import _convert as conv
from lethe.names import owner_of
from lethe.v1 import common_pb2

__all__ = ["HANDLERS", "Refusal", "Session"]

JSON = dict[str, Any]

_KNOWN_THREADS_MAX = 4096
"""How many thread names the process remembers as existing (a bounded set)."""


class Refusal(Exception):
    """A tool refused a call before Lethe was asked (or instead of asking it).

    Attributes:
        reason: an ``ErrorReason`` name (``BAD_FIELD``, ``OWNER_NOT_ALLOWED``,
            ``ILLEGAL_TRANSITION``, ``UNAUTHENTICATED``…), the first word of the
            tool error.
        message: what is wrong, in words (no content of any record).
        fields: the arguments at fault, for ``BAD_FIELD``.
    """

    def __init__(self, reason: str, message: str, fields: Sequence[str] = ()) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.fields = list(fields)


@dataclass(frozen=True)
class Session:
    """Who a tool call acts for.

    Attributes:
        client: the typed client bound to the caller's token.
        owner: the owner id every call acts for (``alice``).
        thread: the session's default thread id or name ("" for none).
    """

    client: AsyncClient
    owner: str
    thread: str = ""

    @property
    def parent(self) -> str:
        """``owners/{owner}``."""
        return f"owners/{self.owner}"


_known_threads: set[str] = set()


def _own(session: Session, name: str, field: str) -> str:
    """``name`` if it lies inside the session's owner.

    Raises:
        Refusal: ``OWNER_NOT_ALLOWED`` naming ``field``.
    """
    if owner_of(name) != session.owner:
        raise Refusal(
            "OWNER_NOT_ALLOWED",
            f"{field}: {name} is not a record of this session's owner {session.parent}",
            [field],
        )
    return name


def _own_all(session: Session, names: Iterable[str], field: str) -> list[str]:
    return [_own(session, n, f"{field}[{i}]") for i, n in enumerate(names)]


def _thread(session: Session, value: str | None, field: str = "thread") -> str | None:
    """The full thread name of a thread argument (id or name), the session's default, or None.

    Raises:
        Refusal: ``OWNER_NOT_ALLOWED`` for a thread of another owner.
    """
    ref = value or session.thread
    if not ref:
        return None
    if ref.startswith("owners/"):
        return _own(session, ref, field if value else "the session's thread")
    return f"{session.parent}/threads/{ref}"


def _need_thread(session: Session, value: str | None, field: str = "thread") -> str:
    """As :func:`_thread`, but a thread is required.

    Raises:
        Refusal: ``BAD_FIELD`` when there is neither an argument nor a session thread.
    """
    name = _thread(session, value, field)
    if name is None:
        raise Refusal(
            "BAD_FIELD", f"{field}: required (this session has no default thread)", [field]
        )
    return name


def _refs(items: Iterable[JSON]) -> list[JSON]:
    return [{"name": r["name"], "version": r["version"]} for r in items]


def _time(value: str, field: str) -> _dt.datetime:
    """An aware datetime from an RFC 3339 string.

    Raises:
        Refusal: ``BAD_FIELD``: not a date-time, or without a UTC offset.
    """
    try:
        when = _dt.datetime.fromisoformat(value)
    except ValueError:
        raise Refusal(
            "BAD_FIELD", f"{field}: not an RFC 3339 date-time: {value!r}", [field]
        ) from None
    if when.tzinfo is None:
        raise Refusal("BAD_FIELD", f"{field}: needs a UTC offset (`Z` or `+02:00`)", [field])
    return when


async def _ensure_thread(session: Session, name: str) -> bool:
    """Create the thread ``name`` if it never existed; whether it was created.

    A forgotten thread is not created again: its ``RECORD_DELETED`` is raised.
    """
    if name in _known_threads:
        return False
    created = False
    try:
        await session.client.get_thread(name)
    except RecordDeleted:
        raise
    except NotFound:
        thread_id = name.rsplit("/", 1)[1]
        await session.client.create_thread(session.parent, thread_id=thread_id)
        created = True
    if len(_known_threads) >= _KNOWN_THREADS_MAX:
        _known_threads.clear()
    _known_threads.add(name)
    return created


async def _read_thread(session: Session, value: str | None, field: str = "thread") -> str | None:
    """As :func:`_thread`, for a tool that reads; the session's thread is created if new.

    A fresh session's default thread may not exist yet; reading it then answers
    as an empty thread rather than ``NOT_FOUND``. A thread named in the
    arguments is taken as it is (Lethe answers ``NOT_FOUND`` for one that never
    existed).
    """
    name = _thread(session, value, field)
    if name is not None and not value:
        await _ensure_thread(session, name)
    return name


# ---------------------------------------------------------------------- the tools


async def remember_turns(session: Session, args: JSON) -> JSON:
    """Append turns (pending unless ``commit``), creating the thread when it is new."""
    name = _thread(session, args.get("thread"))
    if name is None:
        created_thread = await session.client.create_thread(session.parent)
        name, created = created_thread.name, True
        _known_threads.add(name)
    else:
        created = await _ensure_thread(session, name)
    commit = bool(args.get("commit", False))
    turns: list[JSON] = []
    for i, turn in enumerate(args["turns"]):
        item: JSON = {"role": turn["role"], "text": turn["text"], "commit": commit}
        if "speaker" in turn:
            item["speaker"] = turn["speaker"]
        if "context_manifest" in turn:
            item["context_manifest"] = _own(
                session, turn["context_manifest"], f"turns[{i}].context_manifest"
            )
        turns.append(item)
    reply = await session.client.append_turns(name, turns)
    return {
        "thread": name,
        "thread_created": created,
        "turns": [conv.turn_json(t) for t in reply.turns],
        "proposed": [conv.memory_json(m) for m in reply.proposed],
    }


async def store_memory(session: Session, args: JSON) -> JSON:
    """Create a typed memory with its lineage."""
    memory: JSON = {"kind": args["kind"], "text": args["text"]}
    for key in ("direction", "trigger", "slot", "scope", "origin"):
        if key in args:
            memory[key] = args[key]
    if "due_time" in args:
        memory["due_time"] = _time(args["due_time"], "due_time")
    if "edge" in args:
        memory["edge"] = dict(args["edge"])
    if args.get("sources"):
        for i, ref in enumerate(args["sources"]):
            _own(session, ref["name"], f"sources[{i}].name")
        memory["sources"] = _refs(args["sources"])
    if args.get("commit"):
        memory["state"] = "COMMITTED"
    stored = await session.client.create_memory(
        session.parent, memory, memory_id=args.get("memory_id", "")
    )
    return {"memory": conv.memory_json(stored)}


async def search_memory(session: Session, args: JSON) -> JSON:
    """Search committed memory, and the thread's pending turns when a thread is in play."""
    thread = await _read_thread(session, args.get("thread"))
    include_pending = bool(args.get("include_pending", thread is not None))
    if include_pending and thread is None:
        raise Refusal(
            "BAD_FIELD",
            "include_pending: needs a thread (the argument, or the session's thread)",
            ["include_pending"],
        )
    reply = await session.client.search(
        session.parent,
        query_text=args["query"],
        top_k=args.get("top_k", 10),
        thread=thread if include_pending and thread else "",
        include_pending=include_pending,
        kinds=args.get("kinds", ()),
        include_turns=bool(args.get("include_turns", False)),
        mode=args.get("mode"),
    )
    return {
        "thread": thread if include_pending else None,
        "hits": [conv.hit_json(h) for h in reply.hits],
    }


async def assemble_context(session: Session, args: JSON) -> JSON:
    """Assemble the context for the next reply in a thread; the manifest is stored."""
    thread = _need_thread(session, args.get("thread"))
    if not args.get("thread"):
        await _ensure_thread(session, thread)  # the session's thread, maybe not written yet
    bundle = await session.client.assemble_context(
        thread,
        query_text=args.get("query", ""),
        max_chars=args.get("max_chars", 0),
        recent_turns=args.get("recent_turns", 0),
        top_k=args.get("top_k", 0),
        scope=args.get("scope", ""),
    )
    return {"thread": thread, **conv.bundle_json(bundle)}


async def list_pending(session: Session, args: JSON) -> JSON:
    """The thread's pending turns and the owner's pending memories, one page of each."""
    limit = args.get("limit", 100)
    thread = await _read_thread(session, args.get("thread"))
    out: JSON = {"thread": thread, "turns": [], "memories": []}
    if thread is not None:
        turns = await session.client.list_turns(thread, states=["PENDING"], page_size=limit)
        out["turns"] = [conv.turn_json(t) for t in turns.turns]
        out["more_turns"] = bool(turns.next_page_token)
    memories = await session.client.list_memories(
        session.parent, states=["PENDING"], page_size=limit
    )
    out["memories"] = [conv.memory_json(m) for m in memories.memories]
    out["more_memories"] = bool(memories.next_page_token)
    return out


async def commit(session: Session, args: JSON) -> JSON:
    """Commit pending turns and memories."""
    names = _own_all(session, args["names"], "names")
    reply = await session.client.commit(
        names, include_sources=bool(args.get("include_sources", False))
    )
    return {"committed": [conv.ref_json(r) for r in reply.committed]}


async def _state_of(session: Session, name: str) -> common_pb2.State.ValueType:
    if "/turns/" in name:
        return (await session.client.get_turn(name)).state
    return (await session.client.get_memory(name)).state


async def reject(session: Session, args: JSON) -> JSON:
    """Forget pending records, refusing any that is not pending."""
    names = _own_all(session, args["names"], "names")
    for i, name in enumerate(names):
        state = await _state_of(session, name)
        if state != common_pb2.PENDING:
            raise Refusal(
                "ILLEGAL_TRANSITION",
                f"names[{i}]: {name} is {common_pb2.State.Name(state)}, not PENDING: "
                "reject takes pending records only (use forget)",
                [f"names[{i}]"],
            )
    receipt = await session.client.forget(names, reason="rejected")
    return {"receipt": conv.receipt_json(receipt)}


async def correct_fact(session: Session, args: JSON) -> JSON:
    """Write a corrected version of a fact or preference."""
    name = _own(session, args["name"], "name")
    memory: JSON = {"name": name, "text": args["text"]}
    mask = ["text"]
    if "sources" in args:
        for i, ref in enumerate(args["sources"]):
            _own(session, ref["name"], f"sources[{i}].name")
        memory["sources"] = _refs(args["sources"])
        mask.append("sources")
    updated = await session.client.update_memory(
        memory, update_mask=mask, expected_version=args.get("expected_version", 0)
    )
    return {"memory": conv.memory_json(updated)}


async def update_status(session: Session, args: JSON) -> JSON:
    """Move a memory along its kind's state machine."""
    name = _own(session, args["name"], "name")
    evidence = args.get("evidence")
    if evidence is not None:
        _own(session, evidence["name"], "evidence.name")
        evidence = {"name": evidence["name"], "version": evidence["version"]}
    moved = await session.client.transition_memory(
        name,
        status=args["status"],
        expected_version=args.get("expected_version", 0),
        evidence=evidence,
        note=args.get("note", ""),
    )
    return {"memory": conv.memory_json(moved)}


async def forget(session: Session, args: JSON) -> JSON:
    """Forget names and/or a range of turns; answer the receipt."""
    names = _own_all(session, args.get("names", ()), "names")
    span = args.get("range")
    turn_range: JSON | None = None
    if span is not None:
        if span["to_seq"] < span["from_seq"]:
            raise Refusal("BAD_FIELD", "range.to_seq: less than range.from_seq", ["range.to_seq"])
        turn_range = {
            "thread": _need_thread(session, span.get("thread"), "range.thread"),
            "from_seq": span["from_seq"],
            "to_seq": span["to_seq"],
        }
    if not names and turn_range is None:
        raise Refusal("BAD_FIELD", "give names, a range, or both", ["names", "range"])
    receipt = await session.client.forget(
        names,
        range=turn_range,
        responses=args.get("responses"),
        reason=args.get("reason", ""),
    )
    return {"receipt": conv.receipt_json(receipt)}


async def seal_repair(session: Session, args: JSON) -> JSON:
    """Seal a thread from ``from_seq`` on into a new, paused repair thread."""
    thread = _need_thread(session, args.get("thread"))
    repair = await session.client.seal_repair(thread, from_seq=args["from_seq"])
    return {"repair": conv.thread_json(repair)}


async def reopen_repair(session: Session, args: JSON) -> JSON:
    """Continue a repair with its sealed context."""
    name = _own(session, args["repair"], "repair")
    reply = await session.client.reopen_repair(
        name, acknowledge_restricted=bool(args.get("acknowledge_restricted", False))
    )
    return conv.reopened_json(reply)


async def conclude_repair(session: Session, args: JSON) -> JSON:
    """Conclude a repair: destroy, keep restricted, or distil a lesson."""
    name = _own(session, args["repair"], "repair")
    lesson = args.get("lesson", "")
    if args["outcome"] == "DISTILL" and not lesson:
        raise Refusal("BAD_FIELD", "lesson: required with outcome DISTILL", ["lesson"])
    reply = await session.client.conclude_repair(name, outcome=args["outcome"], lesson_text=lesson)
    return conv.concluded_json(reply)


async def due_commitments(session: Session, args: JSON) -> JSON:
    """Open committed commitments due by now (plus ``within_minutes``), oldest due first."""
    now = time.time()
    horizon = now + 60 * args.get("within_minutes", 0)
    limit = args.get("limit", 100)
    due: list[tuple[float, JSON]] = []
    async for memory in session.client.iter_memories(
        session.parent, kinds=["COMMITMENT"], statuses=["OPEN"], states=["COMMITTED"]
    ):
        if not memory.HasField("due_time"):
            continue
        when = memory.due_time.seconds + memory.due_time.nanos / 1e9
        if when <= horizon:
            item = conv.memory_json(memory)
            item["overdue"] = when <= now
            due.append((when, item))
    due.sort(key=lambda pair: pair[0])
    return {
        "now": _dt.datetime.fromtimestamp(now, _dt.UTC).isoformat().replace("+00:00", "Z"),
        "due": [item for _, item in due[:limit]],
        "more": len(due) > limit,
    }


async def lineage(session: Session, args: JSON) -> JSON:
    """The lineage edges of a record, nearest first."""
    name = _own(session, args["name"], "name")
    direction = args.get("direction", "ANCESTORS")
    reply = await session.client.get_lineage(
        name, direction=direction, max_depth=args.get("max_depth", 0)
    )
    return {"name": name, "direction": direction, "edges": conv.lineage_json(reply)}


Handler = Callable[[Session, JSON], Awaitable[JSON]]
"""A tool: the session and its (schema-valid) arguments to its JSON answer."""

HANDLERS: dict[str, Handler] = {
    "remember_turns": remember_turns,
    "store_memory": store_memory,
    "search_memory": search_memory,
    "assemble_context": assemble_context,
    "list_pending": list_pending,
    "commit": commit,
    "reject": reject,
    "correct_fact": correct_fact,
    "update_status": update_status,
    "forget": forget,
    "seal_repair": seal_repair,
    "reopen_repair": reopen_repair,
    "conclude_repair": conclude_repair,
    "due_commitments": due_commitments,
    "lineage": lineage,
}
"""Every tool's coroutine, by the tool's name (the names of :data:`lethe.mcp._schemas.TOOLS`)."""
