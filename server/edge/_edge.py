"""The call pipeline every ``lethe.v1`` RPC goes through, whichever transport carries it.

Two transports serve the same methods of the same servicers: gRPC (grpc's
asyncio server, the handlers :meth:`Edge.grpc_handler` builds) and the Connect
protocol over HTTP (:mod:`server.edge._connect`, on its own listener). Each
is a thin adapter over the transport-independent stages of :class:`Edge`;
for every call, in this order:

1. :meth:`Edge.identify` refuses at once while the server drains
   (``UNAVAILABLE`` / ``DRAINING``), authenticates the ``authorization``
   metadata (:mod:`server.edge._auth`) — before the request is even decoded
   (over HTTP before its body is read), so nothing of an unauthenticated
   request is parsed — and reads the call's route (its ``x-lethe-owner``
   header, :mod:`server.edge._routing`), which ``authorize`` checks;
2. :meth:`Edge.unary` and :meth:`Edge.stream` admit the call or stream
   against the bounds (:mod:`server.edge._admission`), refusing past them
   with ``RESOURCE_EXHAUSTED``;
3. they decode the request on a worker thread with the transport's
   :class:`Codec` (protobuf bytes; over Connect also JSON); bytes that do
   not decode answer ``INVALID_ARGUMENT`` / ``MALFORMED_REQUEST``
   (grpc-python's own decoding would answer ``INTERNAL`` and log a traceback
   per request);
4. they run the servicer's method: a unary method is synchronous and runs on
   the :class:`~server.edge._admission.FairExecutor` under the caller's
   principal (it sees a :class:`SyncContext`), and its response is encoded
   there too; a streaming method is an async generator on the event loop that
   gets a :class:`StreamContext` to run blocking work on the executor and to
   learn when it must end;
5. :meth:`Edge.status`, the one error boundary, turns every error into its
   ``google.rpc.Status`` (domain errors keep their code and details; anything
   else is ``INTERNAL`` with no internals), which each transport writes in its
   own form (gRPC trailers; Connect's error JSON).

Every call is counted and timed in the RPC metrics (:mod:`server._metrics`):
over gRPC by :class:`server._metrics.MeasuredServer`, which wraps each
method's handler when it is registered (health and reflection too), over
Connect by its adapter.

Lines about refused or malformed calls and internal errors go to the
rate-limited log (:mod:`server._logs`). Open streams are re-checked once per
:data:`TOKEN_RECHECK_SECONDS`: a stream whose token was revoked or expired
ends with ``UNAUTHENTICATED`` / ``INVALID_TOKEN``.

Thread rules: every stage, :meth:`Edge.drain`, :meth:`Edge.wait_idle` and
:meth:`Edge.watch_tokens` run on the event loop, each call in a task of its
own (both transports' servers run each call in its own task, so what a call
binds to its context stays its own); servicer methods of unary calls run on
worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import time
import traceback
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import descriptor, message, message_factory
from google.rpc import status_pb2
from grpc_status import rpc_status

from server._logs import LIMITED
from server._metrics import Metrics
from server.edge._admission import Admission, FairExecutor
from server.edge._auth import Authenticator, Principal, bind_principal
from server.edge._routing import Route, Router, bind_route
from server.errors import (
    Draining,
    LetheError,
    MalformedRequest,
    Reason,
    Unauthenticated,
    to_rpc_status,
)

T = TypeVar("T")

TOKEN_RECHECK_SECONDS = 0.5
"""How often the tokens of open streams are read again (revocation and expiry
end a stream within this many seconds)."""


class SyncContext:
    """What a synchronous handler sees of its call: nothing to act on.

    A handler ends a call by raising (a :class:`server.errors.LetheError`, or
    anything else for ``INTERNAL``); :meth:`Edge.status` turns it into the
    call's status.
    """

    def is_active(self) -> bool:
        """Always True: a unary call's work runs to its end."""
        return True


