"""An LRU of in-memory vector indexes keyed by string.

The server keys an owner's index and each thread's pending-turn index here; this
module does not interpret keys beyond :meth:`IndexCache.evict_prefix`.

Threads: any thread may call any method. One lock guards the LRU order and is never
held while an index is built; builds are serialised per key, so concurrent first use
of a key calls ``build`` once and every caller receives the same index.

Eviction only drops the cache's reference: a caller already holding an index keeps
using it (searches in progress finish against it). An :meth:`IndexCache.evict` or
:meth:`IndexCache.evict_prefix` that matches a key whose build is in progress marks
that build stale; the builder then builds again instead of caching an index that may
predate the change that caused the eviction (for example a forget).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class _Sized(Protocol):
    def __len__(self) -> int: ...


T = TypeVar("T", bound=_Sized)

__all__ = ["IndexCache"]


@dataclass
class _Build:
    """State of one key's in-flight build."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0
    stale: bool = False


class IndexCache(Generic[T]):
    """Least-recently-used cache of indexes (:class:`VectorIndex`, or any sized
    bundle of indexes) by string key.

    Args:
        capacity: Maximum number of indexes held (not vectors), ``>= 1``.

    Raises:
        ValueError: ``capacity < 1``.
    """

    def __init__(self, capacity: int = 256) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, T] = OrderedDict()
        self._builds: dict[str, _Build] = {}

    @property
    def capacity(self) -> int:
        """Maximum number of indexes held."""
        return self._capacity

    def get(self, key: str) -> T | None:
        """Return the cached index for ``key`` and mark it most recently used.

        Args:
            key: Cache key.

        Returns:
            The index, or ``None`` if ``key`` is not cached.
        """
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def get_or_build(self, key: str, build: Callable[[], T]) -> T:
        """Return the cached index for ``key``, building and caching it if absent.

        ``build`` runs at most once per key while the key stays cached, even when many
        threads ask at once: the others wait and receive the same object. It runs again
        if the key was evicted while building (see the module docstring), or for the
        next caller if it raised.

        Args:
            key: Cache key.
            build: Makes the index; called without any cache-wide lock held.

        Returns:
            The cached index, most recently used.

        Raises:
            Exception: Whatever ``build`` raises, unchanged; nothing is cached.
        """
        found = self.get(key)
        if found is not None:
            return found
        with self._lock:
            pending = self._builds.setdefault(key, _Build())
            pending.users += 1
        try:
            with pending.lock:
                while True:
                    with self._lock:
                        found = self._entries.get(key)
                        if found is not None:
                            self._entries.move_to_end(key)
                            return found
                        pending.stale = False
                    built = build()
                    with self._lock:
                        if pending.stale:
                            continue
                        self._entries[key] = built
                        self._entries.move_to_end(key)
                        while len(self._entries) > self._capacity:
                            self._entries.popitem(last=False)
                        return built
        finally:
            with self._lock:
                pending.users -= 1
                if pending.users == 0:
                    del self._builds[key]

    def evict(self, key: str) -> bool:
        """Drop ``key`` from the cache and mark an in-flight build of it stale.

        Args:
            key: Cache key.

        Returns:
            Whether a cached index was dropped.
        """
        with self._lock:
            pending = self._builds.get(key)
            if pending is not None:
                pending.stale = True
            return self._entries.pop(key, None) is not None

    def evict_prefix(self, prefix: str) -> int:
        """Drop every key starting with ``prefix`` and mark their in-flight builds stale.

        Args:
            prefix: Key prefix; ``""`` matches every key.

        Returns:
            The number of cached indexes dropped.
        """
        with self._lock:
            for key, pending in self._builds.items():
                if key.startswith(prefix):
                    pending.stale = True
            doomed = [key for key in self._entries if key.startswith(prefix)]
            for key in doomed:
                del self._entries[key]
            return len(doomed)

    def keys(self) -> list[str]:
        """Cached keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def total_vectors(self) -> int:
        """Sum of ``len()`` over the cached indexes (a point-in-time estimate)."""
        with self._lock:
            held = list(self._entries.values())
        return sum(len(ix) for ix in held)

    def __len__(self) -> int:
        """Number of cached indexes."""
        with self._lock:
            return len(self._entries)

    def __repr__(self) -> str:
        return f"IndexCache(capacity={self._capacity}, size={len(self)})"
