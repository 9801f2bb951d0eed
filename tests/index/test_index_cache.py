"""Tests for index.IndexCache."""

import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from index import IndexCache, VectorIndex, release_free_heap


def _index_of(size: int) -> VectorIndex:
    ix = VectorIndex(4)
    if size:
        ix.add(np.arange(size), np.random.default_rng(size).normal(size=(size, 4)))
    return ix


def test_get_or_build_builds_once_under_concurrent_first_use() -> None:
    cache: IndexCache[VectorIndex] = IndexCache(capacity=4)
    calls = 0
    calls_lock = threading.Lock()
    start = threading.Barrier(8)
    results: list[VectorIndex] = []

    def build() -> VectorIndex:
        nonlocal calls
        with calls_lock:
            calls += 1
        time.sleep(0.05)  # hold the build open while the other threads arrive
        return _index_of(3)

    def worker() -> None:
        start.wait()
        results.append(cache.get_or_build("owner/a", build))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert calls == 1
    assert len(results) == 8
    assert all(r is results[0] for r in results)
    assert cache.get("owner/a") is results[0]
    assert cache.get_or_build("owner/a", build) is results[0]
    assert calls == 1


def test_lru_evicts_least_recently_used_at_capacity() -> None:
    cache: IndexCache[VectorIndex] = IndexCache(capacity=2)
    a = cache.get_or_build("a", lambda: _index_of(1))
    cache.get_or_build("b", lambda: _index_of(1))
    assert cache.get("a") is a  # "b" is now least recently used
    cache.get_or_build("c", lambda: _index_of(1))
    assert cache.keys() == ["a", "c"]
    assert cache.get("b") is None
    assert len(cache) == 2


def test_evicted_index_keeps_working_for_its_holder() -> None:
    cache: IndexCache[VectorIndex] = IndexCache(capacity=1)
    held = cache.get_or_build("a", lambda: _index_of(5))
    cache.get_or_build("b", lambda: _index_of(1))
    assert cache.get("a") is None
    assert held.search(np.ones(4), k=10) != []
    rebuilt = cache.get_or_build("a", lambda: _index_of(2))
    assert rebuilt is not held
    assert len(rebuilt) == 2


def test_evict_prefix_drops_owner_and_its_threads() -> None:
    cache: IndexCache[VectorIndex] = IndexCache()
    for key in ["owner/1", "owner/1/thread/a", "owner/1/thread/b", "owner/2"]:
        cache.get_or_build(key, lambda: _index_of(1))
    assert cache.evict_prefix("owner/1") == 3
    assert cache.keys() == ["owner/2"]
    assert cache.evict_prefix("owner/9") == 0


def test_evict_single_key() -> None:
    cache: IndexCache[VectorIndex] = IndexCache()
    cache.get_or_build("k", lambda: _index_of(1))
    assert cache.evict("k") is True
    assert cache.evict("k") is False
    assert cache.get("k") is None


def test_total_vectors_sums_cached_indexes() -> None:
    cache: IndexCache[VectorIndex] = IndexCache()
    cache.get_or_build("a", lambda: _index_of(3))
    cache.get_or_build("b", lambda: _index_of(4))
    assert cache.total_vectors() == 7
    cache.evict("a")
    assert cache.total_vectors() == 4


def test_failed_build_caches_nothing_and_next_caller_retries() -> None:
    cache: IndexCache[VectorIndex] = IndexCache()

    def broken() -> VectorIndex:
        raise RuntimeError("store unavailable")

    with pytest.raises(RuntimeError, match="store unavailable"):
        cache.get_or_build("a", broken)
    assert cache.get("a") is None
    assert len(cache.get_or_build("a", lambda: _index_of(2))) == 2


