"""The gRPC servicers of ``lethe.v1``.

Each handler validates the request, authorises the named owner, calls the
store / retriever / lifecycle and converts the result (etcd's
``v3rpc/key.go``: handlers are thin; no handler opens a transaction):

==================  ===========================================================
module              holds
==================  ===========================================================
``_threads``        ``lethe.v1.Threads``: threads and turns
``_memories``       ``lethe.v1.Memories``: memories, corrections, preferences
``_lifecycle``      ``lethe.v1.Lifecycle``: commit, lineage, forget, audit, server info
``_export``         ``Lifecycle.ExportOwner``: an owner's records as a stream
``_retrieval``      ``lethe.v1.Retrieval``: search and context assembly
``_repairs``        ``lethe.v1.Repairs``: seal, reopen, pause, conclude
``_events``         ``lethe.v1.Events``: the ``Watch`` stream and event pages
``_common``         request limits and the validation helpers every handler uses
``_pages``          opaque page tokens
``_convert``        store objects to response messages
==================  ===========================================================

May import: the floor (``server.errors``, ``server._names``, ``server._logs``,
``server._tagger``), ``lethe`` (messages, names), and the faces of
``server.store``, ``server.retrieval``, ``server.lifecycle`` and
``server.edge`` (``authorize``, the stream context, the notifier). Never a
room's private module, ``shredder``, ``index`` or ``server.cli``.
"""

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
]
