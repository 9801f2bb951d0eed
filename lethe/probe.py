"""``lethe probe``: the plant-and-delete probe (API.md, "Command line").

A pure client of a running server: it calls the API through the typed
client (:class:`lethe.client.Client`) and reads refusals by their
``ErrorInfo`` reason (:class:`lethe.client.LetheError`), never server
internals; it imports no ``server``, ``shredder`` or ``index`` module. Each
cycle works in a fresh synthetic thread ``owners/{owner}/threads/probe-<16 hex>``
(default owner ``lethe-probe``; the token must be allowed to act for it) and
runs seven stages, each printed as one line ``cycle N <stage>: ok`` or
``cycle N <stage>: LEAK: <what>`` (``FAIL:`` when a check broke without the
planted value being reachable):

1. ``plant`` — append a committed turn "the probe secret is <20 hex>" and two
   filler turns; derive a committed ``FACT`` from the planted turn, a committed
   ``SUMMARY`` from the planted turn and the first filler (sources at their
   current version, 1), and a committed assistant turn whose ``context_refs``
   name the planted turn. Positive controls: lexical search finds the planted
   turn, lineage links the derivatives, so the later absence checks are not
   vacuous.
2. ``forget`` — ``Lifecycle.Forget`` of the planted turn with responses
   ``TAINT``; the receipt must count as cascaded every memory ``GetLineage``
   listed as its descendant just before (the fact, the summary, and any
   candidate the tagger proposed from it), as tainted the response, at least
   one requested rebuild, and every destination done.
3. ``before-rebuild`` — the value is unreachable: ``Search`` in ``HYBRID``,
   ``DENSE`` and ``LEXICAL`` (owner-wide, and thread-scoped with pending) for
   the secret, "probe secret" and the planted sentence returns no text holding
   it and none of the forgotten or tainted records; ``GetTurn`` of the planted
   turn and ``GetMemory`` of the fact and summary (current and version 1)
   answer ``NOT_FOUND`` / ``RECORD_DELETED``; every record ``GetLineage`` names
   (descendants of the surviving filler, ancestors of the response) holds no
   secret, and a forgotten one it names answers ``RECORD_DELETED`` (lineage
   carries names only, and a tainted response keeps naming what it used);
   the response is listed, ``tainted``, only under ``include_tainted``;
   ``ListMemories`` holds no text with the secret.
4. ``after-rebuild`` — read the summary's ``REBUILD_REQUESTED`` event from
   ``Events.Watch`` (resuming ``after`` the last event id the probe saw before
   the forget), read the offered sources with ``GetTurn``/``GetMemory`` (any
   that are gone or tainted are not used), rebuild the summary with the
   deterministic summariser :func:`summarise` and ``CreateMemory`` it with the
   offered sources; then the checks of stage 3 again plus the new summary.
5. ``after-more-turns`` — append four more committed turns (one asks for the
   secret), rebuild the summary from the thread's listable turns
   (``ListTurns``), check again.
6. ``echoes`` — what declared lineage cannot see (:mod:`lethe._probe_echo`):
   plant a second, distinctive fact and an assistant turn that repeats it
   without lineage, forget the fact (``echoes=TAINT``, a guard of 60 s): the
   receipt must name the repetition as an echo; a summary then written with
   the fact in it must be refused (``ECHOES_FORGOTTEN``); search and context
   assembly must not return it. The last line counts echoes found, echoes
   acted on, guard hits and guards set over every cycle.
7. ``cleanup`` — forget the thread and any probe memory still live (no echo
   sweep: the data is synthetic), check they answer ``RECORD_DELETED`` and the
   owner's ``Audit`` is clean (no orphans, stale summaries or key/record
   drift).

Reachability is checked through search (every mode), context assembly
(``Retrieval.AssembleContext``, including its manifest), get, lineage and
listings.

Without ``--interval`` the probe runs ``--cycles`` (default 1) cycles back to
back; with it, it sleeps that many seconds between cycles, forever or
``--cycles`` times. A cycle takes about 0.2-0.4 s against a local server.

Exit status: 0 when every stage of every cycle passed; 1 at the first failed
cycle (the last line names the cycle and stage; the cycle's thread is still
cleaned up); 2 with one line on stderr when the server cannot be reached, or
refuses the token or the owner; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from lethe._probe_base import (
    _FATAL_CODES,
    _MODES,
    SEARCH_TOP_K,
    WATCH_TIMEOUT_SECONDS,
    ProbeUnreachableError,
    _Client,
    _describe,
    _Findings,
    _need,
    _reason,
    _StageAborted,
)
from lethe._probe_echo import ECHO_GUARD_SECONDS, EchoTally, run_echo_case
from lethe._units import parse_duration
from lethe.names import ID_RE
from lethe.v1 import (
    common_pb2,
    events_pb2,
    lifecycle_pb2,
    memories_pb2,
    threads_pb2,
)

__all__ = [
    "DEFAULT_OWNER",
    "STAGES",
    "add_probe_arguments",
    "parse_duration",
    "probe",
    "run_probe",
    "stage_record",
    "summarise",
]

DEFAULT_OWNER = "lethe-probe"
STAGES = (
    "plant",
    "forget",
    "before-rebuild",
    "after-rebuild",
    "after-more-turns",
    "echoes",
    "cleanup",
)

_MORE_TURNS = (
    "what was the probe secret again?",
    "I do not remember any probe secret, sorry.",
    "filler: the probe garden needs watering on thursday.",
    "filler: the probe kettle is descaled monthly.",
)


def summarise(texts: Iterable[str]) -> str:
    """The probe's deterministic summariser: the texts joined in order.

    Args:
        texts: the source texts, in source order.

    Returns:
        ``"summary: "`` followed by the texts joined with ``" | "``.
    """
    return "summary: " + " | ".join(texts)


def _ref(name: str, version: int) -> common_pb2.SourceRef:
    return common_pb2.SourceRef(name=name, version=version)


class _Cycle:
    """One plant-and-delete cycle in its own synthetic thread."""

    def __init__(self, client: _Client, probe: _Probe) -> None:
        self.c = client
        self.probe = probe
        self.thread_id = f"probe-{secrets.token_hex(8)}"
        self.thread = f"{client.parent}/threads/{self.thread_id}"
        self.secret = secrets.token_hex(10)
        self.planted_text = f"the probe secret is {self.secret}"
        self.thread_created = False
        self.planted: threads_pb2.Turn | None = None
        self.fillers: list[threads_pb2.Turn] = []
        self.response: threads_pb2.Turn | None = None
        self.fact: memories_pb2.Memory | None = None
        self.summary: memories_pb2.Memory | None = None
        self.memories: list[str] = []  # every memory the probe made or was proposed
        self.forgotten: set[str] = set()  # names that must not be live any more
        self.forgotten_versions: dict[str, int] = {}  # forgotten memories → last version
        self.receipt: common_pb2.DeletionReceipt | None = None
        self.cursor_before_forget = ""

    # -- helpers -----------------------------------------------------------------------

    def _holds_secret(self, text: str) -> bool:
        return self.secret in text.lower()

    def _append(self, inputs: Sequence[threads_pb2.TurnInput]) -> list[threads_pb2.Turn]:
        resp = self.c.must(
            "AppendTurns", self.c.api.append_turns, self.thread, list(inputs), echo_text=True
        )
        self.memories.extend(m.name for m in resp.proposed)
        return list(resp.turns)

    def _create_memory(
        self, suffix: str, kind: int, text: str, sources: Sequence[common_pb2.SourceRef]
    ) -> memories_pb2.Memory:
        memory = memories_pb2.Memory(
            kind=kind,  # type: ignore[arg-type]
            text=text,
            sources=list(sources),
            state=common_pb2.COMMITTED,
        )
        created = self.c.must(
            f"CreateMemory {suffix}",
            self.c.api.create_memory,
            self.c.parent,
            memory,
            memory_id=f"{self.thread_id}-{suffix}",
        )
        self.memories.append(created.name)
        return created

    def _search(
        self, query: str, mode: str, *, scoped: bool
    ) -> list[tuple[str, str]] | grpc.RpcError:
        try:
            resp = self.c.call(
                self.c.api.search,
                self.c.parent,
                query_text=query,
                top_k=SEARCH_TOP_K,
                mode=mode,
                thread=self.thread if scoped else "",
                include_pending=scoped,
            )
        except grpc.RpcError as err:
            return err
        out = []
        for hit in resp.hits:
            record = hit.turn if hit.HasField("turn") else hit.memory
            out.append((record.name, record.text))
        return out

    def _list_turns(self, *, include_tainted: bool) -> list[threads_pb2.Turn]:
        turns = self.c.api.iter_turns(self.thread, include_tainted=include_tainted, page_size=1000)
        return self.c.must("ListTurns", list, turns)

    def _list_memories(self) -> list[memories_pb2.Memory]:
        memories = self.c.api.iter_memories(
            self.c.parent, states=["PENDING", "COMMITTED"], page_size=1000
        )
        return self.c.must("ListMemories", list, memories)

    def _lineage(self, name: str, direction: int) -> list[lifecycle_pb2.LineageEdge]:
        resp = self.c.must(
            f"GetLineage of {name}", self.c.api.get_lineage, name, direction=direction
        )
        return list(resp.edges)

    def _expect_deleted(
        self, f: _Findings, what: str, method: Callable[..., Any], *args: Any, **fields: Any
    ) -> None:
        """``method(*args, **fields)`` must answer NOT_FOUND / RECORD_DELETED."""
        try:
            got = self.c.call(method, *args, **fields)
        except grpc.RpcError as err:
            if (err.code(), _reason(err)) != (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED"):
                f.fail(f"{what} answered {_describe(err)}, not NOT_FOUND/RECORD_DELETED")
            return
        text = str(getattr(got, "text", ""))
        if self._holds_secret(text):
            f.leak(f"{what} still returns the planted value")
        else:
            f.leak(f"{what} still returns the forgotten record")

    def _read_source(self, ref: common_pb2.SourceRef) -> tuple[str, bool] | None:
        """(text, tainted) of a record at ``ref.version`` (0 = current), or None if gone."""
        try:
            if "/threads/" in ref.name:
                turn = self.c.call(self.c.api.get_turn, ref.name)
                if ref.version and turn.version != ref.version:
                    return None
                return str(turn.text), bool(turn.tainted)
            memory = self.c.call(self.c.api.get_memory, ref.name, version=ref.version)
            return str(memory.text), False
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                return None
            raise _StageAborted(f"reading offered source {ref.name}: {_describe(err)}") from None

    def _read_offered(self, ref: common_pb2.SourceRef) -> tuple[str, bool] | None:
        """(text, tainted) of a source a rebuild event offers, or None if it is gone."""
        return self._read_source(ref)

    # -- the unreachability checks shared by stages 3-5 ---------------------------------

    def _check_search(self, f: _Findings) -> None:
        banned = self.forgotten | ({self.response.name} if self.response else set())
        for scoped in (False, True):
            for query in (self.secret, "probe secret", self.planted_text):
                for mode in _MODES:
                    got = self._search(query, mode, scoped=scoped)
                    where = f"Search {mode}{' in thread' if scoped else ''} for {query!r}"
                    if isinstance(got, grpc.RpcError):
                        if mode == "DENSE" and _reason(got) == "BAD_FIELD":
                            self.probe.notes.add("DENSE not served: the server has no embedder")
                            continue
                        raise _StageAborted(f"{where} answered {_describe(got)}")
                    for name, text in got:
                        if self._holds_secret(text):
                            f.leak(f"{where} returned {name} holding the planted value")
                        elif name in banned:
                            f.leak(f"{where} returned forgotten or tainted {name}")

    def _check_gets(self, f: _Findings) -> None:
        planted = _need(self.planted)
        self._expect_deleted(f, f"GetTurn {planted.name}", self.c.api.get_turn, planted.name)
        for name, current in sorted(self.forgotten_versions.items()):
            for version in (0, current):
                self._expect_deleted(
                    f,
                    f"GetMemory {name} version {version}",
                    self.c.api.get_memory,
                    name,
                    version=version,
                )

    def _check_lineage(self, f: _Findings) -> None:
        asks = [
            (self.fillers[0].name, lifecycle_pb2.GetLineageRequest.DESCENDANTS),
            (_need(self.response).name, lifecycle_pb2.GetLineageRequest.ANCESTORS),
        ]
        named: dict[str, str] = {}
        for name, direction in asks:
            label = lifecycle_pb2.GetLineageRequest.Direction.Name(direction)
            for edge in self._lineage(name, direction):
                for end in (edge.source.name, edge.derivative.name):
                    named.setdefault(end, f"GetLineage {label} of {name}")
        # Lineage carries names only (ids are not content): a forgotten name may
        # still be named (a tainted response keeps naming what it used), but it
        # must not be live, and no named record may hold the value.
        for end, where in named.items():
            if end in self.forgotten:
                is_turn = "/threads/" in end
                self._expect_deleted(
                    f,
                    f"{'GetTurn' if is_turn else 'GetMemory'} {end} (named by {where})",
                    self.c.api.get_turn if is_turn else self.c.api.get_memory,
                    end,
                )
                continue
            got = self._read_source(common_pb2.SourceRef(name=end))
            if got is not None and self._holds_secret(got[0]):
                f.leak(f"{end}, named by {where}, holds the planted value")

    def _check_listings(self, f: _Findings) -> None:
        response = _need(self.response)
        plain = self._list_turns(include_tainted=False)
        full = self._list_turns(include_tainted=True)
        for turn in full:
            if self._holds_secret(turn.text):
                f.leak(f"ListTurns(include_tainted) returns {turn.name} holding the planted value")
            elif turn.name in self.forgotten:
                f.leak(f"ListTurns(include_tainted) returns forgotten {turn.name}")
        if response.name in {t.name for t in plain}:
            f.leak(f"ListTurns without include_tainted returns the response {response.name}")
        tainted = {t.name: t.tainted for t in full}
        if tainted.get(response.name) is not True:
            f.fail(
                f"ListTurns(include_tainted) shows the response {response.name} "
                f"as {tainted.get(response.name, 'absent')}, not tainted=True"
            )
        for memory in self._list_memories():
            if self._holds_secret(memory.text):
                f.leak(f"ListMemories returns {memory.name} holding the planted value")
            elif memory.name in self.forgotten:
                f.leak(f"ListMemories returns forgotten {memory.name}")

    def _check_context(self, f: _Findings) -> None:
        """AssembleContext of the probe thread must not carry the value anywhere.

        Not in recent turns, open items, preferences, memories or summaries.
        """
        for query in (self.secret, "probe secret"):
            bundle = self.c.must(
                "AssembleContext", self.c.api.assemble_context, self.thread, query_text=query
            )
            if self._holds_secret(str(bundle)):
                f.leak(f"AssembleContext({query!r}) returns the planted value")
            for ref in bundle.manifest.refs:
                if ref.name in self.forgotten:
                    f.leak(f"the context manifest names forgotten {ref.name}")

    def _check_unreachable(self, f: _Findings) -> None:
        self._check_search(f)
        self._check_context(f)
        self._check_gets(f)
        self._check_lineage(f)
        self._check_listings(f)

    def _check_new_summary(self, f: _Findings, summary: memories_pb2.Memory) -> None:
        again = self.c.must("GetMemory of the rebuilt summary", self.c.api.get_memory, summary.name)
        if self._holds_secret(summary.text) or self._holds_secret(again.text):
            f.leak(f"the rebuilt summary {summary.name} holds the planted value")
        for ref in again.sources:
            if ref.name in self.forgotten:
                f.leak(f"the rebuilt summary {summary.name} cites forgotten {ref.name}")

    # -- stages ------------------------------------------------------------------------

    def plant(self, f: _Findings) -> None:
        """Stage 1: plant the fact, derive from it, and check it is visible."""
        self.c.must(
            "CreateThread",
            self.c.api.create_thread,
            self.c.parent,
            thread_id=self.thread_id,
            title="lethe probe",
        )
        self.thread_created = True
        user = common_pb2.USER
        turns = self._append(
            [
                threads_pb2.TurnInput(role=user, text=self.planted_text, commit=True),
                threads_pb2.TurnInput(
                    role=user, text="filler: the probe office plant is a fern.", commit=True
                ),
                threads_pb2.TurnInput(
                    role=user, text="filler: the probe bicycle has a blue bell.", commit=True
                ),
            ]
        )
        self.planted, self.fillers = turns[0], turns[1:]
        planted_ref = _ref(self.planted.name, self.planted.version)
        filler_ref = _ref(self.fillers[0].name, self.fillers[0].version)
        self.fact = self._create_memory(
            "fact", memories_pb2.Memory.FACT, f"fact: {self.planted_text}", [planted_ref]
        )
        self.summary = self._create_memory(
            "summary",
            memories_pb2.Memory.SUMMARY,
            summarise([self.planted.text, self.fillers[0].text]),
            [planted_ref, filler_ref],
        )
        self.response = self._append(
            [
                threads_pb2.TurnInput(
                    role=common_pb2.ASSISTANT,
                    text="Noted: I will keep the probe secret in mind.",
                    context_refs=[planted_ref],
                    commit=True,
                )
            ]
        )[0]
        for memory in (self.fact, self.summary):
            if memory.state != common_pb2.COMMITTED:
                f.fail(f"{memory.name} was stored {common_pb2.State.Name(memory.state)}")
        # Positive controls: the absence checks below must be able to see presence.
        got = self._search(self.secret, "LEXICAL", scoped=False)
        if isinstance(got, grpc.RpcError):
            raise _StageAborted(f"Search LEXICAL answered {_describe(got)}")
        seen = {name for name, _ in got}
        for name in (self.planted.name, self.fact.name, self.summary.name):
            if name not in seen:
                f.fail(f"Search LEXICAL for the secret does not find {name} before the forget")
        down = self._lineage(self.fillers[0].name, lifecycle_pb2.GetLineageRequest.DESCENDANTS)
        if self.summary.name not in {e.derivative.name for e in down}:
            f.fail(f"GetLineage DESCENDANTS of {self.fillers[0].name} misses the summary")
        up = self._lineage(self.response.name, lifecycle_pb2.GetLineageRequest.ANCESTORS)
        if self.planted.name not in {e.source.name for e in up}:
            f.fail(f"GetLineage ANCESTORS of {self.response.name} misses the planted turn")

    def forget(self, f: _Findings) -> None:
        """Stage 2: forget the planted turn, tainting responses."""
        planted, fact, summary = _need(self.planted), _need(self.fact), _need(self.summary)
        # Everything derived from the planted turn goes with it: the fact, the
        # summary, and any candidate the write-time tagger proposed from it;
        # responses that used it (turns) are tainted instead.
        down = self._lineage(planted.name, lifecycle_pb2.GetLineageRequest.DESCENDANTS)
        derived = {e.derivative.name: e.derivative.version for e in down}
        memories = {n: v for n, v in derived.items() if "/memories/" in n}
        responses = set(derived) - set(memories)
        self.forgotten_versions = {fact.name: fact.version, summary.name: summary.version}
        self.forgotten_versions.update(memories)
        self.cursor_before_forget = self.probe.cursor
        self.receipt = self.c.must(
            "Forget",
            self.c.api.forget,
            [planted.name],
            responses="TAINT",
            echo_guard=ECHO_GUARD_SECONDS,
            reason="lethe probe",
        )
        self.forgotten = {planted.name, *self.forgotten_versions}
        r = self.receipt
        want = (len(self.forgotten_versions), len(responses))
        if (r.cascaded, r.tainted) != want or r.rebuilds_requested < 1:
            f.fail(
                f"receipt {r.name} counts cascaded={r.cascaded} tainted={r.tainted} "
                f"rebuilds_requested={r.rebuilds_requested}, expected {want[0]}, {want[1]}, >= 1"
            )
        if not all(d.done for d in r.destinations):
            pending = [d.name for d in r.destinations if not d.done]
            f.fail(f"receipt {r.name} returned with destinations not done: {pending}")

    def before_rebuild(self, f: _Findings) -> None:
        """Stage 3: the value is unreachable before any rebuild."""
        self._check_unreachable(f)

    def _rebuild_event(self) -> events_pb2.Event | None:
        """The summary's REBUILD_REQUESTED event of this cycle's forget, or None."""
        summary, receipt = _need(self.summary), _need(self.receipt)
        stream = self.c.api.watch(
            self.c.parent,
            types=["REBUILD_REQUESTED"],
            after=self.cursor_before_forget,
            timeout=WATCH_TIMEOUT_SECONDS,
            max_reconnects=0,  # a broken stream is the server's answer, not a blip to hide
        )
        try:
            for event in stream:
                self.probe.cursor = event.id
                if event.subject == summary.name and event.receipt.name == receipt.name:
                    return event
        except grpc.RpcError as err:
            if err.code() in _FATAL_CODES:
                raise ProbeUnreachableError(
                    f"{self.c.target} answered {_describe(err)} for {self.c.parent}"
                ) from None
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise _StageAborted(f"Events.Watch answered {_describe(err)}") from None
        finally:
            stream.close()
        return None

    def after_rebuild(self, f: _Findings) -> None:
        """Stage 4: rebuild the summary from the sources the server offers."""
        event = self._rebuild_event()
        if event is None:
            f.fail(
                f"no REBUILD_REQUESTED event for {self.summary and self.summary.name} "
                f"within {WATCH_TIMEOUT_SECONDS:g} s"
            )
            self._check_unreachable(f)
            return
        usable: list[common_pb2.SourceRef] = []
        texts: list[str] = []
        for ref in event.sources:
            if ref.name in self.forgotten:
                f.leak(f"the rebuild event offers forgotten {ref.name}")
                continue
            got = self._read_offered(ref)
            if got is None or got[1]:
                continue  # gone or tainted: not used
            if self._holds_secret(got[0]):
                f.leak(f"offered source {ref.name} holds the planted value")
                continue
            usable.append(ref)
            texts.append(got[0])
        if not usable:
            f.fail("the rebuild event offers no usable source")
        else:
            rebuilt = self._create_memory(
                "summary-r1", memories_pb2.Memory.SUMMARY, summarise(texts), usable
            )
            self._check_new_summary(f, rebuilt)
        self._check_unreachable(f)

    def after_more_turns(self, f: _Findings) -> None:
        """Stage 5: more turns, then a rebuild from the thread's listable turns."""
        self._append(
            [threads_pb2.TurnInput(role=common_pb2.USER, text=t, commit=True) for t in _MORE_TURNS]
        )
        listed = self._list_turns(include_tainted=False)
        for turn in listed:
            if turn.tainted:
                f.fail(f"ListTurns without include_tainted returns tainted {turn.name}")
        sources = [t for t in listed if not t.tainted and t.state == common_pb2.COMMITTED]
        rebuilt = self._create_memory(
            "summary-r2",
            memories_pb2.Memory.SUMMARY,
            summarise(t.text for t in sources),
            [_ref(t.name, t.version) for t in sources],
        )
        self._check_new_summary(f, rebuilt)
        self._check_unreachable(f)

    def echoes(self, f: _Findings) -> None:
        """Stage 6: a repetition without lineage, then a summary of it (``_probe_echo``)."""
        self.memories.extend(run_echo_case(self.c, self.thread, self.probe.echoes, f))

    def cleanup(self, f: _Findings) -> None:
        """Stage 7: forget the thread and the probe's memories; audit the owner."""
        if not self.thread_created:
            return
        self.c.must(
            "Forget of the thread",
            self.c.api.forget,
            [self.thread],
            responses="DELETE",
            echoes="IGNORE",  # synthetic data: no sweep, no guard left on the probe's owner
            reason="lethe probe cleanup",
        )
        live = []
        for name in dict.fromkeys(self.memories):
            try:
                self.c.call(self.c.api.get_memory, name)
                live.append(name)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise _StageAborted(f"GetMemory {name} answered {_describe(err)}") from None
        if live:
            self.c.must(
                "Forget of the probe's memories",
                self.c.api.forget,
                live,
                echoes="IGNORE",
                reason="lethe probe cleanup",
            )
        self._expect_deleted(f, f"GetThread {self.thread}", self.c.api.get_thread, self.thread)
        for name in dict.fromkeys(self.memories):
            self._expect_deleted(f, f"GetMemory {name}", self.c.api.get_memory, name)
        report = self.c.must("Audit", self.c.api.audit, self.c.parent)
        counts = {
            "orphans": report.orphans,
            "stale_summaries": report.stale_summaries,
            "keys_without_record": report.keys_without_record,
            "records_without_key": report.records_without_key,
            "index_drift": report.index_drift,
        }
        bad = {k: v for k, v in counts.items() if v}
        if bad:
            f.fail(f"Audit of {self.c.parent} is not clean: {bad}")


