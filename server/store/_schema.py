"""The storage schema of the data environment: every named database, every key.

Each LMDB database is an attribute of :class:`Tables`; each key layout is one
function here, and the rest of the store never spells a layout (etcd's
``server/storage/schema``: every bucket a typed constant, every key encoded in
one place). All keys are ids or numbers, never content.

==============  =============================================  ==================================
database        key                                            value
==============  =============================================  ==================================
meta            ascii name (:data:`STORE_ID`, …)               store id, counters (ascii decimal),
                                                               the recorded embedder (JSON)
owners          owner                                          :class:`OwnerRow` JSON
threads         owner 0x00 thread                              ThreadMeta JSON
turns           rid (8 bytes BE)                               TurnMeta JSON
seqs            owner 0x00 thread 0x00 seq (8 bytes BE)        rid
owner_records   owner 0x00 rid                                 empty
payloads        rid + payload code (``c``, ``e``)              ciphertext (see shredder)
titles          owner 0x00 thread                              ciphertext of the title
expiry          expire time µs (8 BE) + rid                    empty: the pending-expiry queue
retention       expire time µs (8 BE) + rid                    empty: the retention queue of
                                                               committed records
thread_expiry   expire time µs (8 BE) + owner 0x00 thread      empty: the retention queue of
                                                               threads
tombstones      resource name                                  :class:`Tombstone` JSON
deletions       owner 0x00 deletion id                         deletion-log entry JSON (ids only)
requests        owner 0x00 thread 0x00 request id              JSON list of rids (idempotency)
tokens          SHA-256 digest of the bearer token             JSON principal
memories        rid (8 bytes BE)                               MemMeta JSON (current version)
memory_ids      owner 0x00 memory id                           rid
mpayloads       rid + version (8 BE) + code (``m``, ``e``)     ciphertext of one memory version
lineage_down    source name 0x00 derivative name               JSON [source v, derivative v]
lineage_up      derivative name 0x00 source name               JSON [source v, derivative v]
events          owner 0x00 event number (8 bytes BE)           :class:`EventRow` JSON (ids only)
slots           owner 0x00 keyed digest of kind/slot/scope     rid of the memory holding it
manifests       owner 0x00 manifest id                         :class:`ManifestRow` JSON
moved           owner                                          :class:`MovedRow` JSON (ids only)
echo_keys       owner 0x00 key id (``echo-<bucket>-<end>``)    ``GuardKeyRow`` JSON (its end)
echo_guards     owner 0x00 key id 0x00 guard id                ``GuardRow`` JSON (ids, times,
                                                               counts: :mod:`._echoes`)
echo_digests    owner 0x00 key id 0x00 digest (32 bytes)       (guard id 8 bytes, text index
                                                               uint32 BE) per guard text
changes         owner 0x00 change seq (8 bytes BE)             the rids whose turn or memory row
                                                               changed (8 bytes BE each), or
                                                               ``*``: reload the owner
                                                               (:mod:`._changes`)
==============  =============================================  ==================================

Ids never contain 0x00 and resource names never do, so no prefix of one
owner, thread or name can collide with another's.

Thread rules: the functions are pure or run inside a transaction the caller
owns.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import lmdb

from server.store._records import PAYLOAD_CONTENT, PAYLOAD_EMBEDDING, PAYLOAD_MEMORY

# Keys of the ``meta`` database.
STORE_ID = b"store_id"
NEXT_RID = b"next_rid"
NEXT_EVENT = b"next_event"
CHANGES = b"changes"  # counter: change-log entries written so far, over every owner
EMBEDDER = b"embedder"  # JSON {"name", "dim"}: the embedder recorded at the last start

# The last byte of a ``payloads`` key / ``mpayloads`` key by payload type.
_TURN_CODES = {PAYLOAD_CONTENT: b"c", PAYLOAD_EMBEDDING: b"e"}
_MEMORY_CODES = {PAYLOAD_MEMORY: b"m", PAYLOAD_EMBEDDING: b"e"}
TURN_PAYLOAD_TYPES = tuple(_TURN_CODES)


@dataclass(frozen=True, slots=True)
class Tables:
    """The named databases of the data environment (layout in the module docstring)."""

    meta: Any
    owners: Any
    threads: Any
    turns: Any
    seqs: Any
    owner_records: Any
    payloads: Any
    titles: Any
    expiry: Any
    retention: Any
    thread_expiry: Any
    tombstones: Any
    deletions: Any
    requests: Any
    tokens: Any
    memories: Any
    memory_ids: Any
    mpayloads: Any
    lineage_down: Any
    lineage_up: Any
    events: Any
    slots: Any
    manifests: Any
    moved: Any
    echo_keys: Any
    echo_guards: Any
    echo_digests: Any
    changes: Any

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every database name, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def open(cls, env: lmdb.Environment, txn: lmdb.Transaction) -> Tables:
        """Open (creating when missing) every named database in ``txn`` (a write txn)."""
        return cls(**{name: env.open_db(name.encode(), txn=txn) for name in cls.names()})


# ---------------------------------------------------------------------- keys


def rid_key(rid: int) -> bytes:
    """8-byte big-endian key of a record number (sorts numerically)."""
    return struct.pack(">Q", rid)


def rid_of(key: bytes) -> int:
    """The record number at the start of ``key``."""
    return int(struct.unpack(">Q", key[:8])[0])


def owner_key(owner: str) -> bytes:
    """Key of an owner's row in ``owners``."""
    return owner.encode()


def owner_prefix(owner: str) -> bytes:
    """``owner 0x00``: the prefix of every per-owner key."""
    return f"{owner}\x00".encode()


