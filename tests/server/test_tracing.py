"""OpenTelemetry spans per RPC: collected from a real server, scanned for what must not be there.

The server's spans go to an in-memory exporter; after calls of every service
(content, ids and a token a test can recognise in every field), each span
carries only the method, the status code, the owner and the resource kind:
no text, title, query, id, resource name, token or error message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Lethe
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import lethe.client as lc
from lethe.v1 import threads_pb2
from server._tracing import method_kind, tracer_provider

ALLOWED = {
    "rpc.system",
    "rpc.service",
    "rpc.method",
    "rpc.grpc.status_code",
    "lethe.owner",
    "lethe.kind",
}
SECRETS = ("zebra-secret", "title-secret", "query-secret", "thr7f3a", "mem9c2b", "because-secret")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def traced(lethe_at: Callable[..., Lethe], tmp_path: Path) -> Iterator[tuple[Lethe, Any]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield lethe_at(tmp_path / "traced", tracer_provider=provider), exporter
    provider.shutdown()


def _exercise(lethe: Lethe) -> str:
    """Calls of every service, with content and ids to look for; returns alice's token."""
    token = lethe.token("alice")
    c = lethe.client(token=token)
    t = c.create_thread("owners/alice", thread_id="thr7f3a", title="title-secret").name
    turns = c.append_turns(
        t, [{"role": "USER", "text": "the zebra-secret lives here", "commit": True}]
    ).turns
    c.get_thread(t)
    c.get_turn(turns[0].name)
    list(c.iter_turns(t))
    memory = c.create_memory(
        "owners/alice",
        {"kind": "FACT", "text": "zebra-secret fact", "state": "COMMITTED"},
        memory_id="mem9c2b",
    )
    c.get_memory(memory.name)
    c.search("owners/alice", query_text="query-secret zebra")
    c.assemble_context(t, query_text="query-secret")
    c.set_retention([memory.name], ttl=3600)
    list(c.export_owner("owners/alice"))
    c.get_server_info()
    c.forget([turns[0].name], reason="because-secret")
    list(c.iter_deletions("owners/alice"))
    c.audit("owners/alice")
    with pytest.raises(lc.OwnerNotAllowed):
        c.get_thread("owners/bob/threads/thr7f3a")
    with pytest.raises(lc.RecordDeleted):
        c.get_turn(turns[0].name)
    c.stubs.threads.GetThread(
        threads_pb2.GetThreadRequest(name=t),
        metadata=(*c.metadata, ("traceparent", f"00-{TRACE_ID}-00f067aa0ba902b7-01")),
    )
    return token


def test_every_span_carries_only_the_method_the_code_the_owner_and_the_kind(
    traced: tuple[Lethe, Any],
) -> None:
    lethe, exporter = traced
    token = _exercise(lethe)
    spans: list[ReadableSpan] = list(exporter.get_finished_spans())
    names = {s.name for s in spans}
    for expected in (
        "lethe.v1.Threads/CreateThread",
        "lethe.v1.Threads/AppendTurns",
        "lethe.v1.Memories/CreateMemory",
        "lethe.v1.Retrieval/Search",
        "lethe.v1.Retrieval/AssembleContext",
        "lethe.v1.Lifecycle/Forget",
        "lethe.v1.Lifecycle/SetRetention",
        "lethe.v1.Lifecycle/ExportOwner",
        "lethe.v1.Lifecycle/GetServerInfo",
        "lethe.v1.Lifecycle/Audit",
    ):
        assert expected in names, expected
    for span in spans:
        assert set(span.attributes or {}) <= ALLOWED, span.name
        assert span.attributes is not None
        assert span.attributes["rpc.system"] == "grpc"
        assert span.events == ()
        assert not span.status.description
        text = span.to_json()
        for secret in (*SECRETS, token, "owners/alice/", "Bearer"):
            assert secret not in text, (span.name, secret)
    alice = [s for s in spans if (s.attributes or {}).get("lethe.owner") == "alice"]
    assert len(alice) >= 15
    forget = next(s for s in spans if s.name == "lethe.v1.Lifecycle/Forget")
    assert forget.attributes is not None
    assert (forget.attributes["lethe.kind"], forget.attributes["rpc.grpc.status_code"]) == (
        "record",
        0,
    )
    refused = [s for s in spans if (s.attributes or {}).get("rpc.grpc.status_code") == 7]
    assert [s.name for s in refused] == ["lethe.v1.Threads/GetThread"]
    assert refused[0].status.status_code.name == "ERROR"
    assert refused[0].attributes is not None
    assert refused[0].attributes["lethe.owner"] == "bob"  # the header, never the name
    gone = [s for s in spans if (s.attributes or {}).get("rpc.grpc.status_code") == 5]
    assert [s.name for s in gone] == ["lethe.v1.Threads/GetTurn"]
    joined = [s for s in spans if s.context.trace_id == int(TRACE_ID, 16)]
    assert [s.name for s in joined] == ["lethe.v1.Threads/GetThread"]
    assert joined[0].parent is not None
    assert joined[0].parent.span_id == int("00f067aa0ba902b7", 16)
    assert json.loads(joined[0].to_json())["kind"] == "SpanKind.SERVER"


def test_tracing_is_off_by_default_and_otlp_builds_the_standard_exporter(lethe: Lethe) -> None:
    assert lethe.server is not None
    assert lethe.server.config.tracing == "off"
    assert getattr(lethe.server, "_tracer_provider", None) is None
    assert tracer_provider("off") is None
    provider = tracer_provider("otlp")
    try:
        processors = provider._active_span_processor._span_processors
        exporter = processors[0].span_exporter
        assert type(exporter).__name__ == "OTLPSpanExporter"
    finally:
        provider.shutdown()
    with pytest.raises(ValueError, match="--tracing"):
        tracer_provider("zipkin")


@pytest.mark.parametrize(
    ("method", "kind"),
    [
        ("/lethe.v1.Threads/AppendTurns", "turn"),
        ("/lethe.v1.Threads/ListThreads", "thread"),
        ("/lethe.v1.Memories/ResolvePreference", "memory"),
        ("/lethe.v1.Repairs/SealRepair", "repair"),
        ("/lethe.v1.Lifecycle/ListDeletions", "deletion"),
        ("/lethe.v1.Events/Watch", "event"),
        ("/grpc.health.v1.Health/Check", "server"),
    ],
)
def test_the_kind_of_a_method(method: str, kind: str) -> None:
    assert method_kind(method) == kind