@dataclass
class _Probe:
    """State kept across cycles: the event cursor and notes about skipped checks."""

    cursor: str = ""
    notes: set[str] = field(default_factory=set)
    echoes: EchoTally = field(default_factory=EchoTally)


def _run_cycle(
    client: _Client, probe: _Probe, number: int, out: Callable[[str], None]
) -> str | None:
    """Run one cycle, printing one line per stage.

    Returns:
        None when every stage passed, else the name of the first failed stage.

    Raises:
        ProbeUnreachableError: connection or authorisation failure.
    """
    cycle = _Cycle(client, probe)
    steps: list[tuple[str, Callable[[_Findings], None]]] = [
        ("plant", cycle.plant),
        ("forget", cycle.forget),
        ("before-rebuild", cycle.before_rebuild),
        ("after-rebuild", cycle.after_rebuild),
        ("after-more-turns", cycle.after_more_turns),
        ("echoes", cycle.echoes),
    ]
    failed: str | None = None
    try:
        for stage, step in steps:
            findings = _Findings()
            try:
                step(findings)
            except _StageAborted as exc:
                findings.fail(str(exc))
            out(f"cycle {number} {stage}: {findings.line()}")
            if not findings.ok:
                failed = stage
                break
    except (ProbeUnreachableError, KeyboardInterrupt):
        with contextlib.suppress(ProbeUnreachableError, _StageAborted, grpc.RpcError):
            cycle.cleanup(_Findings())  # best effort: do not leave the planted value behind
        raise
    findings = _Findings()
    try:
        cycle.cleanup(findings)
    except _StageAborted as exc:
        findings.fail(str(exc))
    out(f"cycle {number} cleanup: {findings.line()}")
    if failed is None and not findings.ok:
        failed = "cleanup"
    return failed


