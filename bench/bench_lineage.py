"""Deletion latency of a record with 100 descendants, from the server and the client, in one run.

The server's figure comes from its ``lethe_deletion_latency_seconds`` histogram.

Starts ``lethe serve`` in its own process (``--embedder none``: the cascade,
not embedding, is measured), then ``--rounds`` times: appends a committed
source turn, derives 100 memories from it (50 directly, 50 from those), and
forgets the source. Prints p50/p99 of the client-side ``Forget`` latency and
the histogram's p50/p99 (linear interpolation inside buckets, as PromQL's
``histogram_quantile``), with an empty gRPC call measured as the floor::

    .venv/bin/python bench/bench_lineage.py [--rounds 30] [--descendants 100]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
from _server import free_port, served
from grpc_health.v1 import health_pb2

from lethe.client import Client
from lethe.v1 import common_pb2, memories_pb2, threads_pb2


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """PromQL-style quantile from cumulative ``(upper bound, count)`` buckets."""
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            span = count - prev_count
            return prev_bound + (bound - prev_bound) * ((rank - prev_count) / span if span else 0)
        prev_bound, prev_count = bound, count
    return prev_bound


def _scrape(port: int) -> list[tuple[float, float]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = []
    for line in text.splitlines():
        if line.startswith("lethe_deletion_latency_seconds_bucket"):
            bound = line.split('le="')[1].split('"')[0]
            out.append((float("inf") if bound == "+Inf" else float(bound), float(line.split()[-1])))
    return out


def main() -> int:
    """Run the rounds, print the figures and write them to ``--out`` (JSON).

    Returns:
        The exit status, 0.

    Raises:
        AssertionError: a ``Forget`` cascaded to other than ``--descendants`` records.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--descendants", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("bench-lineage.json"))
    args = parser.parse_args()
    metrics_port = free_port()
    with (
        served("--metrics-listen", f"127.0.0.1:{metrics_port}", "--embedder", "none") as (
            port,
            token,
        ),
        Client(f"127.0.0.1:{port}", token) as api,
    ):
        health = api.stubs.health
        api.create_thread("owners/bench", thread_id="t")
        client: list[float] = []
        half = args.descendants // 2
        for r in range(args.rounds):
            source = api.append_turns(
                "owners/bench/threads/t",
                [
                    threads_pb2.TurnInput(
                        role=common_pb2.USER,
                        text=f"source {r}",
                        commit=True,
                        embedding=[1.0, 0.0, 0.5],
                    )
                ],
            ).turns[0]
            first: list[tuple[str, int]] = []
            for i in range(args.descendants):
                parent = (source.name, 1) if i < half else first[i % len(first)]
                created = api.create_memory(
                    "owners/bench",
                    memories_pb2.Memory(
                        kind=memories_pb2.Memory.FACT,
                        text=f"derived {r}.{i}",
                        sources=[common_pb2.SourceRef(name=parent[0], version=parent[1])],
                        state=common_pb2.COMMITTED,
                        embedding=[0.0, 1.0, float(i)],
                    ),
                )
                if i < half:
                    first.append((created.name, created.version))
            t0 = time.perf_counter()
            receipt = api.forget([source.name])
            client.append(time.perf_counter() - t0)
            assert receipt.cascaded == args.descendants, receipt.cascaded
        empty = []
        for _ in range(300):
            t0 = time.perf_counter()
            health.Check(health_pb2.HealthCheckRequest())
            empty.append(time.perf_counter() - t0)
        buckets = _scrape(metrics_port)
        result = {
            "rounds": args.rounds,
            "descendants": args.descendants,
            "forget_client_p50_ms": round(float(np.percentile(client, 50)) * 1e3, 3),
            "forget_client_p99_ms": round(float(np.percentile(client, 99)) * 1e3, 3),
            "deletion_latency_histogram_p50_ms": round(histogram_quantile(0.5, buckets) * 1e3, 3),
            "deletion_latency_histogram_p99_ms": round(histogram_quantile(0.99, buckets) * 1e3, 3),
            "empty_grpc_call_p50_ms": round(float(np.percentile(empty, 50)) * 1e3, 3),
        }
        for key, value in result.items():
            print(f"{key:40} {value}")
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
