"""The durability floor of a deletion, measured in process.

A ``Forget`` of ``k`` records must at least (1) overwrite ``k`` rows in one
synced write transaction of the data environment and (2) destroy ``k``
record keys in one synced keystore transaction. :class:`DurableFloor` does
exactly that and nothing else, with the server's durability flags
(``shredder.open_durable_env``: ``sync``, ``metasync``, ``meminit`` on;
``writemap`` and ``map_async`` off) and the server's own
``shredder.Keystore.destroy`` (shred log entries, then ``env.sync``). The
rows are 512 random bytes, about a sealed LoCoMo turn; a tombstone is 48 bytes.

Threads: one thread at a time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from shredder import KekRing, Keystore, RingRef, open_durable_env

__all__ = ["DurableFloor"]

_ROW_BYTES = 512
_TOMBSTONE_BYTES = 48


class DurableFloor:
    """A data environment and a keystore in a temporary directory.

    Call :meth:`close` when done.
    """

    def __init__(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="lethe-bench-floor-"))
        self._env = open_durable_env(self._root / "data", map_size=4 << 30, max_dbs=2)
        self._rows = self._env.open_db(b"rows")
        self._keys = Keystore(self._root / "keys", KekRing.from_env(KekRing.generate_env_value()))
        self._ring = RingRef("floor", "t")
        self._next = 0

    def measure(self, records: int) -> float:
        """Seconds to delete ``records`` fresh records durably.

        Writes ``records`` rows and record keys first (not timed), then times
        one synced data transaction that overwrites each row with a tombstone
        plus one ``Keystore.destroy`` of their keys.

        Args:
            records: ``k >= 1``.

        Returns:
            Seconds of the two transactions together.
        """
        ids = [f"r{self._next + i}" for i in range(records)]
        self._next += records
        keys = [i.encode() for i in ids]
        with self._env.begin(write=True, db=self._rows) as txn:
            for key in keys:
                txn.put(key, os.urandom(_ROW_BYTES))
        refs = [(self._ring, i) for i in ids]
        self._keys.create_record_keys(refs)
        tombstone = os.urandom(_TOMBSTONE_BYTES)
        t0 = time.perf_counter()
        with self._env.begin(write=True, db=self._rows) as txn:
            for key in keys:
                txn.put(key, tombstone)
        self._keys.destroy(record_keys=refs)
        return time.perf_counter() - t0

    def close(self) -> None:
        """Close both environments and delete the directory."""
        self._keys.close()
        self._env.close()
        shutil.rmtree(self._root, ignore_errors=True)
