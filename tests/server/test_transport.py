"""Transport settings: keepalive enforcement, message-size limits, and draining.

The keepalive enforcement policy, message-size limits as settings (over gRPC
and over Connect alike), and draining — health ``NOT_SERVING`` as soon as it
starts, new calls refused with ``DRAINING``, streams ended with it, calls in
flight finished and acknowledged, on the gRPC and on the Connect listener.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from _helpers import create_thread, error_reason, wait_for
from conftest import Lethe
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lethe.v1 import common_pb2, events_pb2, threads_pb2
from server import ServerConfig


def test_default_keepalive_policy_accepts_pings_every_ten_seconds() -> None:
    options = dict(ServerConfig().grpc_options())
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 10_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.max_receive_message_length"] == 16 * 1024 * 1024
    assert options["grpc.max_send_message_length"] == 16 * 1024 * 1024


def _pinging_channel(port: int, every_ms: int) -> grpc.Channel:
    return grpc.insecure_channel(
        f"127.0.0.1:{port}",
        options=[
            ("grpc.keepalive_time_ms", every_ms),
            ("grpc.keepalive_timeout_ms", 5000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ],
    )


def _hold_watch(channel: grpc.Channel, token: str, seconds: float) -> grpc.StatusCode:
    """Keep an idle Watch open ``seconds``; how it ended (DEADLINE_EXCEEDED = it lasted)."""
    from lethe._rpc import Stubs

    c = Stubs(channel, token)
    stream: Any = c.events.Watch(
        events_pb2.WatchRequest(parent="owners/alice"), metadata=c.md, timeout=seconds
    )
    try:
        for _ in stream:
            pass
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_keepalive_pings_at_the_policy_interval_are_kept(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    # The policy is scaled down (2 s) so the test takes seconds; the default
    # (10 s, pinned above) held a client pinging every 10 s for 45 s here.
    srv = lethe_at(tmp_path / "d", keepalive_min_interval=2.0)
    polite = _pinging_channel(srv.port, 2000)
    srv.channels.append(polite)
    assert _hold_watch(polite, srv.token("alice"), 9.0) == grpc.StatusCode.DEADLINE_EXCEEDED


def test_keepalive_pings_faster_than_the_policy_are_cut(lethe: Lethe) -> None:
    # A 1 s keepalive is still too fast for the default policy: grpc answers
    # GOAWAY too_many_pings after two strikes.
    rude = _pinging_channel(lethe.port, 1000)
    lethe.channels.append(rude)
    assert _hold_watch(rude, lethe.token("alice"), 9.0) == grpc.StatusCode.UNAVAILABLE


def _append(stubs: Any, c: Any, thread: str, *texts: str) -> threads_pb2.AppendTurnsResponse:
    request = threads_pb2.AppendTurnsRequest(
        parent=thread, turns=[threads_pb2.TurnInput(role=common_pb2.USER, text=t) for t in texts]
    )
    response: threads_pb2.AppendTurnsResponse = stubs.threads.AppendTurns(
        request, metadata=tuple(c.md), timeout=30
    )
    return response


def test_message_size_limits_are_settings(
    lethe_at: Callable[..., Lethe], tmp_path: Path, transport: str
) -> None:
    srv = lethe_at(tmp_path / "d", max_receive_message_bytes=64 * 1024)
    c = srv.client("alice")
    stubs = srv.stubs(transport, c)
    thread = create_thread(c, "alice")
    _append(stubs, c, thread, "x" * 60_000)
    with pytest.raises(grpc.RpcError) as big:
        _append(stubs, c, thread, "x" * 40_000, "y" * 40_000)
    assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(c.list_turns(thread).turns) == 1  # the refused request wrote nothing


def test_the_send_limit_refuses_a_larger_response(
    lethe_at: Callable[..., Lethe], tmp_path: Path, transport: str
) -> None:
    srv = lethe_at(tmp_path / "d", max_send_message_bytes=64 * 1024)
    c = srv.client("alice")
    stubs = srv.stubs(transport, c)
    thread = create_thread(c, "alice")
    _append(stubs, c, thread, "x" * 40_000)
    listed = stubs.threads.ListTurns(
        threads_pb2.ListTurnsRequest(parent=thread), metadata=tuple(c.md), timeout=30
    )
    assert len(listed.turns) == 1
    _append(stubs, c, thread, "y" * 40_000)
    with pytest.raises(grpc.RpcError) as big:  # both texts: about 80 KB
        stubs.threads.ListTurns(
            threads_pb2.ListTurnsRequest(parent=thread), metadata=tuple(c.md), timeout=30
        )
    assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_drain_turns_health_not_serving_refuses_new_calls_ends_streams_and_finishes_calls(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    srv = lethe_at(tmp_path / "d", max_workers=1)
    assert srv.server is not None
    server = srv.server
    alice = srv.client("alice")
    thread = create_thread(alice, "alice")
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
    srv.channels.append(channel)
    health = health_pb2_grpc.HealthStub(channel)
    stream: Any = alice.events.Watch(
        events_pb2.WatchRequest(parent="owners/alice"), metadata=tuple(alice.md), timeout=30
    )
    assert server.edge is not None
    wait_for(lambda: server.edge is not None and server.edge.admission.streams == 1, "stream")
    # A call in flight: the one worker is held, so the append waits in the queue.
    release = threading.Event()
    assert server.executor is not None
    holder = server.executor.submit("test-holder", lambda: release.wait(30))
    in_flight = alice.threads.AppendTurns.future(
        threads_pb2.AppendTurnsRequest(
            parent=thread,
            turns=[threads_pb2.TurnInput(role=common_pb2.USER, text="in flight", commit=True)],
        ),
        metadata=tuple(alice.md),
        timeout=30,
    )
    wait_for(lambda: server.edge is not None and server.edge.admission.inflight == 1, "queued")
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 20.0})
    stopper.start()
    try:

        def not_serving() -> bool:
            resp = health.Check(health_pb2.HealthCheckRequest(), timeout=2)
            return bool(resp.status == health_pb2.HealthCheckResponse.NOT_SERVING)

        wait_for(not_serving, "NOT_SERVING")
        for service in ("lethe.v1.Threads", "lethe.v1.Events"):
            resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as refused:
            alice.threads.GetThread(
                threads_pb2.GetThreadRequest(name=thread), metadata=tuple(alice.md), timeout=5
            )
        assert error_reason(refused.value) == (grpc.StatusCode.UNAVAILABLE, "DRAINING")
        with pytest.raises(grpc.RpcError) as ended:
            for _ in stream:
                pass
        assert error_reason(ended.value) == (grpc.StatusCode.UNAVAILABLE, "DRAINING")
    finally:
        release.set()
    holder.result(timeout=10)
    (turn,) = in_flight.result(timeout=20).turns  # acknowledged during the drain
    stopper.join(timeout=30)
    assert not stopper.is_alive()
    srv.server = None
    srv.start()  # the acknowledged write survived the stop
    again = srv.client(token=alice.token)
    got = again.threads.GetTurn(threads_pb2.GetTurnRequest(name=turn.name), metadata=again.md)
    assert got.text == "in flight"


def test_a_grpc_shutdown_that_never_ends_does_not_hold_the_stop(
    lethe: Lethe, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that never ends cannot hold the stop: it is bounded by grace + STOP_SLACK_SECONDS.

    grpc.aio's stop waits for every handler to end; one that never did held a
    test's teardown for over ten minutes. The drain bounds it: grace plus
    STOP_SLACK_SECONDS, then the store closes anyway, with an error log.
    """
    import asyncio

    import server._app as app

    server = lethe.server
    assert server is not None
    assert server._grpc is not None
    real_stop = server._grpc.stop

    async def stop_then_hang(grace: float | None) -> None:
        await real_stop(grace)  # the real server stops...
        await asyncio.Event().wait()  # ...and its shutdown never reports it

    monkeypatch.setattr(server._grpc, "stop", stop_then_hang)
    monkeypatch.setattr(app, "STOP_SLACK_SECONDS", 0.5)
    started = time.monotonic()
    with caplog.at_level("ERROR", logger="server._app"):
        server.stop(grace=0.5)
    assert time.monotonic() - started < 10
    assert server._stopped.is_set()
    assert any("did not stop within" in r.getMessage() for r in caplog.records)
    lethe.server = None  # stopped here