def test_eviction_during_build_causes_rebuild() -> None:
    cache: IndexCache[VectorIndex] = IndexCache()
    building = threading.Event()
    release = threading.Event()
    sizes = iter([1, 2])

    def build() -> VectorIndex:
        building.set()
        release.wait(timeout=10)
        return _index_of(next(sizes))

    result: list[VectorIndex] = []
    t = threading.Thread(target=lambda: result.append(cache.get_or_build("owner/1", build)))
    t.start()
    assert building.wait(timeout=10)
    assert cache.evict_prefix("owner/") == 0  # nothing cached yet; the build is marked stale
    release.set()
    t.join(timeout=10)
    assert len(result[0]) == 2  # the second build, started after the eviction
    assert cache.get("owner/1") is result[0]


def test_capacity_below_one_fails() -> None:
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        IndexCache(capacity=0)


def test_byte_bound_evicts_least_recent_but_never_the_newest() -> None:
    one = _index_of(10).nbytes()
    assert one > 10 * 4 * 8  # rows of d floats at least
    cache: IndexCache[VectorIndex] = IndexCache(capacity=10, max_bytes=int(2.5 * one))
    for key in ("a", "b"):
        cache.get_or_build(key, lambda: _index_of(10))
    cache.get("a")  # b is now least recent
    cache.get_or_build("c", lambda: _index_of(10))
    assert cache.keys() == ["a", "c"]
    assert cache.evicted_for_bytes == 1
    assert cache.total_bytes() == 2 * one
    big = cache.get_or_build("huge", lambda: _index_of(100))  # alone above the bound
    assert cache.keys() == ["huge"]
    assert len(big) == 100


def test_trim_enforces_the_byte_bound_after_growth_in_place() -> None:
    cache: IndexCache[VectorIndex] = IndexCache(max_bytes=3 * _index_of(10).nbytes())
    cache.get_or_build("a", lambda: _index_of(10))
    cache.get_or_build("b", lambda: _index_of(10))
    cache.trim()
    assert cache.keys() == ["a", "b"]
    grown = cache.get("b")
    assert grown is not None
    grown.add(np.arange(100, 120), np.ones((20, grown.dim), dtype=np.float32))
    cache.trim()
    assert cache.keys() == ["b"]


def test_max_bytes_below_one_fails() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        IndexCache(max_bytes=0)


def _rss_anon() -> int:
    """This process's anonymous resident memory, bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc" or not Path("/proc/self/status").exists(),
    reason="malloc_trim is glibc's; RssAnon is Linux's",
)
def test_release_free_heap_returns_freed_heap_pages_to_the_os() -> None:
    # 2 KiB blocks come from the malloc heap (below its mmap threshold); keeping
    # one in 64 alive pins the heap's top, so free() alone returns almost nothing.
    blocks = [bytes(2048) for _ in range(64 * 1024)]  # 128 MiB
    kept = blocks[::64]
    del blocks
    before = _rss_anon()
    assert release_free_heap() is True
    after = _rss_anon()
    assert before - after > 64 * 2**20, (before, after)
    assert len(kept) == 1024


_HEAP_GROWTH = """
import ctypes, sys
import numpy as np
from index import fix_mmap_threshold
class MI(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MI
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold()
big = np.ones(1 << 21)  # 16 MiB, mapped; freeing it raises glibc's threshold unless fixed
del big
before = libc.mallinfo2().arena
kept = np.ones(1 << 20)  # 8 MiB
print(libc.mallinfo2().arena - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt")
def test_fix_mmap_threshold_keeps_large_arrays_out_of_the_heap() -> None:
    """Without it an 8 MiB array freed after a 16 MiB one lands in the heap; with it, mapped."""
    grown = {}
    for how in ("dynamic", "fixed"):
        out = subprocess.run(
            [sys.executable, "-c", _HEAP_GROWTH, how], capture_output=True, text=True, check=True
        )
        grown[how] = int(out.stdout)
    assert grown["dynamic"] >= 4 << 20, grown
    assert grown["fixed"] < 1 << 20, grown
