"""The ledger: records that a restore of the data environment must never roll back.

The keystore is never restored with a data backup (a keystore copy older than the
last rotation opens nothing by design), so it is where a record goes whose loss or
rollback would undo a decision: the shred log is one, and the keystore's user may
keep others in the ``ledger`` database (layout in `shredder._keystore_schema`).
The server keeps its bearer tokens' rows there, so a restore neither revives a
revoked token nor loses one created after the backup. The keystore does not read
them: keys and values are opaque bytes.

Thread rules: `put_ledger` writes (one synced transaction) and must be called
from one thread at a time per process (the server's writer thread); another process
(``lethe token``) may write at the same time, LMDB serialises the two. The read
methods are safe from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence

from shredder._keystore_base import KeystoreBase

__all__ = ["LedgerPart"]


class LedgerPart(KeystoreBase):
    """Opaque records kept beside the keys (see the module docstring)."""

    def put_ledger(self, items: Sequence[tuple[bytes, bytes | None]]) -> None:
        """Write, or delete where the value is None, records in one synced transaction.

        Args:
            items: ``(key, value)`` pairs; keys of 1 to 511 bytes.

        Raises:
            ValueError: a key is empty or longer than 511 bytes (nothing is written).
            lmdb.Error, OSError: the transaction failed (nothing is written).
        """
        for key, _ in items:
            if not 0 < len(key) <= 511:
                raise ValueError("a ledger key is 1 to 511 bytes")
        if not items:
            return
        with self._env.begin(write=True) as txn:
            for key, value in items:
                if value is None:
                    txn.delete(key, db=self._ledger)
                else:
                    txn.put(key, value, db=self._ledger)

    def ledger_entry(self, key: bytes) -> bytes | None:
        """The record stored under ``key``, or None."""
        with self._env.begin() as txn:
            raw = txn.get(key, db=self._ledger)
        return None if raw is None else bytes(raw)

    def ledger(self, prefix: bytes = b"") -> list[tuple[bytes, bytes]]:
        """Every record whose key starts with ``prefix``, in key order."""
        with self._env.begin() as txn:
            cursor = txn.cursor(db=self._ledger)
            out: list[tuple[bytes, bytes]] = []
            if not cursor.set_range(prefix):
                return out
            for key, value in cursor:
                if not bytes(key).startswith(prefix):
                    break
                out.append((bytes(key), bytes(value)))
        return out
