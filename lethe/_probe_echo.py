"""The probe's echo case: a fact repeated without lineage must not come back after its forget.

Declared lineage does not see an echo: an assistant turn that says a fact again
without ``context_refs``, a summary written afterwards from history that held
it. The case, in the cycle's own thread, as stage ``echoes``:

1. plant a distinctive fact (a committed user turn holding a fresh 20-hex
   secret among enough content words to be looked for), and a committed
   assistant turn that repeats it with no lineage; positive control: lexical
   search finds both;
2. forget the fact with ``echoes=TAINT`` and an echo guard of
   :data:`ECHO_GUARD_SECONDS`: the receipt must name the repetition among its
   echoes and count it acted on, and set a guard;
3. write a summary (committed, no sources) that contains the fact verbatim, as
   a summariser that read the history before the forget would: the guard must
   refuse it (``FAILED_PRECONDITION`` / ``ECHOES_FORGOTTEN``); if the server
   stored it anyway, it must at least not be served;
4. the secret must not come back through ``Search`` (every mode, owner-wide and
   in the thread) nor ``AssembleContext``.

Counted for the report (:class:`EchoTally`): echoes found, echoes acted on,
guard hits (refused summaries), guards set. The guard's short window keeps a
continuous probe from piling guards up on its owner; its key is destroyed by
the server when the window ends.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import grpc

from lethe._probe_base import (
    _MODES,
    SEARCH_TOP_K,
    _Client,
    _describe,
    _Findings,
    _reason,
    _StageAborted,
)
from lethe.v1 import common_pb2, memories_pb2, threads_pb2

__all__ = ["ECHO_GUARD_SECONDS", "EchoTally", "run_echo_case"]

ECHO_GUARD_SECONDS = 60.0
"""The echo guard of the probe's forget (seconds): long enough for the stage."""


@dataclass
class EchoTally:
    """What the echo case saw over every cycle (the probe's last line reports it)."""

    found: int = 0
    acted: int = 0
    guard_hits: int = 0
    guards: int = 0

    def line(self) -> str:
        """``echoes found N, acted on N, guard hits N, guards set N``."""
        return (
            f"echoes found {self.found}, acted on {self.acted}, "
            f"guard hits {self.guard_hits}, guards set {self.guards}"
        )


def _fact(secret: str) -> str:
    """A fact distinctive in every word: a guard set by an earlier cycle never matches it."""
    words = [secrets.token_hex(4) for _ in range(6)]
    return f"the probe cellist {secret} keeps violin {' '.join(words)} in cremona"


def _hits(c: _Client, query: str, mode: str, thread: str) -> list[tuple[str, str]]:
    """``(name, text)`` of a search's hits, or a stage abort on an unexpected error."""
    try:
        resp = c.call(
            c.api.search,
            c.parent,
            query_text=query,
            top_k=SEARCH_TOP_K,
            mode=mode,
            thread=thread,
            include_pending=bool(thread),
        )
    except grpc.RpcError as err:
        if mode == "DENSE" and _reason(err) == "BAD_FIELD":
            return []  # no embedder: the main stages say so
        raise _StageAborted(f"Search {mode} answered {_describe(err)}") from None
    return [
        (h.turn.name, h.turn.text) if h.HasField("turn") else (h.memory.name, h.memory.text)
        for h in resp.hits
    ]


def run_echo_case(c: _Client, thread: str, tally: EchoTally, f: _Findings) -> list[str]:
    """Stage ``echoes`` in ``thread`` (see the module docstring).

    Returns:
        The names of the memories it made (for the cycle's cleanup).

    Raises:
        _StageAborted: an RPC failed unexpectedly.
    """
    secret = secrets.token_hex(10)
    fact = _fact(secret)
    appended = c.must(
        "AppendTurns (echo case)",
        c.api.append_turns,
        thread,
        [
            threads_pb2.TurnInput(role=common_pb2.USER, text=fact, commit=True),
            threads_pb2.TurnInput(
                role=common_pb2.ASSISTANT, text=f"Wonderful: {fact}.", commit=True
            ),
        ],
    )
    said, repeated = appended.turns[0].name, appended.turns[1].name
    made = [m.name for m in appended.proposed]
    seen = {name for name, _ in _hits(c, secret, "LEXICAL", "")}
    if not {said, repeated} <= seen:
        f.fail("Search LEXICAL for the echo case's secret misses its turns before the forget")
    receipt = c.must(
        "Forget (echo case)",
        c.api.forget,
        [said],
        echoes="TAINT",
        echo_guard=ECHO_GUARD_SECONDS,
        reason="lethe probe",
    )
    tally.found += receipt.echoes_found
    tally.acted += receipt.echoes_acted
    if repeated not in receipt.echoes:
        f.leak(f"the forget's echo sweep did not find the repetition {repeated}")
    elif receipt.echoes_acted < 1:
        f.fail(f"receipt {receipt.name} found the repetition but acted on no echo")
    if receipt.HasField("echo_guard_expire_time"):
        tally.guards += 1
    else:
        f.fail(f"receipt {receipt.name} set no echo guard")
    summary = memories_pb2.Memory(
        kind=memories_pb2.Memory.SUMMARY,
        text=f"summary: the user talked about instruments. {fact}.",
        state=common_pb2.COMMITTED,
    )
    try:
        stored = c.call(c.api.create_memory, c.parent, summary)
        made.append(stored.name)
        f.fail(f"the guard let {stored.name}, echoing the forgotten fact, be stored")
    except grpc.RpcError as err:
        if (err.code(), _reason(err)) != (grpc.StatusCode.FAILED_PRECONDITION, "ECHOES_FORGOTTEN"):
            raise _StageAborted(f"CreateMemory (echo case) answered {_describe(err)}") from None
        tally.guard_hits += 1
    for scoped in ("", thread):
        for mode in _MODES:
            for name, text in _hits(c, secret, mode, scoped):
                if secret in text:
                    f.leak(f"Search {mode} returned {name} holding the forgotten fact")
    bundle = c.must("AssembleContext", c.api.assemble_context, thread, query_text=secret)
    if secret in str(bundle):
        f.leak("AssembleContext returns the forgotten fact")
    return made
