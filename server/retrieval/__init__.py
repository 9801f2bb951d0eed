"""Retrieval: each owner's in-memory indexes, search and context assembly.

Built from the encrypted store when first needed (or loaded from the owner's
encrypted snapshot when it is exactly current), kept in line with the store on
every write and forget, never written to disk in plaintext:

==================  ===========================================================
module              holds
==================  ===========================================================
``_indexed_text``   what each record is indexed under (plain text, contextual
                    date, session key) and its BM25 terms, analysed once
``_bundle``         the bundle of indexes of one owner (or one thread's pending
                    turns): dense, two BM25 legs, sessions, times
``_build``          ``IndexBuilds``, the declared base: the bundle cache, the
                    per-owner locks, the embedder, builds from the store
``_upkeep``         ``IndexUpkeep``: loaded bundles follow writes and forgets
``_snapshot``       ``IndexSnapshots``: warm starts from encrypted snapshots,
                    checked against the store and replayed on load
``_follow``         ``IndexFollow``: with several processes on one directory,
                    bundles follow the store's change log (others' writes)
``_query``          ``Retriever``: query vectors, legs, fusion and the recheck
``_drift``          the audit's ``index_drift`` of a loaded bundle
``_reembed``        re-embedding an owner's records after the embedder changed
``_context``        context assembly and context manifests
``_echoes``         where a forget's echo sweep looks (the owner's own bundles)
                    and the word shingles its guard digests
==================  ===========================================================

May import: the floor (``server.errors``, ``server._logs``, ``server._metrics``),
``server.store`` (its face), ``index`` and ``shredder`` (failpoints), ``lethe``;
never ``server.edge``, ``server.lifecycle``, ``server.services`` or
``server.cli``.
"""

from server.retrieval._build import BUILD_CHUNK
from server.retrieval._context import (
    DEFAULT_MAX_CHARS,
    DEFAULT_RECENT,
    DEFAULT_TOP_K,
    ContextBundle,
    assemble,
)
from server.retrieval._drift import index_drift
from server.retrieval._echoes import ECHO_RULE, echo_shingles, echo_terms, find_owner_echoes
from server.retrieval._indexed_text import (
    TermMemo,
    date_text,
    indexed_text,
    plain_text,
    session_key,
)
from server.retrieval._query import (
    MODE_DENSE,
    MODE_HYBRID,
    MODE_LEXICAL,
    Retriever,
    SearchHit,
)
from server.retrieval._reembed import check_embedder, reembed_owner

__all__ = [
    "BUILD_CHUNK",
    "DEFAULT_MAX_CHARS",
    "DEFAULT_RECENT",
    "DEFAULT_TOP_K",
    "ECHO_RULE",
    "MODE_DENSE",
    "MODE_HYBRID",
    "MODE_LEXICAL",
    "ContextBundle",
    "Retriever",
    "SearchHit",
    "TermMemo",
    "assemble",
    "check_embedder",
    "date_text",
    "echo_shingles",
    "echo_terms",
    "find_owner_echoes",
    "index_drift",
    "indexed_text",
    "plain_text",
    "reembed_owner",
    "session_key",
]
