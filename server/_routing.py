"""Routing checks of a sharded deployment: the owner header and moved-away owners.

Several ``lethe serve`` instances, each with its own data directory, sit
behind a proxy (the nginx config of ``lethe shard nginx-config``) that routes
every call on its :data:`lethe.names.OWNER_HEADER` metadata (``x-lethe-owner:
{owner}``). Two checks keep a misrouted call from touching the wrong shard;
both run in :func:`server._auth.authorize`, where the owner a request names is
read, so every method gets them from the one place it already calls:

1. **The header agrees with the request.** When the call carries the header
   it must be one valid owner id equal to the owner of the request's resource
   names; otherwise ``INVALID_ARGUMENT`` / ``OWNER_HEADER_MISMATCH`` and
   nothing is read or written. A call without the header is accepted (a
   single server needs no proxy) unless the server runs with
   ``--require-owner-header`` (behind a proxy: ``OWNER_HEADER_MISSING``).
2. **The owner is still here.** An owner with a moved-away marker
   (:class:`server.store.MovedRow`, written by ``lethe shard mark-moved``
   and, later, by the move at cut-over) answers ``FAILED_PRECONDITION`` /
   ``OWNER_MOVED`` with the destination in the ``ErrorInfo`` metadata
   (``shard``, ``target``), header or not. An owner in the middle of a move
   (``lethe owner export`` … ``release``) answers ``UNAVAILABLE`` /
   ``OWNER_MOVING`` on the destination until the move is activated there;
   the source serves its reads until the cut-over and refuses its writes
   inside the write transaction (the writer's guard), so the copy is final.

The markers are written by another process (the ``lethe owner`` commands,
beside the running server), so when a call sees an owner's marker change, the
server first drops what it holds of the owner in memory (its indexes and its
cached keys, ``on_change``): the copy it built before the change is stale.

An owner this shard never saw is a new owner: the proxy's placement decides
where an owner lives, and the first write creates it there, as on one server.

Thread rules: :meth:`Router.route` and :func:`bind_route` run on the event
loop (the call pipeline, :mod:`server._edge`); :func:`check_route` on the
worker running the call, in the context copied from the loop.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lethe.names import ID_RE, OWNER_HEADER
from server.errors import Reason, WrongOwnerHeader
from server.store import MovedRow


class Router:
    """The routing policy of one server.

    Args:
        moved: owner id → its moved-away marker, or None (read on every call).
        require_header: refuse calls without the owner header.
        on_change: called with an owner id, before the call goes on, the first
            time a call sees that owner's marker differ from the last one seen
            (drops the server's in-memory state of the owner).
    """

    def __init__(
        self,
        moved: Callable[[str], MovedRow | None],
        *,
        require_header: bool = False,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self._moved = moved
        self.require_header = require_header
        self._on_change = on_change
        self._seen: dict[str, tuple[str, str]] = {}

    def route(self, metadata: Sequence[tuple[str, Any]]) -> Route:
        """The routing facts of a call's metadata (the owner header's values)."""
        values = tuple(
            v if isinstance(v, str) else bytes(v).decode(errors="replace")
            for k, v in metadata
            if k == OWNER_HEADER
        )
        return Route(values, self)

    def check(self, route: Route, owner: str) -> None:
        """Check a call for ``owner`` (see the module docstring).

        Raises:
            WrongOwnerHeader: ``OWNER_HEADER_MISSING`` (required and absent) or
                ``OWNER_HEADER_MISMATCH`` (repeated, malformed, or another owner).
            OwnerMoved: ``owner`` has a moved-away marker here.
            OwnerMoving: ``owner`` is arriving here and not activated yet.
        """
        if not route.header:
            if self.require_header:
                raise WrongOwnerHeader(
                    f"this server is sharded: the call needs {OWNER_HEADER} metadata",
                    reason=Reason.OWNER_HEADER_MISSING,
                )
        elif len(route.header) > 1:
            raise WrongOwnerHeader(f"{OWNER_HEADER} sent more than once")
        elif not ID_RE.fullmatch(route.header[0]):
            raise WrongOwnerHeader(f"{OWNER_HEADER} is not an owner id")
        elif route.header[0] != owner:
            # Name neither owner in the message: the caller sent both, and a
            # proxy's logs should not learn from an error what it did not route.
            raise WrongOwnerHeader(
                f"{OWNER_HEADER} names another owner than the request's resource names"
            )
        row = self._moved(owner)
        if row is None:
            return
        seen = (row.state, row.move_id)
        if self._seen.get(owner) != seen:
            if self._on_change is not None:
                self._on_change(owner)
            self._seen[owner] = seen
        refusal = row.refusal(write=False)
        if refusal is not None:
            raise refusal


@dataclass(frozen=True, slots=True)
class Route:
    """What a call says about its routing: the values of its owner header."""

    header: tuple[str, ...]
    router: Router


_route: contextvars.ContextVar[Route | None] = contextvars.ContextVar("lethe_route", default=None)


def bind_route(route: Route) -> None:
    """Bind a call's route to the current context (the call pipeline does, beside
    the principal)."""
    _route.set(route)


def check_route(owner: str) -> None:
    """Apply the bound route's checks for ``owner``; no-op outside the call
    pipeline (a servicer called directly, in tests).

    Raises:
        WrongOwnerHeader, OwnerMoved: as :meth:`Router.check`.
    """
    route = _route.get()
    if route is not None:
        route.router.check(route, owner)
