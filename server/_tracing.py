"""OpenTelemetry spans per RPC, off by default, that carry no content, no token and no name.

With ``lethe serve --tracing otlp`` every RPC (and every health and reflection
call) is one span of kind ``SERVER``, sent by OpenTelemetry's standard OTLP
exporter over gRPC to the collector the standard variables name
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
``OTEL_EXPORTER_OTLP_HEADERS``, …; default ``localhost:4317``), batched. Its
name is the method (``lethe.v1.Lifecycle/Forget``) and its attributes are
only these:

=====================  ======================================================
``rpc.system``         ``grpc``
``rpc.service``        ``lethe.v1.Lifecycle``
``rpc.method``         ``Forget``
``rpc.grpc.status_code``  the status code, as a number
``lethe.owner``        the owner id of the call's ``x-lethe-owner`` metadata,
                       when it is one (the typed clients always send it; the
                       edge refuses a call whose names disagree with it)
``lethe.kind``         the kind of resource the method acts on (``turn``,
                       ``memory``, ``thread``, ``repair``, ``owner``, …)
=====================  ======================================================

Never a request or response field, never a resource name beyond the owner
and the kind, never a message of an error (a failed call's span is marked
``ERROR`` without a description, and exceptions are not recorded), never the
``authorization`` metadata: ``tests/server/test_tracing.py`` collects the
spans of every method and scans them. A caller's W3C ``traceparent`` (and
``tracestate``) is honoured, so a server span joins the client's trace.

The SDK and the exporter are an optional extra (``lethe-store[tracing]``),
imported only when tracing is on.

Thread rules: the interceptor runs on the event loop; the exporter batches on
its own thread.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from lethe.names import ID_RE, OWNER_HEADER
from server._metrics import call_status

__all__ = ["TRACING_MODES", "TracingInterceptor", "method_kind", "tracer_provider"]

TRACING_MODES = ("off", "otlp")
"""The values of ``lethe serve --tracing``."""

_KINDS = (
    ("Turn", "turn"),
    ("Thread", "thread"),
    ("Memor", "memory"),
    ("Preference", "memory"),
    ("Repair", "repair"),
    ("Context", "thread"),
    ("Lineage", "record"),
    ("Commit", "record"),
    ("ExtendPending", "record"),
    ("Forget", "record"),
    ("Retention", "record"),
    ("Deletion", "deletion"),
    ("Watch", "event"),
    ("ServerInfo", "server"),
    ("Search", "owner"),
    ("Audit", "owner"),
    ("ExportOwner", "owner"),
)


def method_kind(method: str) -> str:
    """The kind of resource a method acts on (``/lethe.v1.Threads/GetTurn`` → ``turn``)."""
    name = method.rsplit("/", 1)[-1]
    for word, kind in _KINDS:
        if word in name:
            return kind
    return "server"


def tracer_provider(mode: str) -> Any:
    """The OpenTelemetry ``TracerProvider`` of ``--tracing``, or None for ``off``.

    Args:
        mode: one of :data:`TRACING_MODES`.

    Raises:
        ValueError: an unknown mode.
        ImportError: ``otlp`` without the ``tracing`` extra installed.
    """
    if mode == "off":
        return None
    if mode != "otlp":
        raise ValueError(f"--tracing is one of {', '.join(TRACING_MODES)}, not {mode!r}")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "lethe"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class TracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """One span per RPC of the asyncio server, unary and streaming (see the module docstring).

    Args:
        provider: an OpenTelemetry ``TracerProvider`` (the server's own, never
            the global one).
    """

    def __init__(self, provider: Any) -> None:
        from opentelemetry.trace import SpanKind, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = provider.get_tracer("lethe")
        self._kind = SpanKind.SERVER
        self._error = StatusCode.ERROR
        self._propagator = TraceContextTextMapPropagator()

    async def intercept_service(  # type: ignore[override]  # grpc may find no handler: None
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap the method's handler in a span."""
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler  # no method of Lethe streams requests
        method: str = handler_call_details.method
        metadata = tuple(handler_call_details.invocation_metadata or ())
        service, _, name = method.lstrip("/").rpartition("/")
        attributes: dict[str, Any] = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": name,
            "lethe.kind": method_kind(method),
        }
        owners = [str(v) for k, v in metadata if k == OWNER_HEADER]
        if len(owners) == 1 and ID_RE.fullmatch(owners[0]):
            attributes["lethe.owner"] = owners[0]
        carrier = {k: str(v) for k, v in metadata if k in ("traceparent", "tracestate")}
        parent = self._propagator.extract(carrier) if carrier else None

        def start() -> Any:
            return self._tracer.start_as_current_span(
                method.lstrip("/"),
                context=parent,
                kind=self._kind,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            )

        def finish(span: Any, context: Any, default: str) -> None:
            code = grpc.StatusCode[call_status(context, default)]
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code != grpc.StatusCode.OK:
                span.set_status(self._error)

        if handler.response_streaming:
            behaviour = handler.unary_stream
            assert behaviour is not None

            async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                with start() as span:
                    try:
                        items = behaviour(request, context)
                        if hasattr(items, "__aiter__"):
                            async for item in items:
                                yield item
                        else:
                            for item in items:
                                yield item
                    except BaseException:
                        finish(span, context, "UNKNOWN")
                        raise
                    finish(span, context, "OK")

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        unary = handler.unary_unary
        assert unary is not None

        async def call(request: Any, context: Any) -> Any:
            with start() as span:
                try:
                    response = unary(request, context)
                    if inspect.isawaitable(response):
                        response = await response
                except BaseException:
                    finish(span, context, "UNKNOWN")
                    raise
                finish(span, context, "OK")
                return response

        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