def test_a_grpc_shutdown_that_blocks_the_event_loop_does_not_hold_the_stop(
    lethe: Lethe, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A grpc.aio shutdown that blocks the event loop's thread cannot hold the stop either.

    grpc.aio's Cython shutdown once blocked the event loop's thread itself (a
    fresh-clone CI run hung in a teardown, the loop thread inside
    ``Server.stop``), so no timeout on the loop could fire. ``stop`` bounds the
    wait from the calling thread too, then closes the store anyway.
    """
    import server._app as app

    server = lethe.server
    assert server is not None
    assert server._grpc is not None
    real_stop = server._grpc.stop
    release = threading.Event()

    async def stop_blocking_the_loop(grace: float | None) -> None:
        await real_stop(grace)
        release.wait(30)  # blocks the loop thread, as the C shutdown did

    monkeypatch.setattr(server._grpc, "stop", stop_blocking_the_loop)
    monkeypatch.setattr(app, "STOP_SLACK_SECONDS", 0.5)
    started = time.monotonic()
    try:
        with caplog.at_level("ERROR", logger="server._app"):
            server.stop(grace=0.5)
        assert time.monotonic() - started < 10
        assert server._stopped.is_set()
        assert any("event loop" in r.getMessage() for r in caplog.records)
    finally:
        release.set()
    lethe.server = None  # stopped here


def test_drain_over_connect_refuses_new_calls_ends_streams_and_finishes_calls(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    srv = lethe_at(tmp_path / "d", max_workers=1)
    assert srv.server is not None
    server = srv.server
    alice = srv.client("alice")
    thread = create_thread(alice, "alice")
    http = srv.connect()
    stream: Any = http.events.Watch(
        events_pb2.WatchRequest(parent="owners/alice"), metadata=tuple(alice.md), timeout=30
    )
    wait_for(lambda: server.edge is not None and server.edge.admission.streams == 1, "stream")
    release = threading.Event()
    assert server.executor is not None
    holder = server.executor.submit("test-holder", lambda: release.wait(30))
    calls = ThreadPoolExecutor(1)
    in_flight = calls.submit(_append, http, alice, thread, "in flight")
    wait_for(lambda: server.edge is not None and server.edge.admission.inflight == 1, "queued")
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 20.0})
    stopper.start()
    try:

        def refused() -> tuple[grpc.StatusCode, str] | None:
            try:
                http.threads.GetThread(
                    threads_pb2.GetThreadRequest(name=thread), metadata=tuple(alice.md), timeout=5
                )
            except grpc.RpcError as err:
                return error_reason(err)
            return None

        wait_for(lambda: refused() is not None, "a refusal over Connect")
        assert refused() == (grpc.StatusCode.UNAVAILABLE, "DRAINING")
        with pytest.raises(grpc.RpcError) as ended:
            for _ in stream:
                pass
        assert error_reason(ended.value) == (grpc.StatusCode.UNAVAILABLE, "DRAINING")
    finally:
        release.set()
        calls.shutdown(wait=False)
    holder.result(timeout=10)
    (turn,) = in_flight.result(timeout=20).turns  # acknowledged during the drain
    stopper.join(timeout=30)
    assert not stopper.is_alive()
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.1", srv.http_port), timeout=5),
    ):
        pass  # the HTTP listener is closed
    srv.server = None
    srv.start()
    again = srv.client(token=alice.token)
    got = again.threads.GetTurn(threads_pb2.GetTurnRequest(name=turn.name), metadata=again.md)
    assert got.text == "in flight"
