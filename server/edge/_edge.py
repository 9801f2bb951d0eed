"""The call pipeline every ``lethe.v1`` RPC goes through on the asyncio server.

For each method of a service, :meth:`Edge.service` builds a handler that
takes the request as raw bytes and, in this order:

1. refuses at once while the server drains (``UNAVAILABLE`` / ``DRAINING``);
2. authenticates the ``authorization`` metadata (:mod:`server.edge._auth`) —
   before the request is even decoded, so nothing of an unauthenticated
   request is parsed — and binds the call's route (its ``x-lethe-owner``
   header, :mod:`server.edge._routing`), which ``authorize`` checks;
3. admits the call or stream against the bounds (:mod:`server.edge._admission`),
   refusing past them with ``RESOURCE_EXHAUSTED``;
4. decodes the request on a worker thread; bytes that do not decode answer
   ``INVALID_ARGUMENT`` / ``MALFORMED_REQUEST`` (grpc-python's own decoding
   would answer ``INTERNAL`` and log a traceback per request);
5. runs the servicer's method: a unary method is synchronous and runs on the
   :class:`~server.edge._admission.FairExecutor` under the caller's principal (it
   sees a :class:`SyncContext`); a streaming method is an async generator on
   the event loop that gets a :class:`StreamContext` to run blocking work on
   the executor and to learn when it must end;
6. turns every error into its ``google.rpc.Status`` (domain errors keep their
   code and details; anything else is ``INTERNAL`` with no internals).

Every call (these and health and reflection) is counted and timed by
:class:`server._metrics.RpcMetricsInterceptor`, around this pipeline.

Lines about refused or malformed calls and internal errors go to the
rate-limited log (:mod:`server._logs`). Open streams are re-checked once per
:data:`TOKEN_RECHECK_SECONDS`: a stream whose token was revoked or expired
ends with ``UNAUTHENTICATED`` / ``INVALID_TOKEN``.

Thread rules: handlers, :meth:`Edge.drain`, :meth:`Edge.wait_idle` and
:meth:`Edge.watch_tokens` run on the event loop; servicer methods of unary
calls on worker threads.
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
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import descriptor, message, message_factory
from grpc_status import rpc_status

from server._logs import LIMITED
from server._metrics import Metrics
from server.edge._admission import Admission, FairExecutor
from server.edge._auth import Authenticator, Principal, bind_principal
from server.edge._routing import Router, bind_route
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
    anything else for ``INTERNAL``); :meth:`Edge._status` turns it into the
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


class Edge:
    """Builds the handlers of the ``lethe.v1`` services; see the module docstring.

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

    def service(
        self, service: descriptor.ServiceDescriptor, servicer: Any
    ) -> grpc.GenericRpcHandler[Any, Any]:
        """The generic handler of every method of ``service`` on ``servicer``.

        Unary methods of ``servicer`` are synchronous; server-streaming ones
        are async generator functions.

        Raises:
            TypeError: a method is missing, of the wrong kind, or client-streaming.
        """
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        for method in service.methods:
            behaviour = getattr(servicer, method.name, None)
            if behaviour is None:
                raise TypeError(f"{type(servicer).__name__} has no {method.name}")
            request_type = message_factory.GetMessageClass(method.input_type)
            full = f"/{service.full_name}/{method.name}"
            if method.client_streaming:
                raise TypeError(f"{full}: client streaming is not served")
            if method.server_streaming:
                if not inspect.isasyncgenfunction(behaviour):
                    raise TypeError(f"{full} must be an async generator function")
                handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                    self._stream_handler(full, behaviour, request_type)
                )
            else:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    self._unary_handler(full, behaviour, request_type)
                )
        return grpc.method_handlers_generic_handler(service.full_name, handlers)

    def _unary_handler(
        self, method: str, behaviour: UnaryBehaviour, request_type: type[message.Message]
    ) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Any]:
        async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            try:
                principal = self._admit(method, context)
                key = principal.id
                self.admission.enter_call(key)
                try:
                    future = self._submit(key, principal, behaviour, request_type, raw)
                except BaseException:
                    self.admission.exit_call(key)
                    raise
                return await asyncio.wrap_future(future)
            except Exception as exc:
                status = self._status(method, exc)
                await context.abort(status.code, status.details, status.trailing_metadata)
                raise AssertionError("unreachable") from None  # abort raises

        return handle

    def _submit(
        self,
        key: str,
        principal: Principal,
        behaviour: UnaryBehaviour,
        request_type: type[message.Message],
        raw: bytes,
    ) -> Any:
        """Queue the call's work.

        The admission slot is freed when the work has finished or was skipped,
        not when the caller stops waiting.
        """
        bind_principal(principal)
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        future = self.executor.submit(
            key, functools.partial(ctx.run, _run_unary, behaviour, request_type, raw)
        )

        def release(_: Any) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone
                loop.call_soon_threadsafe(self.admission.exit_call, key)

        future.add_done_callback(release)
        return future

    def _stream_handler(
        self, method: str, behaviour: StreamBehaviour, request_type: type[message.Message]
    ) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[bytes]]:
        async def handle(
            raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[bytes]:
            entered: str | None = None
            stream: StreamContext | None = None
            try:
                principal = self._admit(method, context)
                self.admission.enter_stream(principal.id)
                entered = principal.id
                bind_principal(principal)
                stream = StreamContext(self, principal)
                self._streams.add(stream)
                request = await stream.run(functools.partial(_decode, request_type, raw))
                async for item in behaviour(request, stream):
                    yield item.SerializeToString()
            except Exception as exc:
                status = self._status(method, exc)
                await context.abort(status.code, status.details, status.trailing_metadata)
            finally:
                if stream is not None:
                    self._streams.discard(stream)
                if entered is not None:
                    self.admission.exit_stream(entered)

        return handle

    # ------------------------------------------------------------------ stages

    def _admit(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> Principal:
        if self._draining:
            self.admission.refused(Reason.DRAINING)
            raise Draining("the server is stopping; retry shortly")
        metadata = tuple(context.invocation_metadata() or ())
        try:
            principal = self.authenticator.authenticate(metadata)
        except Unauthenticated as exc:
            LIMITED.log(
                logging.WARNING,
                "unauthenticated",
                "refused %s from %s: %s",
                method,
                context.peer(),
                exc.reason_name,
            )
            raise
        if self.router is not None:
            bind_route(self.router.route(metadata, method))
        return principal

    def _status(self, method: str, exc: BaseException) -> grpc.Status:
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
        return rpc_status.to_status(to_rpc_status(exc))

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


def _decode(request_type: type[message.Message], raw: bytes) -> message.Message:
    """Parse the request.

    Raises:
        MalformedRequest: the bytes are not a ``request_type`` message.
    """
    try:
        return request_type.FromString(raw)
    except Exception:  # DecodeError, or a nesting too deep for the parser
        raise MalformedRequest(
            f"the request is not a valid {request_type.DESCRIPTOR.full_name} message"
        ) from None


def _run_unary(behaviour: UnaryBehaviour, request_type: type[message.Message], raw: bytes) -> bytes:
    """A unary call's work on a worker thread: decode, handle, encode."""
    request = _decode(request_type, raw)
    response = behaviour(request, SyncContext())
    return bytes(response.SerializeToString())
