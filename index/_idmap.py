"""A compact map of int64 ids to int64 values: :class:`IdMap`.

Threads: not thread-safe; its holder's lock guards it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping

import numpy as np
import numpy.typing as npt

__all__ = ["IdMap"]

_GONE = -1
"""A value in :class:`IdMap`'s arrays whose key was deleted (values are >= 0)."""


class IdMap(MutableMapping[int, int]):
    """A map of int64 ids to int64 values (>= 0) held as two sorted int64 arrays.

    For maps with an entry per record, which as a dict of Python ints hold 116
    bytes an entry (11 MiB at 100k records), here 16: Lethe's bundle's context
    map (which turn each contextual text quotes) and :class:`VectorIndex`'s
    id -> position map. New keys wait in a small dict until it outgrows
    an eighth of the arrays (at least :data:`IdMap.MERGE_MIN` keys), then
    join them in one sorted insert; a changed or deleted key is changed in
    place (deleted keys are marked, and dropped at the next merge). Lookups
    are binary searches. Not thread-safe: its holder's lock guards it.

    Args:
        keys: ``(n,) int64`` distinct keys, any order (copied).
        values: ``(n,) int64`` their values, each >= 0.

    Raises:
        ValueError: lengths differ, a key is given twice, or a value is negative.
    """

    MERGE_MIN = 4096

    def __init__(self, keys: Iterable[int] = (), values: Iterable[int] = ()) -> None:
        k = np.fromiter(keys, np.int64)
        v = np.fromiter(values, np.int64)
        if k.shape != v.shape:
            raise ValueError("keys and values differ in length")
        if len(v) and int(v.min()) < 0:
            raise ValueError("values must be >= 0")
        order = np.argsort(k, kind="stable")
        self._keys, self._values = k[order], v[order]
        if len(k) > 1 and bool((self._keys[1:] == self._keys[:-1]).any()):
            raise ValueError("a key is given twice")
        self._new: dict[int, int] = {}
        self._live = len(k)  # keys held in the arrays and not deleted

    def _at(self, key: int) -> int:
        at = int(np.searchsorted(self._keys, key))
        return at if at < len(self._keys) and int(self._keys[at]) == key else -1

    def __getitem__(self, key: int) -> int:
        got = self._new.get(key)
        if got is not None:
            return got
        at = self._at(key)
        if at < 0 or int(self._values[at]) == _GONE:
            raise KeyError(key)
        return int(self._values[at])

    def __setitem__(self, key: int, value: int) -> None:
        if value < 0:
            raise ValueError("values must be >= 0")
        at = self._at(key)
        if at >= 0:
            if int(self._values[at]) == _GONE:
                self._live += 1
            self._values[at] = value
            return
        self._new[key] = value
        if len(self._new) > max(self.MERGE_MIN, len(self._keys) // 8):
            self._merge()

    def __delitem__(self, key: int) -> None:
        if self._new.pop(key, None) is not None:
            return
        at = self._at(key)
        if at < 0 or int(self._values[at]) == _GONE:
            raise KeyError(key)
        self._values[at] = _GONE
        self._live -= 1

    def __iter__(self) -> Iterator[int]:
        keys, values = self.arrays()
        del values
        return iter(keys.tolist())

    def __len__(self) -> int:
        return self._live + len(self._new)

    def items(self) -> list[tuple[int, int]]:  # type: ignore[override]
        """Every ``(key, value)``, by key (a list: the map may change while it is used)."""
        keys, values = self.arrays()
        return list(zip(keys.tolist(), values.tolist(), strict=True))

    def arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(keys, values)``: new ``(n,) int64`` arrays, ascending keys."""
        live = self._values != _GONE
        keys = np.concatenate([self._keys[live], np.fromiter(self._new, np.int64)])
        values = np.concatenate([self._values[live], np.fromiter(self._new.values(), np.int64)])
        order = np.argsort(keys, kind="stable")
        return keys[order], values[order]

    def held(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which of ``keys`` are held (binary searches and dict lookups)."""
        at = np.searchsorted(self._keys, keys)
        inside = at < len(self._keys)
        out = np.zeros(len(keys), np.bool_)
        out[inside] = (self._keys[at[inside]] == keys[inside]) & (self._values[at[inside]] != _GONE)
        if self._new:
            out |= np.fromiter((k in self._new for k in keys.tolist()), np.bool_, len(keys))
        return out

    def quoting(self, rids: Iterable[int]) -> list[int]:
        """The keys whose value is one of ``rids`` and which are not themselves in ``rids``."""
        wanted = np.fromiter(rids, np.int64)
        if not len(wanted):
            return []
        keys, values = self.arrays()
        hit = np.isin(values, wanted) & ~np.isin(keys, wanted)
        return [int(k) for k in keys[hit].tolist()]

    def _merge(self) -> None:
        self._keys, self._values = self.arrays()
        self._new = {}
        self._live = len(self._keys)
