"""The Lethe server: gRPC services (``server.services``), validation, auth, the
record store on LMDB (``server.store``, the only room that touches LMDB),
lifecycle rules and the CLI.

``server`` knows records and rules but never sees a raw key (``shredder``
holds them) and leaves vectors to ``index``.
"""

from server._app import LetheServer, ServerConfig
from server._auth import new_token, principal_record, token_digest
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
