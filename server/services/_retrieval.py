"""The ``lethe.v1.Retrieval`` servicer."""

from __future__ import annotations

import grpc

from lethe.v1 import common_pb2, retrieval_pb2, retrieval_pb2_grpc
from server._names import parse_manifest, parse_owner, parse_thread
from server.edge import authorize
from server.errors import InvalidArgument
from server.retrieval import (
    DEFAULT_MAX_CHARS,
    DEFAULT_RECENT,
    MODE_DENSE,
    MODE_HYBRID,
    MODE_LEXICAL,
    Retriever,
    assemble,
)
from server.retrieval import DEFAULT_TOP_K as DEFAULT_CONTEXT_TOP_K
from server.services._common import (
    DEFAULT_TOP_K,
    MAX_PAGE,
    MAX_TEXT_BYTES,
    MAX_TOP_K,
    check_text,
    check_vector,
    fit,
    kind_names,
)
from server.services._convert import bundle_proto, fill_hit, timestamp

MAX_CONTEXT_CHARS = 500_000
"""Most characters one AssembleContext may return (its reply stays under 4 MiB)."""


class RetrievalService(retrieval_pb2_grpc.RetrievalServicer):
    """``lethe.v1.Retrieval``."""

    def AssembleContext(  # noqa: N802
        self, request: retrieval_pb2.AssembleContextRequest, context: grpc.ServicerContext
    ) -> retrieval_pb2.ContextBundle:
        """``Retrieval.AssembleContext``: what a model should see next in a thread."""
        thread = parse_thread(request.thread, "thread")
        authorize(thread.owner)
        if request.max_chars > MAX_CONTEXT_CHARS:
            raise InvalidArgument("max_chars", f"must be in 0..{MAX_CONTEXT_CHARS} (0 = 8000)")
        for field in ("max_chars", "recent_turns", "top_k"):
            if getattr(request, field) < 0:
                raise InvalidArgument(field, "must not be negative")
        if request.top_k > MAX_TOP_K:
            raise InvalidArgument("top_k", f"must be in 0..{MAX_TOP_K} (0 = 5)")
        if request.recent_turns > MAX_PAGE:
            raise InvalidArgument("recent_turns", f"must be in 0..{MAX_PAGE} (0 = 10)")
        check_text(request.query_text, "query_text", limit=MAX_TEXT_BYTES, required=False)
        check_text(request.scope, "scope", limit=1024, required=False)
        query_vec = check_vector(request.query_embedding, "query_embedding")
        vec = None
        if query_vec is not None or request.query_text.strip():
            vec = self.retriever.query_vector(thread.owner, request.query_text, query_vec)
        bundle = assemble(
            self.retriever.store,
            self.retriever,
            thread.owner,
            thread.thread,
            request.query_text,
            vec,
            max_chars=request.max_chars or DEFAULT_MAX_CHARS,
            recent=request.recent_turns or DEFAULT_RECENT,
            top_k=request.top_k or DEFAULT_CONTEXT_TOP_K,
            scope=request.scope,
        )
        return bundle_proto(bundle)

    def GetContextManifest(  # noqa: N802
        self, request: retrieval_pb2.GetContextManifestRequest, context: grpc.ServicerContext
    ) -> retrieval_pb2.ContextManifest:
        """``Retrieval.GetContextManifest``: read a stored context manifest."""
        name = parse_manifest(request.name, "name")
        authorize(name.owner)
        row = self.retriever.store.get_manifest(name.owner, name.manifest)
        return retrieval_pb2.ContextManifest(
            name=request.name,
            refs=[common_pb2.SourceRef(name=n, version=v) for n, v in row.refs],
            create_time=timestamp(row.create_time),
        )

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever

    def Search(  # noqa: N802
        self, request: retrieval_pb2.SearchRequest, context: grpc.ServicerContext
    ) -> retrieval_pb2.SearchResponse:
        """``Retrieval.Search``: the owner's best visible turns and memories for a query."""
        owner = parse_owner(request.parent, "parent")
        authorize(owner)
        top_k = request.top_k or DEFAULT_TOP_K
        if not 1 <= top_k <= MAX_TOP_K:
            raise InvalidArgument("top_k", f"must be in 1..{MAX_TOP_K}")
        check_text(request.query_text, "query_text", limit=MAX_TEXT_BYTES, required=False)
        query_vec = check_vector(request.query_embedding, "query_embedding")
        pending_thread = None
        if request.thread:
            thread = parse_thread(request.thread, "thread")
            if thread.owner != owner:
                raise InvalidArgument("thread", "must be a thread of parent")
            self.retriever.store.get_thread(owner, thread.thread)  # NOT_FOUND / RECORD_DELETED
            if request.include_pending:
                pending_thread = thread.thread
        elif request.include_pending:
            raise InvalidArgument("include_pending", "requires thread")
        modes = {
            retrieval_pb2.SearchRequest.MODE_UNSPECIFIED: MODE_HYBRID,
            retrieval_pb2.SearchRequest.HYBRID: MODE_HYBRID,
            retrieval_pb2.SearchRequest.DENSE: MODE_DENSE,
            retrieval_pb2.SearchRequest.LEXICAL: MODE_LEXICAL,
        }
        if request.mode not in modes:
            raise InvalidArgument("mode", "unknown mode")
        mode = modes[request.mode]
        kinds = frozenset(kind_names(request.kinds, "kinds"))
        if query_vec is None and not request.query_text.strip():
            raise InvalidArgument("query_text", "query_text or query_embedding is required")
        if mode == MODE_LEXICAL and not request.query_text.strip():
            raise InvalidArgument("query_text", "LEXICAL search needs query_text")
        vec = None
        if mode != MODE_LEXICAL:
            vec = self.retriever.query_vector(owner, request.query_text, query_vec)
        if mode == MODE_DENSE and vec is None and self.retriever.embedder is None:
            raise InvalidArgument(
                "query_embedding", "DENSE search needs query_embedding: this server has no embedder"
            )
        hits = self.retriever.search(
            owner,
            request.query_text,
            vec,
            top_k,
            pending_thread,
            mode=mode,
            kinds=kinds,
            include_turns=not request.kinds or request.include_turns,
        )
        # Hits are built inside the reply (not copied into it); those past the
        # reply budget are left out (best first: the cut keeps the best).
        response = retrieval_pb2.SearchResponse()
        for h in hits:
            fill_hit(response.hits.add(), h.view, h.score)
        found, _ = fit(response.hits, 0, lambda h: 0)
        del response.hits[len(found) :]
        return response
