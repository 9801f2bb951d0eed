# Generated from lethe/client/_retrieval_async.py by scripts/gen_sync_client.py: do not edit.
# Edit the source and run `.venv/bin/python scripts/gen_sync_client.py`.
"""The ``lethe.v1.Retrieval`` methods of the client.

Search, and the context a model sees: a method group of
:class:`lethe.client.Client`, which documents the errors, deadlines and
retries every method shares.
"""

from __future__ import annotations

from collections.abc import Iterable

from lethe.client._base_sync import ClientBase
from lethe.client._build import build
from lethe.client._types import EnumOr
from lethe.v1 import memories_pb2, retrieval_pb2

__all__ = ["RetrievalMethods"]


class RetrievalMethods(ClientBase):
    """The methods of ``lethe.v1.Retrieval``, one per RPC."""

    def search(
        self,
        parent: str,
        *,
        query_text: str = "",
        query_embedding: Iterable[float] = (),
        top_k: int = 0,
        thread: str = "",
        include_pending: bool = False,
        kinds: Iterable[EnumOr[memories_pb2.Memory.Kind.ValueType]] = (),
        include_turns: bool = False,
        mode: EnumOr[retrieval_pb2.SearchRequest.Mode.ValueType] | None = None,
        timeout: float | None = None,
    ) -> retrieval_pb2.SearchResponse:
        """``Retrieval.Search``: the owner's committed, live, untainted records, best first.

        Args:
            parent: ``owners/{owner}``.
            query_text: the query (``LEXICAL`` needs it).
            query_embedding: a query vector of the owner's dimension.
            top_k: 1..1000 hits (0: 10).
            thread: with ``include_pending``, also that thread's pending turns.
            include_pending: see ``thread``.
            kinds: search memories of these kinds (default: turns and every kind).
            include_turns: with ``kinds``, also search turns.
            mode: ``HYBRID`` (default), ``DENSE`` or ``LEXICAL``.
            timeout: deadline in seconds (default: the client's).

        Returns:
            ``hits``: each a ``turn`` or a ``memory`` with its ``score``.

        Raises:
            DimensionMismatch: ``query_embedding`` has the wrong dimension.
        """
        request = build(
            retrieval_pb2.SearchRequest,
            {
                "parent": parent,
                "query_text": query_text,
                "query_embedding": query_embedding,
                "top_k": top_k,
                "thread": thread,
                "include_pending": include_pending,
                "kinds": kinds,
                "include_turns": include_turns,
                "mode": mode,
            },
        )
        return self._call(self.stubs.retrieval.Search, request, timeout)

    def assemble_context(
        self,
        thread: str,
        *,
        query_text: str = "",
        query_embedding: Iterable[float] = (),
        max_chars: int = 0,
        recent_turns: int = 0,
        top_k: int = 0,
        scope: str = "",
        timeout: float | None = None,
    ) -> retrieval_pb2.ContextBundle:
        """``Retrieval.AssembleContext``: what a model should see for its next response.

        Not retried: the server stores the manifest of what it returned.

        Args:
            thread: the thread the response belongs to.
            query_text: what to find relevant memories for.
            query_embedding: a query vector instead of, or with, the text.
            max_chars: budget of the whole bundle (0: the server's default).
            recent_turns: how many recent turns (0: the server's default).
            top_k: how many relevant memories (0: the server's default).
            scope: the scope preferences are resolved at.
            timeout: deadline in seconds (default: the client's).

        Returns:
            The bundle, with the stored ``manifest`` naming every record in it.

        Raises:
            NotFound / RecordDeleted: the thread.
        """
        request = build(
            retrieval_pb2.AssembleContextRequest,
            {
                "thread": thread,
                "query_text": query_text,
                "query_embedding": query_embedding,
                "max_chars": max_chars,
                "recent_turns": recent_turns,
                "top_k": top_k,
                "scope": scope,
            },
        )
        return self._call(self.stubs.retrieval.AssembleContext, request, timeout)

    def get_context_manifest(
        self, name: str, *, timeout: float | None = None
    ) -> retrieval_pb2.ContextManifest:
        """``Retrieval.GetContextManifest``.

        Args:
            name: ``owners/{owner}/manifests/{manifest}``.
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound: no such manifest.
        """
        request = retrieval_pb2.GetContextManifestRequest(name=name)
        return self._call(self.stubs.retrieval.GetContextManifest, request, timeout)
