r"""The keystore's storage schema: every named database, every key layout.

Each named database of the keystore environment is a constant here and every LMDB key is
spelled by one function here, with the associated data of wrapped keys; the parts of
`shredder.Keystore` never spell a layout (etcd's ``server/storage/schema``: every bucket a
typed constant, every key encoded in one place).

The keystore is a separate environment (directory) from the data environment, so a copy of the
data never carries keys and destroying a key never needs the data. It holds six named
databases:

``meta``
    ``b"format"`` -> ``b"lethe-keystore/1"``; ``b"store_id"`` -> 32 ASCII hex characters
    (a random UUID4), readable without the KEK; ``b"unrotated_since"`` -> when the oldest key
    destruction (or move of a record key to another ring) not yet completed by a rotation
    happened, ASCII decimal seconds, absent when there is none; ``b"signing/" | key id`` and
    ``b"signing_seed"``: the store's signing keys (layout in `shredder._keystore_signing`).

``rings`` — one entry per ring key. LMDB key (the *ring prefix*)::

    thread ring:  owner (1-63 bytes) | 0x00 | b"T" | thread (1-63 bytes) | 0x00
    owner ring:   owner (1-63 bytes) | 0x00 | b"O" | 0x00

  Value, 81 bytes::

    offset  size  field
    0       4     ring-key generation, unsigned big-endian (1 for a new ring)
    4       77    the ring key wrapped under a KEK version (layout in `shredder._aead`;
                  its 4-byte version field is the KEK version)

``shredded`` — the shred log: one entry per deliberate destruction (ids only, never key
  material). LMDB key: a record key's LMDB key (below) and ``owner | 0x00 | b"K" | key id``
  (the same key found by id, whichever ring held it), a ring prefix (the whole ring), or an
  owner prefix ``owner | 0x00`` (every ring of the owner); value: the time of the latest such
  destruction, ASCII decimal seconds. It lets start-up tell a record whose key was destroyed on
  purpose (its forget is decided) from one whose key went missing (kept and reported).

``records`` — one entry per record key. LMDB key::

    ring prefix (as above) | key id (1-256 bytes of UTF-8, no 0x00)

  Value, 77 bytes: the record key wrapped under its ring key (its 4-byte version field is the
  ring-key generation).

``dirty`` — rings that lost or gave away a record key since the last rotation: LMDB key a ring
  prefix, value empty. A rotation gives each a new ring key and empties the database.

``ledger`` — records the keystore's user keeps here because a restore of the data
  environment must never roll them back, as it never rolls back the shred log (the server
  keeps its bearer tokens' rows here: a revoked token stays revoked after a restore). Opaque
  to the keystore: LMDB key 1-511 bytes, value any bytes; the key ``b"!filled"`` (value
  ``b"1"``) marks that the user has filled the database once.

Owner and thread ids match ``[a-z0-9][a-z0-9-]{0,62}`` and never contain 0x00, so every ring
prefix ends at its first 0x00 after the ring kind, owner ``a``'s prefix ``a\x00`` is never a
prefix of owner ``ab``'s keys, and a thread ring's prefix is never a prefix of another
thread's. Range deletes of an owner (prefix ``owner | 0x00``) and of a ring (its ring prefix)
are cursor prefix scans.

Associated data of wrapped keys (encoded as in `shredder._aead`):

- ring key: ``"lethe-wrap/1", "ring", owner, ring kind ("T"/"O"), thread or "", KEK version,
  ring-key generation``;
- record key: ``"lethe-wrap/1", "record", owner, ring kind, thread or "", key id, ring-key
  generation``.

Thread rules: the functions here are pure, or work inside a transaction their caller owns
(`_prefixed`, `_delete_prefix`); any thread may call them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import lmdb

from shredder._aead import WRAPPED_KEY_SIZE, RingRef, _encode_fields

_FORMAT = b"lethe-keystore/1"
_META = b"meta"
_RINGS = b"rings"
_RECORDS = b"records"
_DIRTY = b"dirty"  # rings that lost or gave away a record key since the last rotation
_SHREDDED = b"shredded"  # the shred log (see the module docstring)
_LEDGER = b"ledger"  # records a data restore must never roll back
_MAX_DBS = 6
_UNROTATED = b"unrotated_since"  # meta: seconds of the oldest shred not yet rotated
_KEK_CURRENT = b"kek_current"  # meta: the KEK version the last rotation moved every ring key to
_SEP = b"\x00"
_THREAD_RING = b"T"
_OWNER_RING = b"O"
_KEY_ID_LOG = b"K"  # shred-log entries of a record key by id
_WRAP_TAG = "lethe-wrap/1"
_MAX_KEY_ID_BYTES = 256
_RING_VALUE_SIZE = 4 + WRAPPED_KEY_SIZE
_FIRST_GENERATION = 1


def _ring_prefix(ring: RingRef) -> bytes:
    owner = ring.owner.encode("ascii")
    if ring.thread is None:
        return owner + _SEP + _OWNER_RING + _SEP
    return owner + _SEP + _THREAD_RING + ring.thread.encode("ascii") + _SEP


def _owner_prefix(owner: str) -> bytes:
    return RingRef(owner).owner.encode("ascii") + _SEP


def _key_id_bytes(key_id: str) -> bytes:
    if not isinstance(key_id, str) or not key_id:
        raise ValueError("key id must be a non-empty str")
    raw = key_id.encode("utf-8")
    if _SEP in raw or len(raw) > _MAX_KEY_ID_BYTES:
        raise ValueError(f"key id must be 1-{_MAX_KEY_ID_BYTES} UTF-8 bytes without NUL")
    return raw


def _key_id_log_key(owner: str, key_id: str) -> bytes:
    """Shred-log key of a record key by owner and id, whichever ring held it."""
    return _owner_prefix(owner) + _KEY_ID_LOG + _key_id_bytes(key_id)


def _record_lmdb_key(ring: RingRef, key_id: str) -> bytes:
    return _ring_prefix(ring) + _key_id_bytes(key_id)


def _ring_prefix_length(raw: bytes) -> int:
    """The length in bytes of the ring prefix at the start of an LMDB key."""
    owner_end = raw.index(_SEP)
    if raw[owner_end + 1 : owner_end + 2] == _OWNER_RING:
        return owner_end + 3
    return raw.index(_SEP, owner_end + 2) + 1


def _decode_ring_prefix(raw: bytes) -> tuple[RingRef, int]:
    """Decode the ring prefix at the start of an LMDB key.

    Returns:
        The ring and the length of its prefix in bytes.
    """
    size = _ring_prefix_length(raw)
    owner_end = raw.index(_SEP)
    owner = raw[:owner_end].decode("ascii")
    if raw[owner_end + 1 : owner_end + 2] == _OWNER_RING:
        return RingRef(owner), size
    return RingRef(owner, raw[owner_end + 2 : size - 1].decode("ascii")), size


def _ring_fields(ring: RingRef) -> tuple[str, str, str]:
    kind = "O" if ring.thread is None else "T"
    return ring.owner, kind, ring.thread or ""


def _ring_ad(ring: RingRef, kek_version: int, generation: int) -> bytes:
    return _encode_fields(_WRAP_TAG, "ring", *_ring_fields(ring), kek_version, generation)


def _ring_ad_builder(ring: RingRef, generation: int) -> Callable[[int], bytes]:
    def build(kek_version: int) -> bytes:
        return _ring_ad(ring, kek_version, generation)

    return build


def _record_ad(ring: RingRef, key_id: str, generation: int) -> bytes:
    return _encode_fields(_WRAP_TAG, "record", *_ring_fields(ring), key_id, generation)


def _prefixed(
    txn: lmdb.Transaction, db: lmdb._Database, prefix: bytes
) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` of every entry of `db` whose key starts with `prefix`."""
    cursor = txn.cursor(db=db)
    if not cursor.set_range(prefix):
        return
    for key, value in cursor:
        if not bytes(key).startswith(prefix):
            return
        yield bytes(key), bytes(value)


def _delete_prefix(txn: lmdb.Transaction, db: lmdb._Database, prefix: bytes) -> int:
    """Delete every entry of `db` whose key starts with `prefix`; return how many."""
    deleted = 0
    cursor = txn.cursor(db=db)
    if not cursor.set_range(prefix):
        return 0
    while bytes(cursor.key()).startswith(prefix):
        if not cursor.delete():
            break
        deleted += 1
    return deleted
