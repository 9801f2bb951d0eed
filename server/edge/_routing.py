"""Routing checks of a sharded deployment: the owner header and moved-away owners.

Several ``lethe serve`` instances, each with its own data directory, sit
behind a proxy (the nginx config of ``lethe shard nginx-config``) that routes
every call on its :data:`lethe.names.OWNER_HEADER` metadata (``x-lethe-owner:
{owner}``). Two checks keep a misrouted call from touching the wrong shard;
both run in :func:`server.edge._auth.authorize`, where the owner a request names is
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

3. **The owner is held here** (sharded servers only, ``--require-owner-header``):
   a call for an owner this shard has no row of answers ``NOT_FOUND`` — never
   an empty success that would hide the owner's data on another shard —
   unless it is one of the calls that create an owner (``CreateThread``,
   ``CreateMemory``: the proxy's placement decides where an owner lives, and
   its first write creates it there). A single server without the flag keeps
   answering an unknown owner as an owner with nothing yet.

Thread rules: :meth:`Router.route` and :func:`bind_route` run on the event
loop (the call pipeline, :mod:`server.edge._edge`); :func:`check_route` on the
worker running the call, in the context copied from the loop.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lethe.names import ID_RE, OWNER_HEADER
from server.errors import NotFound, Reason, WrongOwnerHeader
from server.store import MovedRow

OWNER_CREATING = frozenset({"/lethe.v1.Threads/CreateThread", "/lethe.v1.Memories/CreateMemory"})
"""The methods whose first call for an owner creates it on the shard."""


class Router:
    """The routing policy of one server.

    Args:
        placement: owner id → ``(its marker or None, whether this store has a
            row of it)``, read in one transaction on every call.
        require_header: refuse calls without the owner header.
        on_change: called with an owner id, before the call goes on, the first
            time a call sees that owner's marker differ from the last one seen
            (drops the server's in-memory state of the owner).

    With ``require_header``, calls other than :data:`OWNER_CREATING` for an owner
    this store holds no row of answer ``NOT_FOUND``.
    """

    def __init__(
        self,
        placement: Callable[[str], tuple[MovedRow | None, bool]],
        *,
        require_header: bool = False,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self._placement = placement
        self.require_header = require_header
        self._on_change = on_change
        self._seen: dict[str, tuple[str, str]] = {}

    def route(self, metadata: Sequence[tuple[str, Any]], method: str = "") -> Route:
        """The routing facts of a call: its owner header's values and its method.

        The method as gRPC names it: ``/lethe.v1.Threads/CreateThread``.
        """
        values = tuple(
            v if isinstance(v, str) else bytes(v).decode(errors="replace")
            for k, v in metadata
            if k == OWNER_HEADER
        )
        return Route(values, self, method)

    def check(self, route: Route, owner: str) -> None:
        """Check a call for ``owner`` (see the module docstring).

        Raises:
            WrongOwnerHeader: ``OWNER_HEADER_MISSING`` (required and absent) or
                ``OWNER_HEADER_MISMATCH`` (repeated, malformed, or another owner).
            OwnerMoved: ``owner`` has a moved-away marker here.
            OwnerMoving: ``owner`` is arriving here and not activated yet.
            NotFound: sharded, and ``owner`` is not held here.
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
        row, held = self._placement(owner)
        if row is None:
            self._check_held(route, owner, held)
            return
        seen = (row.state, row.move_id)
        if self._seen.get(owner) != seen:
            if self._on_change is not None:
                self._on_change(owner)
            self._seen[owner] = seen
        refusal = row.refusal(write=False)
        if refusal is not None:
            raise refusal
        self._check_held(route, owner, held)

    def _check_held(self, route: Route, owner: str, held: bool) -> None:
        if self.require_header and not held and route.method not in OWNER_CREATING:
            raise NotFound(
                f"this shard holds no owners/{owner}: the proxy's placement sends it here, "
                "but it was never written here (or its move here was not imported)"
            )


@dataclass(frozen=True, slots=True)
class Route:
    """What a call says about its routing: the values of its owner header."""

    header: tuple[str, ...]
    router: Router
    method: str = ""


_route: contextvars.ContextVar[Route | None] = contextvars.ContextVar("lethe_route", default=None)


def bind_route(route: Route) -> None:
    """Bind a call's route to the current context.

    The call pipeline binds it, beside the principal.
    """
    _route.set(route)


def check_route(owner: str) -> None:
    """Apply the bound route's checks for ``owner``.

    A no-op outside the call pipeline (a servicer called directly, in tests).

    Raises:
        WrongOwnerHeader, OwnerMoved: as :meth:`Router.check`.
    """
    route = _route.get()
    if route is not None:
        route.router.check(route, owner)
