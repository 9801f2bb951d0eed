"""Prometheus metrics (API.md, "Metrics") and the wrapper that times every RPC.

The metrics live on their own registry, so a test can run several servers in
one process.

Besides Lethe's own metrics, :class:`MeasuredServer` exports the
standard gRPC server metrics under the names of go-grpc-prometheus (and
py-grpc-prometheus), so the usual dashboards and alerts apply:

==================================  =========  ==================================================
metric                              type       labels
==================================  =========  ==================================================
``grpc_server_started_total``       counter    grpc_type, grpc_service, grpc_method
``grpc_server_handled_total``       counter    ... and grpc_code (``OK``, ``NOT_FOUND``, ...)
``grpc_server_handling_seconds``    histogram  grpc_type, grpc_service, grpc_method
``grpc_server_msg_received_total``  counter    grpc_type, grpc_service, grpc_method
``grpc_server_msg_sent_total``      counter    grpc_type, grpc_service, grpc_method
==================================  =========  ==================================================

``grpc_type`` is ``UNARY``, ``SERVER_STREAMING``, ``CLIENT_STREAMING`` or
``BIDI_STREAMING``; ``grpc_code`` is the status code's name as grpcio spells
it (py-grpc-prometheus's spelling; go-grpc-prometheus writes ``NotFound``).
Streams (``Events.Watch``, health watches, reflection) are counted and timed
when they end: a stream that ends because the client went away is
``CANCELLED``. Every message is counted, unary ones too (as
go-grpc-prometheus does). The library py-grpc-prometheus itself is not used:
it reads grpcio's private ``_state``, never counts a streaming call as
handled and never times one.

Thread rules: metrics are safe from any thread; :class:`MeasuredServer`
registers before the server starts, and its wrappers run on the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
import grpc.aio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Seconds; finer than Prometheus' defaults below 5 ms, where this server's RPCs live.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.0035,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# Seconds; the latency buckets, then up to an hour for streams (Events.Watch).
STREAM_BUCKETS = (*LATENCY_BUCKETS, 30.0, 60.0, 300.0, 900.0, 3600.0)
_GRPC_LABELS = ("grpc_type", "grpc_service", "grpc_method")


class Metrics:
    """The server's metrics; names and meanings from API.md."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rpc_duration = Histogram(
            "lethe_rpc_duration_seconds",
            "Server-side time per RPC, seconds.",
            ["method", "code"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.deletion_latency = Histogram(
            "lethe_deletion_latency_seconds",
            "From a forget (or expiry) request to keys destroyed and every destination done.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.outstanding_deletions = Gauge(
            "lethe_outstanding_deletions",
            "Deletion-log entries with a destination not yet done.",
            registry=self.registry,
        )
        self.pending_records = Gauge(
            "lethe_pending_records",
            "Pending turns and memories waiting for a decision.",
            registry=self.registry,
        )
        self.oldest_pending_age = Gauge(
            "lethe_oldest_pending_age_seconds",
            "Age of the oldest pending turn or memory (since it was stored), seconds.",
            registry=self.registry,
        )
        self.index_bytes = Gauge(
            "lethe_index_bytes",
            "Estimated bytes of the in-memory indexes held, all owners (bounded by "
            "--index-cache-size).",
            registry=self.registry,
        )
        self.index_vectors = Gauge(
            "lethe_index_vectors", "Vectors held in FAISS, all owners.", registry=self.registry
        )
        self.orphan_derivatives = Gauge(
            "lethe_orphan_derivatives",
            "Derivatives with a missing source, from the periodic audit (must stay 0).",
            registry=self.registry,
        )
        self.stale_summaries = Gauge(
            "lethe_stale_summaries",
            "Summaries older than their thread's last deletion, from the periodic audit.",
            registry=self.registry,
        )
        self.overdue_commitments = Gauge(
            "lethe_overdue_commitments",
            "Open commitments past their due time.",
            registry=self.registry,
        )
        self.shred_horizon = Gauge(
            "lethe_shred_horizon_seconds",
            "How long a destroyed key may still exist in free pages or keystore snapshots "
            "(age of the oldest shred not yet completed by rotation).",
            registry=self.registry,
        )
        self.echoes_found = Counter(
            "lethe_echoes_found",
            "Records found by forgets' echo sweeps repeating a forgotten text outside its "
            "declared lineage",
            registry=self.registry,
        )
        self.echoes_acted = Counter(
            "lethe_echoes_acted",
            "Echoes tainted, deleted or forgotten by the forgets that found them",
            registry=self.registry,
        )
        self.echo_guard_hits = Counter(
            "lethe_echo_guard_hits",
            "Writes and commits refused or stored tainted by an echo guard",
            registry=self.registry,
        )
        self.echo_guard_keys = Gauge(
            "lethe_echo_guard_keys",
            "Echo guards standing, each with one live key (destroyed when its window ends)",
            registry=self.registry,
        )
        self.keystore_keys = Gauge(
            "lethe_keystore_keys", "Live wrapped keys.", registry=self.registry
        )
        self.inflight_calls = Gauge(
            "lethe_inflight_calls",
            "Unary calls admitted and not finished (running on a worker or waiting for one).",
            registry=self.registry,
        )
        self.queued_calls = Gauge(
            "lethe_queued_calls",
            "Admitted calls waiting for a worker thread.",
            registry=self.registry,
        )
        self.pool_stalls = Counter(
            "lethe_pool_stalls",
            "Calls started past --max-running because every running slot stayed taken 50 ms "
            "with none given back (steady growth: calls hold slots while they wait).",
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "lethe_open_streams", "Open server streams (Events.Watch).", registry=self.registry
        )
        self.refused_calls = Counter(
            "lethe_refused_calls",
            "Calls and streams refused at once: TOO_MANY_REQUESTS, TOO_MANY_STREAMS, DRAINING.",
            ["reason"],
            registry=self.registry,
        )
        self.lmdb_readers = Gauge(
            "lethe_lmdb_readers",
            "Reader slots of the data environment in use (read transactions open now).",
            registry=self.registry,
        )
        self.stray_key_files = Gauge(
            "lethe_stray_key_files",
            "Temporary KEK files a crash left beside the KEK file; they may hold KEK versions a "
            "rotation destroyed (must stay 0: the server removes them at start and after each "
            "KEK write).",
            registry=self.registry,
        )
        self.index_snapshot_strays = Gauge(
            "lethe_index_snapshot_strays",
            "Stray index-snapshot files and keys: a temporary file, a snapshot whose key a "
            "deletion destroyed, a key without a snapshot (a hint: none opens anything, and "
            "start-up removes them; a temporary file counts while a snapshot is written).",
            registry=self.registry,
        )
        self.records_without_key = Gauge(
            "lethe_records_without_key",
            "Live records whose key is missing with no decided deletion: kept, unreadable, "
            "for an operator to decide (must stay 0).",
            registry=self.registry,
        )
        self.unreadable_records = Gauge(
            "lethe_unreadable_records",
            "Records whose stored ciphertext failed to open since start (corruption, a key "
            "that does not match); each is skipped by bulk reads (must stay 0).",
            registry=self.registry,
        )
        self.store_bytes = Gauge(
            "lethe_store_bytes",
            "Bytes of the data environment in use (pages times the page size).",
            registry=self.registry,
        )
        self.disk_reserve_bytes = Gauge(
            "lethe_disk_reserve_bytes",
            "Bytes of the ballast file a forget may free on a full filesystem (--disk-reserve); "
            "0 after a forget spent it, until the filesystem has room again.",
            registry=self.registry,
        )
        self.store_fill_ratio = Gauge(
            "lethe_store_fill_ratio",
            "Fraction of --max-store-size the store's data uses (writes that add data fail "
            "with STORE_FULL at 1; deletions go on, on a reserve).",
            registry=self.registry,
        )
        self.grpc_started = Counter(
            "grpc_server_started_total",
            "Total number of RPCs started on the server.",
            _GRPC_LABELS,
            registry=self.registry,
        )
        self.grpc_handled = Counter(
            "grpc_server_handled_total",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            (*_GRPC_LABELS, "grpc_code"),
            registry=self.registry,
        )
        self.grpc_handling = Histogram(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level "
            "handled by the server.",
            _GRPC_LABELS,
            buckets=STREAM_BUCKETS,
            registry=self.registry,
        )
        self.grpc_received = Counter(
            "grpc_server_msg_received_total",
            "Total number of RPC stream messages received on the server.",
            _GRPC_LABELS,
            registry=self.registry,
        )
        self.grpc_sent = Counter(
            "grpc_server_msg_sent_total",
            "Total number of gRPC stream messages sent by the server.",
            _GRPC_LABELS,
            registry=self.registry,
        )


class _Series:
    """The labelled children of one method's RPC metrics, looked up once.

    A ``labels()`` lookup takes a lock and builds a key, and every call made
    five.
    """

    __slots__ = (
        "_by_code",
        "_labels",
        "_method",
        "_metrics",
        "handling",
        "received",
        "sent",
        "started",
    )

    def __init__(self, metrics: Metrics, method: str, grpc_type: str) -> None:
        service, _, name = method.lstrip("/").rpartition("/")
        self._metrics = metrics
        self._method = method
        self._labels = (grpc_type, service, name)
        self.started = metrics.grpc_started.labels(*self._labels)
        self.received = metrics.grpc_received.labels(*self._labels)
        self.sent = metrics.grpc_sent.labels(*self._labels)
        self.handling = metrics.grpc_handling.labels(*self._labels)
        # code -> (handled counter, rpc_duration histogram); one dict entry, so a
        # call on another thread sees both children or neither.
        self._by_code: dict[str, tuple[Any, Any]] = {}

    def done(self, code: str, elapsed: float) -> None:
        """Count one finished call with status ``code`` that took ``elapsed`` seconds."""
        children = self._by_code.get(code)
        if children is None:
            children = self._by_code[code] = (
                self._metrics.grpc_handled.labels(*self._labels, code),
                self._metrics.rpc_duration.labels(self._method, code),
            )
        children[0].inc()
        self.handling.observe(elapsed)
        children[1].observe(elapsed)


class _Call:
    """One RPC being measured: started when made, handled once by :meth:`done`."""

    __slots__ = ("_done", "_series", "_start")

    def __init__(self, series: _Series) -> None:
        self._series = series
        self._start = time.perf_counter()
        self._done = False
        series.started.inc()

    def received(self) -> None:
        self._series.received.inc()

    def sent(self) -> None:
        self._series.sent.inc()

    def done(self, code: str) -> None:
        if self._done:
            return
        self._done = True
        self._series.done(code, time.perf_counter() - self._start)


class CallMeter:
    """Counts and times the calls of a transport that is not grpc's server (the Connect listener).

    Its calls land in the same series as gRPC's (the standard gRPC server
    metrics and ``lethe_rpc_duration_seconds``), so a dashboard or an alert
    sees every call of the API whichever transport carried it; ``code`` is
    the status code's name as grpcio spells it.

    Args:
        metrics: the server's metrics.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._series: dict[str, _Series] = {}  # method -> its children; event loop only

    def start(self, method: str, streaming: bool) -> _Call:
        """One call of ``method`` begins (``/lethe.v1.Threads/CreateThread``)."""
        series = self._series.get(method)
        if series is None:
            kind = "SERVER_STREAMING" if streaming else "UNARY"
            series = self._series[method] = _Series(self._metrics, method, kind)
        return _Call(series)


def call_status(context: Any, default: str) -> str:
    """The status code the handler set on ``context`` (by abort or set_code), else ``default``."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int) and not isinstance(code, bool):
        for member in grpc.StatusCode:
            if member.value[0] == code:
                return member.name
    return default


class MeasuredServer:
    """Registers handlers on a grpc.aio server inside the RPC measurements.

    Every RPC of the asyncio server, unary and streaming, is counted and timed
    in the standard gRPC server metrics and in
    ``lethe_rpc_duration_seconds{method,code}``. Each method's handler is
    wrapped once, when it is registered, instead of through an interceptor on
    every call: grpc.aio runs an interceptor chain as coroutines on every call
    (the chain and the measurements cost 35-40 µs of the event loop's time per
    call, measured without either; without the chain, an empty call's answers
    a second rose 1-10 % in three interleaved runs of 16 clients).

    It stands in for the server where handlers are registered: pass it to a
    generated ``add_*Servicer_to_server``, or call
    :meth:`add_generic_rpc_handlers` and :meth:`add_registered_method_handlers`
    as on the server itself. The handlers it wraps may be coroutine functions
    or plain functions (unary responses), async or plain generators (streamed
    responses), as grpc.aio allows; the wrapped handler is always async.

    Args:
        server: the server the handlers go to.
        metrics: the server's metrics.
    """

    def __init__(self, server: grpc.aio.Server, metrics: Metrics) -> None:
        self._server = server
        self._metrics = metrics
        # method -> (the handler registered, its measured wrapper): one wrapper
        # per method, shared by the generic and the registered lookups.
        self._wrapped: dict[str, tuple[Any, grpc.RpcMethodHandler[Any, Any]]] = {}

    def add_generic_rpc_handlers(
        self, handlers: Iterable[grpc.GenericRpcHandler[Any, Any]]
    ) -> None:
        """Register ``handlers``, each method's answer measured."""
        self._server.add_generic_rpc_handlers([_MeasuredHandler(h, self) for h in handlers])

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        """Register ``handlers`` of ``service`` by method name, each measured."""
        self._server.add_registered_method_handlers(  # type: ignore[attr-defined]  # not in grpc-stubs
            service,
            {name: self.measured(f"/{service}/{name}", h) for name, h in handlers.items()},
        )

    def measured(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """``handler`` of ``method`` inside the measurements (built once per method)."""
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """``handler`` of ``method`` inside the measurements (one :class:`_Call` per call)."""
        kinds = {
            (False, False): "UNARY",
            (False, True): "SERVER_STREAMING",
            (True, False): "CLIENT_STREAMING",
            (True, True): "BIDI_STREAMING",
        }
        grpc_type = kinds[(bool(handler.request_streaming), bool(handler.response_streaming))]
        series = _Series(self._metrics, method, grpc_type)

        async def requests(call: _Call, iterator: Any) -> AsyncIterator[Any]:
            if hasattr(iterator, "__aiter__"):
                async for request in iterator:
                    call.received()
                    yield request
            else:
                for request in iterator:
                    call.received()
                    yield request

        def unary_response(behaviour: Callable[..., Any]) -> Callable[..., Any]:
            async def run(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                call = _Call(series)
                if handler.request_streaming:
                    request = requests(call, request)
                else:
                    call.received()
                try:
                    response = behaviour(request, context)
                    if inspect.isawaitable(response):
                        response = await response
                except BaseException:
                    call.done(call_status(context, "UNKNOWN"))
                    raise
                call.sent()
                call.done(call_status(context, "OK"))
                return response

            return run

        def stream_response(behaviour: Callable[..., Any]) -> Callable[..., Any]:
            async def run(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                call = _Call(series)
                if handler.request_streaming:
                    request = requests(call, request)
                else:
                    call.received()
                code = "CANCELLED"  # unless the stream ends by itself (below)
                try:
                    responses = behaviour(request, context)
                    if hasattr(responses, "__aiter__"):
                        async for response in responses:
                            call.sent()
                            yield response
                    else:
                        for response in responses:
                            call.sent()
                            yield response
                    code = call_status(context, "CANCELLED" if context.cancelled() else "OK")
                except (GeneratorExit, asyncio.CancelledError):
                    raise  # closed by grpc: the call is gone
                except BaseException:
                    code = call_status(context, "UNKNOWN")
                    raise
                finally:
                    call.done(code)

            return run

        common = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                unary_response(handler.unary_unary), **common
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                unary_response(handler.stream_unary), **common
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                stream_response(handler.unary_stream), **common
            )
        return grpc.stream_stream_rpc_method_handler(
            stream_response(handler.stream_stream),  # type: ignore[arg-type]
            **common,
        )


class _MeasuredHandler(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """A generic handler whose methods answer through :meth:`MeasuredServer.measured`."""

    def __init__(self, inner: grpc.GenericRpcHandler[Any, Any], server: MeasuredServer) -> None:
        self._inner = inner
        self._server = server

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return self._server.measured(handler_call_details.method, handler)
