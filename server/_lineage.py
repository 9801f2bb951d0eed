"""Lineage edges in the data environment, both directions, and source checks.

Two named databases hold every edge, written in the same transaction as the
derivative (ARCHITECTURE.md, "Lineage and deletion"):

==============  ==================================  =============================
database        key                                 value
==============  ==================================  =============================
lineage_down    source name 0x00 derivative name    JSON [source v, derivative v]
lineage_up      derivative name 0x00 source name    JSON [source v, derivative v]
==============  ==================================  =============================

Names are resource names (ids only, never content). A derivative is a memory
with sources, or a turn with ``context_refs`` (an assistant response).

Every function here runs inside a transaction the caller owns; the write
functions only on the writer thread.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import lmdb

from server._records import edge_key


def add_edges(
    txn: lmdb.Transaction,
    down: Any,
    up: Any,
    derivative: str,
    version: int,
    sources: Sequence[tuple[str, int]],
) -> None:
    """Write both directions of each ``source → derivative`` edge."""
    for name, source_version in sources:
        value = json.dumps([source_version, version]).encode()
        txn.put(edge_key(name, derivative), value, db=down)
        txn.put(edge_key(derivative, name), value, db=up)


def remove_edges_of(txn: lmdb.Transaction, down: Any, up: Any, derivative: str) -> None:
    """Remove every edge whose derivative is ``derivative`` (both directions)."""
    for source, _ in list(ancestors_of(txn, up, derivative)):
        txn.delete(edge_key(source, derivative), db=down)
        txn.delete(edge_key(derivative, source), db=up)


def remove_edges_from(txn: lmdb.Transaction, down: Any, up: Any, source: str) -> None:
    """Remove the ``source → *`` rows of ``lineage_down`` (a purged source).

    The derivatives' ``lineage_up`` rows stay: a surviving (tainted) response
    still names what it was built from, which is how it stays tainted.
    """
    for derivative, _ in list(children_of(txn, down, source)):
        txn.delete(edge_key(source, derivative), db=down)


def _scan(txn: lmdb.Transaction, db: Any, first: str) -> Iterator[tuple[str, tuple[int, int]]]:
    prefix = f"{first}\x00".encode()
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    for raw_key, raw_value in cur:
        key = bytes(raw_key)
        if not key.startswith(prefix):
            break
        versions = json.loads(bytes(raw_value))
        yield key[len(prefix) :].decode(), (int(versions[0]), int(versions[1]))


def children_of(
    txn: lmdb.Transaction, down: Any, source: str
) -> Iterator[tuple[str, tuple[int, int]]]:
    """(derivative name, (source version, derivative version)) of each edge from ``source``."""
    return _scan(txn, down, source)


def ancestors_of(
    txn: lmdb.Transaction, up: Any, derivative: str
) -> Iterator[tuple[str, tuple[int, int]]]:
    """(source name, (source version, derivative version)) of each edge into ``derivative``."""
    return _scan(txn, up, derivative)