def change_key(owner: str, seq: int) -> bytes:
    """Key of the owner's change-log entry number ``seq`` in ``changes``."""
    return owner_prefix(owner) + struct.pack(">Q", seq)


def thread_key(owner: str, thread: str) -> bytes:
    """``owner 0x00 thread``: key of ``threads`` and ``titles`` rows."""
    return f"{owner}\x00{thread}".encode()


def thread_prefix(owner: str, thread: str) -> bytes:
    """``owner 0x00 thread 0x00``: prefix of a thread's ``seqs`` and ``requests`` keys."""
    return thread_key(owner, thread) + b"\x00"


def seq_key(owner: str, thread: str, seq: int) -> bytes:
    return thread_prefix(owner, thread) + struct.pack(">Q", seq)


def seq_of(key: bytes) -> int:
    """The seq at the end of a ``seqs`` key (:func:`seq_key`)."""
    return int(struct.unpack(">Q", key[-8:])[0])


def owner_record_key(owner: str, rid: int) -> bytes:
    return owner_prefix(owner) + rid_key(rid)


def payload_key(rid: int, payload_type: str) -> bytes:
    """Key of one turn payload: ``rid (8 BE) | code``."""
    return rid_key(rid) + _TURN_CODES[payload_type]


def memory_payload_key(rid: int, version: int, payload_type: str) -> bytes:
    """``rid (8 BE) | version (8 BE) | code``: every version's payloads are kept."""
    return rid_key(rid) + struct.pack(">Q", version) + _MEMORY_CODES[payload_type]


def memory_id_key(owner: str, memory_id: str) -> bytes:
    return f"{owner}\x00{memory_id}".encode()


def expiry_key(expire_time: float, rid: int) -> bytes:
    """Key of the pending-expiry queue: microseconds (8 bytes BE) then rid."""
    return struct.pack(">Q", max(0, int(expire_time * 1_000_000))) + rid_key(rid)


def expiry_bound(t: float) -> bytes:
    """The 8-byte time part of :func:`expiry_key` for ``t`` (seconds)."""
    return expiry_key(t, 0)[:8]


def thread_expiry_key(expire_time: float, owner: str, thread: str) -> bytes:
    """Key of the threads' retention queue: microseconds (8 bytes BE), ``owner 0x00 thread``."""
    return expiry_bound(expire_time) + thread_key(owner, thread)


def tombstone_key(name: str) -> bytes:
    return name.encode()


def deletion_key(owner: str, deletion_id: str) -> bytes:
    return owner_prefix(owner) + deletion_id.encode()


def request_key(owner: str, thread: str, request_id: str) -> bytes:
    return thread_prefix(owner, thread) + request_id.encode()


def event_key(owner: str, number: int) -> bytes:
    return owner_prefix(owner) + struct.pack(">Q", number)


def slot_key(owner: str, digest_hex: str) -> bytes:
    return owner_prefix(owner) + bytes.fromhex(digest_hex)


def manifest_key(owner: str, manifest_id: str) -> bytes:
    return f"{owner}\x00{manifest_id}".encode()


def echo_key_key(owner: str, key_id: str) -> bytes:
    """Key of an echo guard key's row: ``owner 0x00 key id``."""
    return f"{owner}\x00{key_id}".encode()


def echo_digest_prefix(owner: str, key_id: str) -> bytes:
    """``owner 0x00 key id 0x00``: the prefix of a guard bucket's guard and digest rows."""
    return echo_key_key(owner, key_id) + b"\x00"


def echo_guard_key(owner: str, key_id: str, guard_id: str) -> bytes:
    """Key of an echo guard's row: ``owner 0x00 key id 0x00 guard id``."""
    return echo_digest_prefix(owner, key_id) + guard_id.encode()


def edge_key(first: str, second: str) -> bytes:
    """Key of a lineage edge row: ``first 0x00 second``."""
    return f"{first}\x00{second}".encode()


def edge_prefix(first: str) -> bytes:
    return f"{first}\x00".encode()


# ---------------------------------------------------------------------- access


def get(txn: lmdb.Transaction, db: Any, key: bytes) -> bytes | None:
    """``txn.get`` typed as bytes (py-lmdb returns bytes unless buffers=True)."""
    value = txn.get(key, db=db)
    return None if value is None else bytes(value)


def scan(
    txn: lmdb.Transaction, db: Any, prefix: bytes, *, start: bytes | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` of every row whose key starts with ``prefix``, in key order.

    From ``start`` (a key ≥ ``prefix``) when given. The one prefix scan of the
    store.
    """
    cur = txn.cursor(db=db)
    if not cur.set_range(start if start is not None else prefix):
        return
    for raw_key, raw_value in cur:
        key = bytes(raw_key)
        if not key.startswith(prefix):
            return
        yield key, bytes(raw_value)


def scan_keys(txn: lmdb.Transaction, db: Any, prefix: bytes) -> Iterator[bytes]:
    """Keys starting with ``prefix`` in order (values are not read)."""
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    for raw_key in cur.iternext(keys=True, values=False):
        key = bytes(raw_key)
        if not key.startswith(prefix):
            return
        yield key


def delete_prefix(txn: lmdb.Transaction, db: Any, prefix: bytes) -> None:
    """Delete every row whose key starts with ``prefix``."""
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    while bytes(cur.key()).startswith(prefix):
        if not cur.delete():
            break


def take_numbers(txn: lmdb.Transaction, db: Any, key: bytes, count: int = 1) -> int:
    """Reserve ``count`` consecutive numbers of the counter ``key`` and return the first one.

    Numbers start at 1.
    """
    first = int(get(txn, db, key) or b"1")
    txn.put(key, str(first + count).encode(), db=db)
    return first
