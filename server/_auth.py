"""Bearer tokens and the interceptor that checks them.

A token is ``lethe_`` followed by 43 url-safe base64 characters (32 random
bytes). The store keeps only its SHA-256 digest with the principal it belongs
to: ``{"owners": [...], "admin": bool, "create_time": seconds}``. A plain
digest suffices because tokens carry 256 bits of entropy (no dictionary to
attack), as with GitHub's token scanning design.

Every RPC except ``grpc.health.v1.Health`` needs ``authorization: Bearer
<token>`` metadata. The interceptor authenticates and stores the principal in
a context variable; :func:`authorize` checks the owner named in a request
before anything is read.
"""

from __future__ import annotations

import contextvars
import hashlib
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from server.errors import LetheError, PermissionDenied, Reason, Unauthenticated

TOKEN_PREFIX = "lethe_"  # noqa: S105 (a prefix, not a secret)
UNAUTHENTICATED_SERVICES = ("/grpc.health.v1.Health/",)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a token acts for: ``owners`` (ids), or every owner when ``admin``."""

    owners: frozenset[str]
    admin: bool

    def may_act_for(self, owner: str) -> bool:
        return self.admin or owner in self.owners


_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "lethe_principal", default=None
)


def new_token() -> str:
    """A fresh bearer token (shown once; only its digest is stored)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> bytes:
    """32-byte SHA-256 digest under which a token is stored."""
    return hashlib.sha256(token.encode()).digest()


def principal_record(owners: Sequence[str], admin: bool) -> dict[str, Any]:
    return {"owners": sorted(set(owners)), "admin": admin, "create_time": time.time()}


def authorize(owner: str) -> None:
    """Check that the caller may act for ``owner``.

    Raises:
        PermissionDenied: reason ``OWNER_NOT_ALLOWED``.
        Unauthenticated: no principal (the interceptor did not run).
    """
    principal = _principal.get()
    if principal is None:
        raise Unauthenticated("no credentials", reason=Reason.MISSING_TOKEN)
    if not principal.may_act_for(owner):
        raise PermissionDenied(f"token may not act for owners/{owner}")


def current_principal() -> Principal | None:
    return _principal.get()


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Authenticates every call except health; see the module docstring.

    Args:
        lookup: digest → principal record (or None); called per request so new
            tokens work without a restart.
        abort: turns a LetheError into an aborted call on a context.
    """

    def __init__(
        self,
        lookup: Callable[[bytes], dict[str, Any] | None],
        abort: Callable[[grpc.ServicerContext, LetheError], None],
    ) -> None:
        self._lookup = lookup
        self._abort = abort

    def _authenticate(self, metadata: Sequence[tuple[str, Any]]) -> Principal:
        values = [v for k, v in metadata if k == "authorization"]
        if not values:
            raise Unauthenticated("missing bearer token", reason=Reason.MISSING_TOKEN)
        if len(values) > 1:  # never guess which of two credentials was meant
            raise Unauthenticated("more than one authorization header", reason=Reason.INVALID_TOKEN)
        value = values[0] if isinstance(values[0], str) else values[0].decode()
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.startswith(TOKEN_PREFIX):
            raise Unauthenticated("malformed bearer token", reason=Reason.INVALID_TOKEN)
        record = self._lookup(token_digest(token.strip()))
        if record is None:
            raise Unauthenticated("unknown bearer token", reason=Reason.INVALID_TOKEN)
        return Principal(frozenset(record.get("owners", [])), bool(record.get("admin")))

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(UNAUTHENTICATED_SERVICES):
            return handler
        metadata = tuple(handler_call_details.invocation_metadata or ())
        return _wrap(handler, lambda: self._authenticate(metadata), self._abort)


def _wrap(
    handler: grpc.RpcMethodHandler[Any, Any],
    authenticate: Callable[[], Principal],
    abort: Callable[[grpc.ServicerContext, LetheError], None],
) -> grpc.RpcMethodHandler[Any, Any]:
    def guard(behaviour: Callable[..., Any]) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                principal = authenticate()
            except LetheError as exc:
                abort(context, exc)
                return None
            token = _principal.set(principal)
            try:
                return behaviour(request, context)
            finally:
                _principal.reset(token)

        return call

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            guard(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def guard_stream(behaviour: Callable[..., Any]) -> Callable[..., Any]:
        # A streaming behaviour is a generator: the principal must be set while
        # it runs, not only while it is created.
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                principal = authenticate()
            except LetheError as exc:
                abort(context, exc)
                return
            token = _principal.set(principal)
            try:
                yield from behaviour(request, context)
            finally:
                _principal.reset(token)

        return call

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            guard_stream(handler.unary_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            guard(handler.stream_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.stream_stream_rpc_method_handler(
        guard(handler.stream_stream),  # type: ignore[arg-type]
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
