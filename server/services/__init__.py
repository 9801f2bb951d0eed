"""The gRPC servicers of ``lethe.v1``: validate, authorise the named owner,
call the store / retriever / lifecycle, convert the result (etcd's
``v3rpc/key.go``: handlers are thin; no handler opens a transaction).

May import: ``lethe`` (messages, names), ``server.store`` (its face),
``server._search``, ``server._lifecycle``, ``server._context``,
``server._convert``, ``server._auth``, ``server._names``, ``server._tagger``,
``server._edge`` (the stream context), ``server._notifier``, ``server._logs``,
``server.errors``. Never ``server.store._*``, ``shredder`` or ``index``.
"""

from server.services._common import abort
from server.services._events import EventsService
from server.services._lifecycle import LifecycleService
from server.services._memories import MemoriesService
from server.services._repairs import RepairsService
from server.services._retrieval import RetrievalService
from server.services._threads import ThreadsService

__all__ = [
    "EventsService",
    "LifecycleService",
    "MemoriesService",
    "RepairsService",
    "RetrievalService",
    "ThreadsService",
    "abort",
]