class StreamContext:
    """What a streaming handler gets: work under its principal, a wake-up flag, why it must end.

    In full: blocking work under its principal, a wake-up flag for the
    notifier, and the reason it must end, if any.

    Attributes:
        principal: who opened the stream.
        wake: set when the stream should look again (news, or it must end).
    """

    def __init__(self, edge: Edge, principal: Principal) -> None:
        self._edge = edge
        self.principal = principal
        self.wake = asyncio.Event()
        self._ended: LetheError | None = None
        self._ended_event = asyncio.Event()

    async def run(self, fn: Callable[[], T]) -> T:
        """Run blocking ``fn`` on a worker under this stream's principal.

        Raises:
            LetheError: the stream was asked to end while ``fn`` waited for a
                worker or ran (``fn`` is skipped if it had not started).
        """
        self.check()
        ctx = contextvars.copy_context()
        future: asyncio.Future[Any] = asyncio.wrap_future(
            self._edge.executor.submit(self.principal.id, functools.partial(ctx.run, fn))
        )
        ender: asyncio.Future[Any] = asyncio.ensure_future(self._ended_event.wait())
        try:
            done, _ = await asyncio.wait({future, ender}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ender.cancel()
        if future in done:
            result: T = future.result()
            return result
        future.cancel()
        self.check()
        raise AssertionError("unreachable")  # check() raised

    def end(self, error: LetheError) -> None:
        """Ask the stream to end with ``error`` (drain, revoked token)."""
        if self._ended is None:
            self._ended = error
        self.wake.set()
        self._ended_event.set()

    def check(self) -> None:
        """Raise the error the stream was asked to end with, if any.

        Raises:
            LetheError: ``DRAINING`` or ``INVALID_TOKEN``.
        """
        if self._ended is not None:
            raise self._ended


UnaryBehaviour = Callable[[Any, SyncContext], Any]
StreamBehaviour = Callable[[Any, StreamContext], AsyncIterator[Any]]


@dataclass(frozen=True, slots=True)
class Codec:
    """How a transport's message bytes become messages, and messages bytes.

    Attributes:
        name: the codec's name on the wire (``proto``, ``json``).
        decode: ``(request type, bytes)`` → the request; raises anything on
            bytes that are not one (the pipeline answers ``MALFORMED_REQUEST``).
        encode: a response → its bytes.
    """

    name: str
    decode: Callable[[type[message.Message], bytes], message.Message]
    encode: Callable[[message.Message], bytes]


def _proto_decode(request_type: type[message.Message], raw: bytes) -> message.Message:
    return request_type.FromString(raw)


def _proto_encode(response: message.Message) -> bytes:
    return bytes(response.SerializeToString())


PROTO = Codec("proto", _proto_decode, _proto_encode)
"""Protobuf's binary encoding: gRPC's, and Connect's ``application/proto``."""


@dataclass(frozen=True, slots=True)
class Method:
    """One method of a ``lethe.v1`` service as every transport serves it.

    Attributes:
        path: ``/lethe.v1.Threads/CreateThread``, as gRPC (and Connect, which
            posts to that path) names it.
        request_type: the request message class.
        behaviour: the servicer's bound method (synchronous for a unary
            method, an async generator function for a streaming one).
        streaming: whether the method streams its responses.
    """

    path: str
    request_type: type[message.Message]
    behaviour: Any
    streaming: bool


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a call and how it was routed: what :meth:`Edge.identify` found.

    Attributes:
        principal: the authenticated token's principal.
        route: the call's routing facts, or None on a server without a router.
    """

    principal: Principal
    route: Route | None

    def bind(self) -> None:
        """Bind the principal and the route to the current context."""
        bind_principal(self.principal)
        if self.route is not None:
            bind_route(self.route)


class Edge:
    """The transport-independent stages of every call; see the module docstring.

    Args:
        authenticator: checks the bearer token of every call.
        admission: the bounds on calls and streams.
        executor: the worker pool for blocking work.
        metrics: the admission metrics.
        router: the routing checks (owner header, moved-away owners); None
            accepts every call as routed right.
    """

    def __init__(
        self,
        authenticator: Authenticator,
        admission: Admission,
        executor: FairExecutor,
        metrics: Metrics,
        router: Router | None = None,
    ) -> None:
        self.authenticator = authenticator
        self.router = router
        self.admission = admission
        self.executor = executor
        self._metrics = metrics
        self._draining = False
        self._streams: set[StreamContext] = set()

    # ------------------------------------------------------------------ building

    @staticmethod
    def methods(service: descriptor.ServiceDescriptor, servicer: Any) -> list[Method]:
        """Every method of ``service`` on ``servicer``, as the transports serve them.

        Unary methods of ``servicer`` are synchronous; server-streaming ones
        are async generator functions.

        Raises:
            TypeError: a method is missing, of the wrong kind, or client-streaming.
        """
        methods = []
        for method in service.methods:
            behaviour = getattr(servicer, method.name, None)
            if behaviour is None:
                raise TypeError(f"{type(servicer).__name__} has no {method.name}")
            full = f"/{service.full_name}/{method.name}"
            if method.client_streaming:
                raise TypeError(f"{full}: client streaming is not served")
            if method.server_streaming and not inspect.isasyncgenfunction(behaviour):
                raise TypeError(f"{full} must be an async generator function")
            request_type = message_factory.GetMessageClass(method.input_type)
            methods.append(Method(full, request_type, behaviour, method.server_streaming))
        return methods

    def grpc_handler(self, service: str, methods: list[Method]) -> grpc.GenericRpcHandler[Any, Any]:
        """The gRPC generic handler of ``methods`` of ``service`` (``lethe.v1.Threads``)."""
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        for method in methods:
            name = method.path.rpartition("/")[2]
            if method.streaming:
                handlers[name] = grpc.unary_stream_rpc_method_handler(self._grpc_stream(method))
            else:
                handlers[name] = grpc.unary_unary_rpc_method_handler(self._grpc_unary(method))
        return grpc.method_handlers_generic_handler(service, handlers)

    # ------------------------------------------------------------------ gRPC

    def _grpc_unary(
        self, method: Method
    ) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Any]:
        async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            try:
                caller = self.identify(
                    method.path, tuple(context.invocation_metadata() or ()), context.peer()
                )
                return await self.unary(method, caller, PROTO, raw)
            except Exception as exc:
                status = rpc_status.to_status(self.status(method.path, exc))
                await context.abort(status.code, status.details, status.trailing_metadata)
                raise AssertionError("unreachable") from None  # abort raises

        return handle

    def _grpc_stream(
        self, method: Method
    ) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[bytes]]:
        async def handle(
            raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[bytes]:
            try:
                caller = self.identify(
                    method.path, tuple(context.invocation_metadata() or ()), context.peer()
                )
                async with contextlib.aclosing(self.stream(method, caller, PROTO, raw)) as items:
                    async for item in items:
                        yield item
            except Exception as exc:
                status = rpc_status.to_status(self.status(method.path, exc))
                await context.abort(status.code, status.details, status.trailing_metadata)

        return handle

    # ------------------------------------------------------------------ stages

    def identify(self, method: str, metadata: Sequence[tuple[str, Any]], peer: str) -> Caller:
        """Stage 1: who calls ``method`` and how it was routed, before anything is decoded.

        Args:
            method: the method's path (``/lethe.v1.Threads/CreateThread``).
            metadata: the call's metadata (HTTP headers), names in lower case.
            peer: the client's address, for the log.

        Raises:
            Draining: the server is draining.
            Unauthenticated: no, several, or a bad bearer token.
        """
        if self._draining:
            self.admission.refused(Reason.DRAINING)
            raise Draining("the server is stopping; retry shortly")
        try:
            principal = self.authenticator.authenticate(metadata)
        except Unauthenticated as exc:
            LIMITED.log(
                logging.WARNING,
                "unauthenticated",
                "refused %s from %s: %s",
                method,
                peer,
                exc.reason_name,
            )
            raise
        route = self.router.route(metadata, method) if self.router is not None else None
        return Caller(principal, route)

    async def unary(self, method: Method, caller: Caller, codec: Codec, raw: bytes) -> bytes:
        """Stages 2 to 4 of a unary call: bounds, then decode, run and encode on a worker.

        The admission slot is freed when the work has finished or was skipped
        (the caller stopped waiting before a worker took it), not when the
        caller stops waiting. The loop is woken once per call, when the work
        is done: it frees the slot and hands the result over in one callback
        (``asyncio.wrap_future`` plus a callback of its own woke it twice).

        Returns:
            The encoded response.

        Raises:
            Overloaded: a bound is reached.
            MalformedRequest: ``raw`` is not a request of the method.
            Exception: whatever the servicer raised.
        """
        key = caller.principal.id
        self.admission.enter_call(key)
        try:
            ctx = contextvars.copy_context()
            ctx.run(caller.bind)
            future = self.executor.submit(
                key,
                functools.partial(
                    ctx.run, _run_unary, codec, method.behaviour, method.request_type, raw
                ),
            )
        except BaseException:
            self.admission.exit_call(key)
            raise
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bytes] = loop.create_future()

        def finish(done: Future[bytes]) -> None:  # on the loop
            self.admission.exit_call(key)
            if waiter.cancelled():
                return
            if done.cancelled():
                waiter.cancel()
            elif (exc := done.exception()) is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(done.result())

        def wake(done: Future[bytes]) -> None:  # on the worker (or where it was cancelled)
            with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone
                loop.call_soon_threadsafe(finish, done)

        future.add_done_callback(wake)
        try:
            return await waiter
        except asyncio.CancelledError:
            future.cancel()  # skipped if no worker has taken it yet
            raise

    async def stream(
        self, method: Method, caller: Caller, codec: Codec, raw: bytes
    ) -> AsyncGenerator[bytes, None]:
        """Stages 2 to 4 of a streaming call: bounds, decode on a worker, the stream's messages.

        Close it (``contextlib.aclosing``) when the call ends early: its slot
        is freed when it is closed.

        Yields:
            Each response, encoded.

        Raises:
            Overloaded: a bound is reached.
            MalformedRequest: ``raw`` is not a request of the method.
            LetheError: the stream was ended (drain, revoked token), or the
                servicer refused.
        """
        key = caller.principal.id
        self.admission.enter_stream(key)
        stream: StreamContext | None = None
        try:
            caller.bind()
            stream = StreamContext(self, caller.principal)
            self._streams.add(stream)
            request = await stream.run(functools.partial(_decode, codec, method.request_type, raw))
            async for item in method.behaviour(request, stream):
                yield codec.encode(item)
        finally:
            if stream is not None:
                self._streams.discard(stream)
            self.admission.exit_stream(key)

    def status(self, method: str, exc: BaseException) -> status_pb2.Status:
        """The one error boundary: ``exc`` as the call's ``google.rpc.Status``.

        A :class:`~server.errors.LetheError` keeps its code and details
        (refusals and malformed requests are logged, rate-limited); anything
        else is logged (type and traceback frames, never the message, which
        could quote content; at most a few lines a minute,
        :mod:`server._logs`) and answered ``INTERNAL`` with no internals.
        """
        if isinstance(exc, LetheError):
            if isinstance(exc, MalformedRequest):
                LIMITED.log(logging.WARNING, "malformed", "undecodable request to %s", method)
            elif exc.reason in (Reason.TOO_MANY_REQUESTS, Reason.TOO_MANY_STREAMS):
                LIMITED.log(logging.WARNING, "refused", "%s refused: %s", method, exc.reason_name)
        else:
            LIMITED.log(
                logging.ERROR,
                "internal",
                "internal error in %s: %s\n%s",
                method,
                type(exc).__name__,
                "".join(traceback.format_tb(exc.__traceback__)),
            )
        return to_rpc_status(exc)

    # ------------------------------------------------------------------ lifecycle

    def drain(self) -> None:
        """Refuse new calls (``DRAINING``) and end every open stream with it."""
        self._draining = True
        for stream in list(self._streams):
            stream.end(Draining("the server is stopping; resume with after"))

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every admitted call and stream to finish.

        Returns whether they did.
        """
        deadline = time.monotonic() + timeout
        while self.admission.inflight or self.admission.streams:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def watch_tokens(self) -> None:
        """Forever: end open streams whose token was revoked or has expired.

        Tokens are checked every :data:`TOKEN_RECHECK_SECONDS`.
        """
        while True:
            await asyncio.sleep(TOKEN_RECHECK_SECONDS)
            valid: dict[bytes, bool] = {}
            for stream in list(self._streams):
                digest = stream.principal.digest
                if digest not in valid:
                    valid[digest] = self.authenticator.still_valid(stream.principal)
                if not valid[digest]:
                    stream.end(
                        Unauthenticated(
                            "the bearer token was revoked or has expired",
                            reason=Reason.INVALID_TOKEN,
                        )
                    )


def _decode(codec: Codec, request_type: type[message.Message], raw: bytes) -> message.Message:
    """Parse the request.

    Raises:
        MalformedRequest: the bytes are not a ``request_type`` message.
    """
    try:
        return codec.decode(request_type, raw)
    except MalformedRequest:  # the codec's own words (JSON's parser says where)
        raise
    except Exception:  # DecodeError, or a nesting too deep for the parser
        raise MalformedRequest(
            f"the request is not a valid {request_type.DESCRIPTOR.full_name} message"
        ) from None


def _run_unary(
    codec: Codec, behaviour: UnaryBehaviour, request_type: type[message.Message], raw: bytes
) -> bytes:
    """A unary call's work on a worker thread: decode, handle, encode."""
    request = _decode(codec, request_type, raw)
    response = behaviour(request, SyncContext())
    return codec.encode(response)
