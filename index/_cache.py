"""An LRU of in-memory indexes keyed by string, bounded by count and by bytes.

The server keys an owner's index and each thread's pending-turn index here; this
module does not interpret keys beyond :meth:`IndexCache.evict_prefix`.

Threads: any thread may call any method. One lock guards the LRU order and is never
held while an index is built; builds are serialised per key, so concurrent first use
of a key calls ``build`` once and every caller receives the same index.

The byte bound uses each entry's own ``nbytes()`` estimate. Entries grow after
they are cached (the server adds to a loaded owner's index on every write), so
the bound is enforced when an entry is added and whenever the owner of the
cache calls :meth:`IndexCache.trim`; the most recently used entry is never
evicted for bytes, so an owner larger than the whole bound is still served
(alone).

Eviction only drops the cache's reference: a caller already holding an index keeps
using it (searches in progress finish against it). An :meth:`IndexCache.evict` or
:meth:`IndexCache.evict_prefix` that matches a key whose build is in progress marks
that build stale; the builder then builds again instead of caching an index that may
predate the change that caused the eviction (for example a forget).
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class _Sized(Protocol):
    def __len__(self) -> int: ...

    def nbytes(self) -> int: ...


T = TypeVar("T", bound=_Sized)

__all__ = ["MMAP_THRESHOLD", "IndexCache", "fix_mmap_threshold", "release_free_heap"]


def release_free_heap() -> bool:
    """Hand the C heap's free pages back to the operating system (glibc's ``malloc_trim(0)``).

    ``malloc_trim(0)`` also releases free pages inside the heap, not only at its top.

    An index build allocates several times what the index keeps (the decrypted
    texts, their terms, BM25's intermediate arrays); glibc keeps what was freed
    for reuse, so the process's resident set stayed near the build's peak. On a
    20k-turn owner (LoCoMo text, d=256) one call after the build took 2-3 ms and
    lowered the anonymous resident set it added by 20 MiB (110 -> 90 MiB), and
    by 31 MiB (48 -> 17) for a second owner built in the same process.

    Returns:
        True if the C library has ``malloc_trim`` (glibc), False elsewhere (the
        call is then a no-op).
    """
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True


MMAP_THRESHOLD = 1 << 20
"""Bytes from which a serving process's C heap gives each allocation its own mapping."""
_M_MMAP_THRESHOLD = -3  # mallopt(3) parameter number (glibc's malloc.h)


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation of ``nbytes`` or more from a mapping of its own (glibc ``mallopt``).

    glibc's threshold starts at 128 KiB and rises to the size of any mapped
    block freed (up to 32 MiB), so after the first large array is freed the
    later ones (a build's temporaries, a snapshot's copies, FAISS's rows) come
    from the heaps of the threads that made them, where what is freed stays
    behind the live objects around it. Fixed, a freed large array goes back to
    the operating system at once. Measured with ``bench/bench_restart.py``'s
    100k owner: the resident set after a cold build and its snapshot save
    3.50x -> 3.14x the raw vectors, loaded from the snapshot 2.77x -> 2.58x; at
    1 MiB no change in searches a second at 20k (interleaved
    ``bench/bench_processes.py --processes 1`` runs; at 256 KiB, 6 % fewer).
    Call it before the process starts its threads.

    Returns:
        True if it was set (glibc), False elsewhere (a no-op).
    """
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, nbytes))


try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None)
except OSError:  # pragma: no cover - platforms without dlopen(NULL)
    _LIBC = None


@dataclass
class _Build:
    """State of one key's in-flight build."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0
    stale: bool = False


class IndexCache(Generic[T]):
    """Least-recently-used cache of indexes by string key.

    An entry is a :class:`VectorIndex`, or any sized bundle of indexes with an
    ``nbytes()`` estimate.

    Args:
        capacity: Maximum number of indexes held (not vectors), ``>= 1``.
        max_bytes: Maximum of the summed ``nbytes()`` of the entries, bytes, or
            None for no byte bound (see the module docstring for when it applies).

    Raises:
        ValueError: ``capacity < 1`` or ``max_bytes < 1``.
    """

    def __init__(self, capacity: int = 256, max_bytes: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self._capacity = capacity
        self._max_bytes = max_bytes
        self.evicted_for_bytes = 0
        """How many entries the byte bound evicted (for metrics and tests)."""
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, T] = OrderedDict()
        self._builds: dict[str, _Build] = {}

    @property
    def capacity(self) -> int:
        """Maximum number of indexes held."""
        return self._capacity

    @property
    def max_bytes(self) -> int | None:
        """The byte bound, or None."""
        return self._max_bytes

    def _bound(self) -> None:
        """Evict least recently used entries past the count, then past the byte bound.

        Never evicts the most recent entry. Caller holds ``self._lock``.
        """
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        if self._max_bytes is None or len(self._entries) < 2:
            return
        sizes = {key: ix.nbytes() for key, ix in self._entries.items()}
        total = sum(sizes.values())
        while total > self._max_bytes and len(self._entries) > 1:
            key, _ = self._entries.popitem(last=False)
            total -= sizes[key]
            self.evicted_for_bytes += 1

    def trim(self) -> None:
        """Enforce the byte bound now (call after entries grew in place)."""
        with self._lock:
            self._bound()

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

    def peek(self, key: str) -> T | None:
        """Return the cached index for ``key`` without marking it used (``None`` if absent)."""
        with self._lock:
            return self._entries.get(key)

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
                        self._bound()
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

    def total_bytes(self) -> int:
        """Sum of ``nbytes()`` over the cached indexes (a point-in-time estimate)."""
        with self._lock:
            held = list(self._entries.values())
        return sum(ix.nbytes() for ix in held)

    def __len__(self) -> int:
        """Number of cached indexes."""
        with self._lock:
            return len(self._entries)

    def __repr__(self) -> str:
        return (
            f"IndexCache(capacity={self._capacity}, max_bytes={self._max_bytes}, size={len(self)})"
        )
