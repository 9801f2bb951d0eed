"""The edge: every call's way in, from the wire to a servicer and back.

==================  ===========================================================
module              holds
==================  ===========================================================
``_edge``           the call pipeline of every ``lethe.v1`` method (drain,
                    token, route, bounds, decode, worker, status) and the one
                    error boundary, where an exception becomes a
                    ``google.rpc.Status``; the gRPC handlers over it
``_connect``        the same pipeline over the Connect protocol (HTTP/1.1 and
                    HTTP/2, JSON or binary): an ASGI application
``_admission``      the bounds on calls and streams, and the fair worker pool
``_auth``           bearer tokens, authentication, authorising an owner
``_routing``        the ``x-lethe-owner`` header check and moved-away owners
``_notifier``       the one ``Watch`` notifier that wakes every open stream
==================  ===========================================================

May import: the floor (``server.errors``, ``server._logs``, ``server._metrics``),
``server.store`` (its face), ``lethe``; never ``server.retrieval``,
``server.lifecycle``, ``server.services`` or ``server.cli``. The servicers
(:mod:`server.services`) import this face for :func:`authorize` and the
stream context; :mod:`server._app` assembles the edge with them.
"""

from server.edge._admission import Admission, FairExecutor, Limits
from server.edge._auth import (
    LABEL_RE,
    TOKEN_CACHE_SECONDS,
    Authenticator,
    Principal,
    authorize,
    new_token,
    principal_record,
    token_digest,
)
from server.edge._connect import ConnectApp
from server.edge._edge import Edge, Method, StreamContext, SyncContext
from server.edge._notifier import EventHub
from server.edge._routing import Router

__all__ = [
    "LABEL_RE",
    "TOKEN_CACHE_SECONDS",
    "Admission",
    "Authenticator",
    "ConnectApp",
    "Edge",
    "EventHub",
    "FairExecutor",
    "Limits",
    "Method",
    "Principal",
    "Router",
    "StreamContext",
    "SyncContext",
    "authorize",
    "new_token",
    "principal_record",
    "token_digest",
]
