"""Prometheus metrics (API.md, "Metrics"), on their own registry so a test
can run several servers in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Seconds; finer than Prometheus' defaults below 5 ms, where this server's RPCs live.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.0035,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Metrics:
    """The server's metrics; names and meanings from API.md."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rpc_duration = Histogram(
            "lethe_rpc_duration_seconds",
            "Server-side time per RPC, seconds.",
            ["method", "code"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.deletion_latency = Histogram(
            "lethe_deletion_latency_seconds",
            "From a forget (or expiry) request to keys destroyed and every destination done.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.outstanding_deletions = Gauge(
            "lethe_outstanding_deletions",
            "Deletion-log entries with a destination not yet done.",
            registry=self.registry,
        )
        self.pending_records = Gauge(
            "lethe_pending_records", "Pending turns waiting for a decision.", registry=self.registry
        )
        self.oldest_pending_age = Gauge(
            "lethe_oldest_pending_age_seconds",
            "Age of the oldest pending turn, seconds.",
            registry=self.registry,
        )
        self.index_vectors = Gauge(
            "lethe_index_vectors", "Vectors held in FAISS, all owners.", registry=self.registry
        )
        self.orphan_derivatives = Gauge(
            "lethe_orphan_derivatives",
            "Derivatives with a missing source, from the periodic audit (must stay 0).",
            registry=self.registry,
        )
        self.stale_summaries = Gauge(
            "lethe_stale_summaries",
            "Summaries older than their thread's last deletion, from the periodic audit.",
            registry=self.registry,
        )
        self.overdue_commitments = Gauge(
            "lethe_overdue_commitments",
            "Open commitments past their due time.",
            registry=self.registry,
        )
        self.shred_horizon = Gauge(
            "lethe_shred_horizon_seconds",
            "How long a destroyed key may still exist in free pages or keystore snapshots "
            "(age of the oldest shred not yet completed by rotation).",
            registry=self.registry,
        )
        self.keystore_keys = Gauge(
            "lethe_keystore_keys", "Live wrapped keys.", registry=self.registry
        )
        self.inflight_calls = Gauge(
            "lethe_inflight_calls",
            "Unary calls admitted and not finished (running on a worker or waiting for one).",
            registry=self.registry,
        )
        self.queued_calls = Gauge(
            "lethe_queued_calls",
            "Admitted calls waiting for a worker thread.",
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "lethe_open_streams", "Open server streams (Events.Watch).", registry=self.registry
        )
        self.refused_calls = Counter(
            "lethe_refused_calls",
            "Calls and streams refused at once: TOO_MANY_REQUESTS, TOO_MANY_STREAMS, DRAINING.",
            ["reason"],
            registry=self.registry,
        )
        self.lmdb_readers = Gauge(
            "lethe_lmdb_readers",
            "Reader slots of the data environment in use (read transactions open now).",
            registry=self.registry,
        )
