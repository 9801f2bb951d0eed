"""Bearer tokens, authenticating a call's metadata, and authorising an owner.

A token is ``lethe_`` followed by 43 url-safe base64 characters (32 random
bytes). The store keeps only its SHA-256 digest with what it may do
(:class:`server.store.TokenRow`: owners or admin, label, expiry, revocation).
A plain digest suffices because tokens carry 256 bits of entropy (no
dictionary to attack), as with GitHub's token scanning design.

Every RPC except ``grpc.health.v1.Health`` and server reflection (which
reveal only serving status and the public schema) needs ``authorization:
Bearer <token>`` metadata. :class:`Authenticator` reads the token's row at
most every :data:`TOKEN_CACHE_SECONDS` (0.5 s), so a new or expired token
takes effect at once and a revoked one within half a second, without a
restart; an unknown, revoked and expired token are refused alike
(``INVALID_TOKEN``), so a refusal tells nothing about which tokens exist. The
call pipeline (:mod:`server.edge._edge`) binds the principal to a context variable
that :func:`authorize` checks against the owner named in a request before
anything is read; :func:`authorize` also applies the routing checks of a
sharded deployment (:mod:`server.edge._routing`).
"""

from __future__ import annotations

import contextvars
import hashlib
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from server.edge._routing import check_route
from server.errors import PermissionDenied, Reason, Unauthenticated
from server.store import TokenRow

TOKEN_PREFIX = "lethe_"  # noqa: S105 (a prefix, not a secret)
UNAUTHENTICATED_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
"""Method prefixes served without a token: serving status and the schema only."""

LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A token label: like an id, it is stored in plaintext, so never content."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a token acts for: ``owners`` (ids), or every owner when ``admin``.

    Attributes:
        id: the token's id (16 hex characters); the key of its own bounds on
            calls and streams.
        digest: the token's 32-byte SHA-256 digest (to re-check it later).
    """

    owners: frozenset[str]
    admin: bool
    id: str = ""
    digest: bytes = b""

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


def principal_record(
    owners: Sequence[str], admin: bool, *, label: str = "", expire_time: float = 0.0
) -> dict[str, Any]:
    """What a new token may do, as :meth:`server.store.Store.put_token` takes it.

    Args:
        owners: owner ids it acts for.
        admin: acts for every owner.
        label: the operator's name for it (:data:`LABEL_RE`).
        expire_time: seconds since the epoch when it stops working; 0 never.
    """
    return {
        "owners": sorted(set(owners)),
        "admin": admin,
        "create_time": time.time(),
        "label": label,
        "expire_time": expire_time,
    }


def authorize(owner: str) -> None:
    """Check that the caller may act for ``owner``, and that the call was routed to its shard.

    The route is checked by :func:`server.edge._routing.check_route`.

    Raises:
        PermissionDenied: reason ``OWNER_NOT_ALLOWED``.
        Unauthenticated: no principal (the call pipeline did not run).
        WrongOwnerHeader: the ``x-lethe-owner`` header is missing (when
            required), malformed, repeated or names another owner.
        OwnerMoved: the owner moved to another shard.
    """
    principal = _principal.get()
    if principal is None:
        raise Unauthenticated("no credentials", reason=Reason.MISSING_TOKEN)
    if not principal.may_act_for(owner):
        raise PermissionDenied(f"token may not act for owners/{owner}")
    check_route(owner)


def current_principal() -> Principal | None:
    return _principal.get()


def bind_principal(principal: Principal) -> contextvars.Token[Principal | None]:
    """Bind ``principal`` to the current context (a task's, or a worker's copy)."""
    return _principal.set(principal)


TOKEN_CACHE_SECONDS = 0.5
"""How long a token's row read from the store answers for it (seconds).

A revocation by ``lethe token`` beside the running server takes effect within
this long (open streams: ``server.edge._edge.TOKEN_RECHECK_SECONDS``); an
expiry is checked on every call against the cached row's ``expire_time``.
"""
TOKEN_CACHE_ENTRIES = 4096
"""Most token rows cached at once (the oldest go first past it)."""


class Authenticator:
    """Turns a call's metadata into a :class:`Principal`; see the module docstring.

    A token's row is read from the store at most once per
    :data:`TOKEN_CACHE_SECONDS` per digest: the read (an LMDB get and a JSON
    decode) was a tenth of an empty call's server time. Unknown tokens are not
    cached, so a new token works at once.

    Args:
        lookup: digest → stored token row, or None.
        clock: seconds since the epoch (tests pass their own).
        ttl: seconds a row read answers for its token (0: read on every call).
    """

    def __init__(
        self,
        lookup: Callable[[bytes], TokenRow | None],
        clock: Callable[[], float] = time.time,
        ttl: float = TOKEN_CACHE_SECONDS,
    ) -> None:
        self._lookup = lookup
        self._clock = clock
        self._ttl = ttl
        self._cache: dict[bytes, tuple[float, TokenRow]] = {}

    def _row(self, digest: bytes) -> TokenRow | None:
        """The token's row, from the cache while it is fresh, else from the store."""
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        row = self._lookup(digest)
        if row is None:
            self._cache.pop(digest, None)
            return None
        if len(self._cache) >= TOKEN_CACHE_ENTRIES:
            self._cache.pop(next(iter(self._cache)))  # the oldest inserted
        self._cache[digest] = (now, row)
        return row

    def authenticate(self, metadata: Sequence[tuple[str, Any]]) -> Principal:
        """The principal of the one ``authorization: Bearer lethe_…`` header.

        Raises:
            Unauthenticated: ``MISSING_TOKEN`` without the header;
                ``INVALID_TOKEN`` for two headers, another scheme, a malformed,
                unknown, revoked or expired token.
        """
        values = [v for k, v in metadata if k == "authorization"]
        if not values:
            raise Unauthenticated("missing bearer token", reason=Reason.MISSING_TOKEN)
        if len(values) > 1:  # never guess which of two credentials was meant
            raise Unauthenticated("more than one authorization header", reason=Reason.INVALID_TOKEN)
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        scheme, _, token = value.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token.startswith(TOKEN_PREFIX):
            raise Unauthenticated("malformed bearer token", reason=Reason.INVALID_TOKEN)
        digest = token_digest(token)
        row = self._row(digest)
        if row is None or not row.active(self._clock()):
            raise Unauthenticated(
                "unknown, revoked or expired bearer token", reason=Reason.INVALID_TOKEN
            )
        return Principal(frozenset(row.owners), row.admin, row.id, digest)

    def still_valid(self, principal: Principal) -> bool:
        """Whether ``principal``'s token is still active (for open streams)."""
        row = self._row(principal.digest)
        return row is not None and row.active(self._clock())
