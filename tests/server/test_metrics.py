"""The gauges an operator alerts on report what they say (API.md, "Metrics"):
``lethe_pending_records`` / ``lethe_oldest_pending_age_seconds`` cover pending
records of every kind, the oldest by when it was stored."""

from __future__ import annotations

import time

from _helpers import append, create_thread
from conftest import Lethe

from lethe.v1 import memories_pb2


def _seconds(ts: object) -> float:
    return float(ts.seconds) + float(ts.nanos) / 1e9  # type: ignore[attr-defined]


def _gauge(lethe: Lethe, name: str) -> float:
    assert lethe.server is not None
    lethe.server.lifecycle.refresh_gauges()
    value = lethe.server.metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


def test_oldest_pending_age_counts_pending_memories(lethe: Lethe) -> None:
    """It read 0 while pending memories were minutes old: only a turn at the
    head of the expiry queue was looked at."""
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    append(c, thread, ["committed turn"], commit=True)
    memory = c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent="owners/alice",
            memory=memories_pb2.Memory(kind=memories_pb2.Memory.FACT, text="x"),
        ),
        metadata=c.md,
    )
    assert lethe.server is not None
    later = time.time() + 300.0
    count, age = lethe.server.store.pending_stats(later)
    assert count == 1
    assert abs(age - (later - _seconds(memory.create_time))) < 0.01
    assert _gauge(lethe, "lethe_oldest_pending_age_seconds") > 0.0
    assert _gauge(lethe, "lethe_pending_records") == 1.0


def test_oldest_pending_age_is_the_oldest_not_the_soonest_to_expire(lethe: Lethe) -> None:
    """A long-lived pending turn stored first, a short-lived one a second later:
    the age is the first one's, although the second expires sooner."""
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    (old,) = append(c, thread, ["stored first, kept 72 h"])
    time.sleep(1.0)
    append(c, thread, ["stored later, kept 1 h"], ttl=3600.0)
    assert lethe.server is not None
    later = time.time() + 300.0
    count, age = lethe.server.store.pending_stats(later)
    assert count == 2
    assert abs(age - (later - _seconds(old.create_time))) < 0.01


def test_no_pending_record_is_age_zero(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    append(c, thread, ["committed"], commit=True)
    assert lethe.server is not None
    assert lethe.server.store.pending_stats(time.time() + 60.0) == (0, 0.0)
