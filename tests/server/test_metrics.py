"""The metrics an operator alerts on report what they say (API.md, "Metrics").

``lethe_pending_records`` / ``lethe_oldest_pending_age_seconds`` cover pending
records of every kind, the oldest by when it was stored; the standard gRPC
server metrics count and time every call, streams included.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest
from _helpers import append, create_thread, forget
from conftest import Lethe

from lethe.v1 import events_pb2, memories_pb2, threads_pb2


def _seconds(ts: object) -> float:
    return float(ts.seconds) + float(ts.nanos) / 1e9  # type: ignore[attr-defined]


def _gauge(lethe: Lethe, name: str) -> float:
    assert lethe.server is not None
    lethe.server.lifecycle.refresh_gauges()
    value = lethe.server.metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


def test_oldest_pending_age_counts_pending_memories(lethe: Lethe) -> None:
    """It read 0 while pending memories were minutes old.

    Only a turn at the head of the expiry queue was looked at.
    """
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    append(c, thread, ["committed turn"], commit=True)
    memory = c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent="owners/alice",
            memory=memories_pb2.Memory(kind=memories_pb2.Memory.FACT, text="x"),
        ),
        metadata=c.md,
    )
    assert lethe.server is not None
    later = time.time() + 300.0
    count, age = lethe.server.store.pending_stats(later)
    assert count == 1
    assert abs(age - (later - _seconds(memory.create_time))) < 0.01
    assert _gauge(lethe, "lethe_oldest_pending_age_seconds") > 0.0
    assert _gauge(lethe, "lethe_pending_records") == 1.0


def test_oldest_pending_age_is_the_oldest_not_the_soonest_to_expire(lethe: Lethe) -> None:
    """A long-lived pending turn stored first, a short-lived one later: the age is the first one's.

    The short-lived one is stored a second later; the age is the first one's,
    although the second expires sooner.
    """
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    (old,) = append(c, thread, ["stored first, kept 72 h"])
    time.sleep(1.0)
    append(c, thread, ["stored later, kept 1 h"], ttl=3600.0)
    assert lethe.server is not None
    later = time.time() + 300.0
    count, age = lethe.server.store.pending_stats(later)
    assert count == 2
    assert abs(age - (later - _seconds(old.create_time))) < 0.01


def test_no_pending_record_is_age_zero(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    append(c, thread, ["committed"], commit=True)
    assert lethe.server is not None
    assert lethe.server.store.pending_stats(time.time() + 60.0) == (0, 0.0)


def _sample(lethe: Lethe, name: str, **labels: str) -> float:
    assert lethe.server is not None
    return lethe.server.metrics.registry.get_sample_value(name, labels) or 0.0


def _until(done: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the metric never reached its value"
        time.sleep(0.01)


def _threads(method: str, kind: str = "UNARY") -> dict[str, str]:
    return {"grpc_type": kind, "grpc_service": "lethe.v1.Threads", "grpc_method": method}


def test_unary_calls_are_counted_by_code_and_timed(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", thread_id="t")
    c.threads.GetThread(threads_pb2.GetThreadRequest(name=thread), metadata=c.md)
    with pytest.raises(grpc.RpcError):
        c.threads.GetThread(
            threads_pb2.GetThreadRequest(name="owners/alice/threads/nope"), metadata=c.md
        )
    with pytest.raises(grpc.RpcError):
        c.threads.GetThread(threads_pb2.GetThreadRequest(name=thread))  # no token
    labels = _threads("GetThread")
    # A call is counted as handled just after its status is sent (grpc.aio runs
    # the interceptor's epilogue after abort): wait for the third.
    _until(lambda: _sample(lethe, "grpc_server_handling_seconds_count", **labels) == 3)
    assert _sample(lethe, "grpc_server_started_total", **labels) == 3
    assert _sample(lethe, "grpc_server_handled_total", **labels, grpc_code="OK") == 1
    assert _sample(lethe, "grpc_server_handled_total", **labels, grpc_code="NOT_FOUND") == 1
    assert _sample(lethe, "grpc_server_handled_total", **labels, grpc_code="UNAUTHENTICATED") == 1
    assert _sample(lethe, "grpc_server_handling_seconds_count", **labels) == 3
    assert _sample(lethe, "grpc_server_msg_received_total", **labels) == 3
    assert _sample(lethe, "grpc_server_msg_sent_total", **labels) == 1
    method = "/lethe.v1.Threads/GetThread"
    assert _sample(lethe, "lethe_rpc_duration_seconds_count", method=method, code="OK") == 1
    assert _sample(lethe, "lethe_rpc_duration_seconds_count", method=method, code="NOT_FOUND") == 1


def _watch_labels() -> dict[str, str]:
    return {
        "grpc_type": "SERVER_STREAMING",
        "grpc_service": "lethe.v1.Events",
        "grpc_method": "Watch",
    }


def test_a_stream_is_counted_per_message_and_timed_when_it_ends(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    (turn,) = append(c, thread, ["to forget"], commit=True)
    forget(c, turn.name)
    stream = c.events.Watch(events_pb2.WatchRequest(parent="owners/alice"), metadata=c.md)
    first = next(iter(stream))
    assert first.type == events_pb2.RECORD_DELETED
    time.sleep(0.3)
    stream.cancel()  # type: ignore[no-untyped-call]
    labels = _watch_labels()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:  # the server notices within a poll (0.2 s)
        if _sample(lethe, "grpc_server_handled_total", **labels, grpc_code="CANCELLED"):
            break
        time.sleep(0.05)
    assert _sample(lethe, "grpc_server_started_total", **labels) == 1
    assert _sample(lethe, "grpc_server_handled_total", **labels, grpc_code="CANCELLED") == 1
    assert _sample(lethe, "grpc_server_msg_received_total", **labels) == 1
    assert _sample(lethe, "grpc_server_msg_sent_total", **labels) >= 1
    assert _sample(lethe, "grpc_server_handling_seconds_count", **labels) == 1
    assert _sample(lethe, "grpc_server_handling_seconds_sum", **labels) >= 0.3


def test_a_stream_refused_at_once_is_counted_with_its_code(lethe: Lethe) -> None:
    c = lethe.client("alice")
    stream = c.events.Watch(
        events_pb2.WatchRequest(parent="owners/alice", after="not-an-id"), metadata=c.md
    )
    with pytest.raises(grpc.RpcError) as info:
        next(iter(stream))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    labels = _watch_labels()
    _until(lambda: _sample(lethe, "grpc_server_handling_seconds_count", **labels) == 1)
    assert _sample(lethe, "grpc_server_handled_total", **labels, grpc_code="INVALID_ARGUMENT") == 1
    assert _sample(lethe, "grpc_server_msg_sent_total", **labels) == 0


def test_health_and_reflection_calls_are_measured_too(lethe: Lethe) -> None:
    """The health and reflection services go through the same measured wrapper as Lethe's."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{lethe.port}")
    lethe.channels.append(channel)
    health = health_pb2_grpc.HealthStub(channel)
    health.Check(health_pb2.HealthCheckRequest(service=""))
    with pytest.raises(grpc.RpcError):
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    list(
        reflect.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
    )
    check = {"grpc_type": "UNARY", "grpc_service": "grpc.health.v1.Health", "grpc_method": "Check"}
    _until(lambda: _sample(lethe, "grpc_server_handling_seconds_count", **check) == 2)
    assert _sample(lethe, "grpc_server_handled_total", **check, grpc_code="OK") == 1
    assert _sample(lethe, "grpc_server_handled_total", **check, grpc_code="NOT_FOUND") == 1
    info = {
        "grpc_type": "BIDI_STREAMING",
        "grpc_service": "grpc.reflection.v1alpha.ServerReflection",
        "grpc_method": "ServerReflectionInfo",
    }
    _until(lambda: _sample(lethe, "grpc_server_handling_seconds_count", **info) == 1)
    assert _sample(lethe, "grpc_server_msg_received_total", **info) == 1
    assert _sample(lethe, "grpc_server_msg_sent_total", **info) == 1
