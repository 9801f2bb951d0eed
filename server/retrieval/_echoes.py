"""Where a forget's echo sweep looks: the owner's own lexical index, and its shingles.

The sweep (``server.lifecycle``) asks which of an owner's live records repeat a
text it is about to forget. The records are those of the owner's committed
bundle (turns and memories in the plain BM25 leg: committed, live, untainted),
where :func:`index.find_echoes` picks candidates by BM25 and checks each by
containment over the terms the leg already holds, so no record is decrypted
again; and the recent pending turns of the threads the forget touches, which
the caller reads (``server.store.Store.recent_pending``) and this module checks
one by one. Only the bundles of the forget's owner are read: another owner's records
are never candidates.

:data:`ECHO_RULE` (word bigrams of content terms, 0.7 containment, at least 5
bigrams: ``index.ECHO_*``, chosen by ``bench/eval_echoes.py``) decides, for the
sweep and for the guard alike: :func:`echo_shingles` is what the guard digests,
of a forgotten text and of a later write.

What is not looked at: older pending turns of those threads, pending turns of
other threads and pending memories (they reach general retrieval only through
a commit, which the guard checks; until then only their own thread serves them),
sealed records (out of everything until a repair is reopened), records already
tainted (out of retrieval already).

Thread rules: any thread (the bundles' own locks; see
:class:`server.retrieval._build.IndexBuilds`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from index import EchoRule, analyze, find_echoes
from server.retrieval._build import IndexBuilds

ECHO_RULE = EchoRule()
"""The rule of the sweep and of the guard (``index.ECHO_*`` defaults)."""

__all__ = ["ECHO_RULE", "echo_shingles", "echo_terms", "find_owner_echoes"]


def echo_terms(text: str) -> list[str]:
    """A text's content terms in order (the lexical index's analysis)."""
    return analyze(text)


def echo_shingles(text: str) -> list[bytes]:
    """A text's distinct word shingles under :data:`ECHO_RULE`, as UTF-8 (what a guard digests)."""
    return sorted(s.encode() for s in ECHO_RULE.shingles(analyze(text)))


def find_owner_echoes(
    builds: IndexBuilds,
    owner: str,
    sources: Sequence[Sequence[str]],
    pending: Iterable[tuple[int, str]],
    exclude: Collection[int],
) -> dict[int, list[int]]:
    """The owner's records whose text echoes one of ``sources`` (see the module docstring).

    Args:
        builds: the retriever (its owner bundle; built if not loaded).
        owner: whose records; no other owner's are read.
        sources: the forgotten texts' terms (:func:`echo_terms`), in text order.
        pending: ``(record number, plain text)`` of pending turns to check too
            (``server.store.Store.recent_pending``).
        exclude: record numbers never reported (the forgotten records).

    Returns:
        ``{record number: indexes into sources}``.
    """
    found = find_echoes(builds.owner_bundle(owner).plain, sources, ECHO_RULE, exclude=exclude)
    sets = [ECHO_RULE.shingles(terms) for terms in sources]
    for rid, text in pending:
        if rid in exclude:
            continue
        mine = ECHO_RULE.shingles(analyze(text))
        hits = [i for i, source in enumerate(sets) if ECHO_RULE.echoes(source, mine)]
        if hits:
            found[rid] = sorted({*found.get(rid, []), *hits})
    return found
