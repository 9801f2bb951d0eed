"""Lineage edges in the data environment, both directions, and source checks.

Two named databases hold every edge, written in the same transaction as the
derivative (ARCHITECTURE.md, "Lineage and deletion"):

==============  ==================================  =============================
database        key                                 value
==============  ==================================  =============================
lineage_down    source name 0x00 derivative name    JSON [source v, derivative v]
lineage_up      derivative name 0x00 source name    JSON [source v, derivative v]
==============  ==================================  =============================

Names are resource names (ids only, never content); the key layout is
:func:`server.store._schema.edge_key`. A derivative is a memory
with sources, or a turn with ``context_refs`` (an assistant response).

Every function here runs inside a transaction the caller owns; the write
functions only on the writer thread.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import lmdb

from server.store import _json
from server.store._schema import Tables, edge_key, edge_prefix, scan


def add_edges(
    txn: lmdb.Transaction,
    t: Tables,
    derivative: str,
    version: int,
    sources: Sequence[tuple[str, int]],
) -> None:
    """Write both directions of each ``source → derivative`` edge."""
    for name, source_version in sources:
        value = _json.dumps([source_version, version])
        txn.put(edge_key(name, derivative), value, db=t.lineage_down)
        txn.put(edge_key(derivative, name), value, db=t.lineage_up)


def remove_edges_of(txn: lmdb.Transaction, t: Tables, derivative: str) -> None:
    """Remove every edge whose derivative is ``derivative`` (both directions)."""
    for source, _ in list(ancestors_of(txn, t, derivative)):
        txn.delete(edge_key(source, derivative), db=t.lineage_down)
        txn.delete(edge_key(derivative, source), db=t.lineage_up)


def remove_edges_from(txn: lmdb.Transaction, t: Tables, source: str) -> None:
    """Remove the ``source → *`` rows of ``lineage_down`` (a purged source).

    The derivatives' ``lineage_up`` rows stay: a surviving (tainted) response
    still names what it was built from, which is how it stays tainted.
    """
    for derivative, _ in list(children_of(txn, t, source)):
        txn.delete(edge_key(source, derivative), db=t.lineage_down)


def _scan(txn: lmdb.Transaction, db: Any, first: str) -> Iterator[tuple[str, tuple[int, int]]]:
    prefix = edge_prefix(first)
    for key, raw in scan(txn, db, prefix):
        versions = _json.loads(raw)
        yield key[len(prefix) :].decode(), (int(versions[0]), int(versions[1]))


def children_of(
    txn: lmdb.Transaction, t: Tables, source: str
) -> Iterator[tuple[str, tuple[int, int]]]:
    """(derivative name, (source version, derivative version)) of each edge from ``source``."""
    return _scan(txn, t.lineage_down, source)


def ancestors_of(
    txn: lmdb.Transaction, t: Tables, derivative: str
) -> Iterator[tuple[str, tuple[int, int]]]:
    """(source name, (source version, derivative version)) of each edge into ``derivative``."""
    return _scan(txn, t.lineage_up, derivative)