def probe(
    target: str,
    token: str,
    *,
    owner: str = DEFAULT_OWNER,
    cycles: int | None = 1,
    interval: float = 0.0,
    out: Callable[[str], None] | None = None,
) -> int:
    """Run the probe against ``target``.

    Args:
        target: ``HOST:PORT`` of a serving ``lethe``.
        token: bearer token allowed to act for ``owner``.
        owner: the owner id the synthetic threads and memories belong to.
        cycles: how many cycles; None runs until a cycle fails.
        interval: seconds to sleep between cycles.
        out: where stage lines go (default: stdout, flushed).

    Returns:
        0 when every stage of every cycle passed, 1 after the first failed
        cycle, 2 when the server is unreachable or refuses the token or owner
        (one line on stderr), 130 when interrupted (Ctrl-C; the running
        cycle's thread is cleaned up first, best effort).
    """
    write = out or (lambda line: print(line, flush=True))
    client = _Client(target, token, owner)
    state = _Probe()
    done = 0
    busy = 0.0  # seconds spent in cycles, sleeps excluded
    try:
        client.connect()
        while cycles is None or done < cycles:
            if done and interval > 0:
                time.sleep(interval)
            start = time.perf_counter()
            failed = _run_cycle(client, state, done + 1, write)
            busy += time.perf_counter() - start
            done += 1
            if failed is not None:
                write(f"probe: LEAK or failure in cycle {done}, stage {failed}")
                return 1
    except ProbeUnreachableError as exc:
        print(f"lethe probe: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"lethe probe: interrupted after {done} passed cycles", file=sys.stderr, flush=True)
        return 130
    finally:
        client.close()
    notes = "".join(f"; {n}" for n in [state.echoes.line(), *sorted(state.notes)])
    write(
        f"probe: {done} cycle{'s' if done != 1 else ''} ok in {busy:.2f} s "
        f"({busy / max(done, 1):.3f} s per cycle{notes})"
    )
    return 0


def _seconds(text: str) -> float:
    """``30``, ``2.5`` or a duration such as ``30s``/``5m`` → seconds (> 0)."""
    try:
        value = float(text)
    except ValueError:
        return parse_duration(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("interval must be positive")
    return value


def _owner_id(text: str) -> str:
    if not ID_RE.fullmatch(text):
        raise argparse.ArgumentTypeError("owner ids match [a-z0-9][a-z0-9-]{0,62}")
    return text


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("cycles must be at least 1")
    return value


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``lethe probe``'s flags to its sub-parser.

    Args:
        parser: the ``probe`` sub-parser; gains ``--target``, ``--token``,
            ``--interval`` (seconds), ``--cycles`` and ``--owner``.
    """
    parser.add_argument("--target", required=True, help="HOST:PORT of the server")
    parser.add_argument("--token", required=True, help="bearer token allowed to act for --owner")
    parser.add_argument(
        "--interval",
        type=_seconds,
        default=None,
        help="repeat cycles, sleeping this long between them (seconds, or 30s/5m; "
        "default: none, cycles run back to back)",
    )
    parser.add_argument(
        "--cycles",
        type=_positive,
        default=None,
        help="how many cycles (default: 1; with --interval: forever)",
    )
    parser.add_argument(
        "--owner", type=_owner_id, default=DEFAULT_OWNER, help="owner id of the probe's data"
    )


_STAGE_LINE = re.compile(r"cycle (\d+) ([a-z-]+): (.*)")


def stage_record(line: str) -> dict[str, Any] | None:
    """One stage line (``cycle 2 forget: ok``) as ``--json`` reports it.

    Args:
        line: a line :func:`probe` wrote.

    Returns:
        ``{"cycle": int, "stage": str, "status": "ok" | "LEAK" | "FAIL", "detail": str}``
        (``status`` is ``LEAK`` when any finding is a leak; ``detail`` is ``""``
        for ``ok``), or None for a line that is not a stage line.
    """
    match = _STAGE_LINE.fullmatch(line)
    if match is None:
        return None
    rest = match.group(3)
    status = "ok" if rest == "ok" else "LEAK" if "LEAK: " in rest else "FAIL"
    return {
        "cycle": int(match.group(1)),
        "stage": match.group(2),
        "status": status,
        "detail": "" if status == "ok" else rest,
    }


def run_probe(args: argparse.Namespace) -> int:
    """``lethe probe`` from parsed arguments.

    Args:
        args: parsed by a parser that :func:`add_probe_arguments` extended;
            with ``args.json`` true the stage lines are not printed and one
            JSON document ``{passed, cycles, stages: [stage_record...],
            seconds}`` goes to stdout instead (not when the exit status is 2
            or 130: the line on stderr says why).

    Returns:
        The exit status (see :func:`probe`).
    """
    lines: list[str] = []
    out = lines.append if getattr(args, "json", False) else None
    start = time.perf_counter()
    if args.interval is None:
        rc = probe(args.target, args.token, owner=args.owner, cycles=args.cycles or 1, out=out)
    else:
        rc = probe(
            args.target,
            args.token,
            owner=args.owner,
            cycles=args.cycles,
            interval=args.interval,
            out=out,
        )
    if out is not None and rc in (0, 1):
        stages = [r for r in map(stage_record, lines) if r is not None]
        cycles = max((r["cycle"] for r in stages), default=0)
        document = {
            "passed": rc == 0,
            "cycles": cycles,
            "stages": stages,
            "seconds": round(time.perf_counter() - start, 3),
        }
        print(json.dumps(document, indent=2, sort_keys=True), flush=True)
    return rc
