"""The Lethe server: the gRPC API over the record store, its indexes and its keys.

``server`` knows records and rules but never sees a raw key (``shredder``
holds them) and leaves vectors to ``index``. Its rooms, from the floor up
(each room's ``__init__`` lists its modules and what it may import;
``tests/test_layout.py`` checks every rule):

=====================  ========================================================
room                   holds
=====================  ========================================================
the floor              ``errors`` (the exception tree; reasons), ``_names``
                       (name fields to ``INVALID_ARGUMENT``), ``_logs``
                       (rate-limited logging), ``_metrics`` (Prometheus),
                       ``_tagger`` (the write-time tagger); they import
                       ``lethe`` and each other only
``server.store``       the record store on LMDB behind one face (the only room
                       that touches LMDB)
``server.retrieval``   per-owner in-memory indexes, search, context assembly
``server.lifecycle``   deletions end to end, start-up recovery, the sweeper
``server.edge``        the call pipeline: tokens, routing, admission, the one
                       error boundary, the ``Watch`` notifier
``server.services``    the gRPC servicers (thin handlers)
``_app``               assembles the server from the rooms (``LetheServer``)
``server.cli``         the ``lethe`` command line
=====================  ========================================================

The names below load lazily (PEP 562): ``import server.store`` or ``lethe
token list`` does not import the app, gRPC's server or FAISS.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server._app import LetheServer, ServerConfig
    from server.edge import new_token, principal_record, token_digest
    from server.errors import LetheError
    from server.store import Store, StoreLockedError

__all__ = [
    "LetheError",
    "LetheServer",
    "ServerConfig",
    "Store",
    "StoreLockedError",
    "new_token",
    "principal_record",
    "token_digest",
]

_HOMES = {
    "LetheError": "server.errors",
    "LetheServer": "server._app",
    "ServerConfig": "server._app",
    "Store": "server.store",
    "StoreLockedError": "server.store",
    "new_token": "server.edge",
    "principal_record": "server.edge",
    "token_digest": "server.edge",
}


def __getattr__(name: str) -> Any:
    """Load a public name from its room on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'server' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return sorted({*globals(), *__all__})
