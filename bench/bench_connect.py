"""Search over the Connect listener (JSON and binary) beside gRPC, in one interleaved run.

One ``lethe serve --embedder none --http-listen`` in its own process; one owner
of ``--records`` committed turns (20,000 by default: threads of 1,000, random
unit 256-d vectors the client sends, as ``bench/bench_scale.py`` builds its
owners). Then ``Retrieval.Search`` top 10 of that owner, two ways:

- ``dense``: a 256-d ``query_embedding`` (DENSE), the hot path of clients
  that embed on their side (the request is 1 KB in binary, 3.4 KB in JSON);
- ``lexical``: a ``query_text`` of three words (LEXICAL).

Each way over three transports: gRPC (grpcio's channel), Connect binary
(``application/proto``) and Connect JSON (``application/json``), both over
HTTP/1.1 on one kept-alive connection (``http.client``). Round by round
each transport runs a short batch of the same queries, the order rotated each
round, so all three see the same machine; the report gives p50 and p99 of
each, and the median over rounds of each round's p50 ratio to gRPC.

Client side: the Connect bodies are encoded once ahead (what is measured is
the transport and the server, not Python's JSON mapping on the client), and
each response is parsed (``FromString``; ``json.loads``); gRPC's stub encodes
and decodes in C.

Usage::

    .venv/bin/python bench/bench_connect.py                 # 20k records, about 2 minutes here
    .venv/bin/python bench/bench_connect.py --smoke --out /tmp/connect.json

Writes ``bench/results/connect.json`` (``--out``). The machine is shared and
noisy: quote the ratios of one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from _scale_data import random_unit
from _scale_report import machine_info
from _server import free_port, served
from google.protobuf import json_format

from lethe._rpc import Stubs
from lethe.v1 import common_pb2, retrieval_pb2, threads_pb2

OWNER = "bench"
TRANSPORTS = ("grpc", "connect_binary", "connect_json")
WORDS = ("puppy", "cello", "garden", "travel", "music", "recipe", "winter", "doctor", "lake")


def _log(message: str) -> None:
    print(message, flush=True)


def _ingest(stubs: Stubs, vectors: np.ndarray, per_thread: int) -> float:
    """Append ``vectors`` as committed turns of :data:`OWNER`; returns seconds."""
    started = time.perf_counter()
    pending: list[Any] = []
    for t, lo in enumerate(range(0, len(vectors), per_thread)):
        thread = stubs.threads.CreateThread(
            threads_pb2.CreateThreadRequest(parent=f"owners/{OWNER}", thread_id=f"t{t}"),
            metadata=stubs.md,
        )
        turns = [
            threads_pb2.TurnInput(
                role=common_pb2.USER,
                text=f"turn {i} about {WORDS[i % len(WORDS)]} and {WORDS[(i * 7) % len(WORDS)]}",
                commit=True,
                embedding=vectors[i].tolist(),
            )
            for i in range(lo, min(lo + per_thread, len(vectors)))
        ]
        request = threads_pb2.AppendTurnsRequest(parent=thread.name, turns=turns)
        pending.append(stubs.threads.AppendTurns.future(request, metadata=stubs.md, timeout=300))
        if len(pending) >= 4:
            pending.pop(0).result()
    for future in pending:
        future.result()
    return time.perf_counter() - started


def _requests(kind: str, n: int, seed: int) -> list[retrieval_pb2.SearchRequest]:
    parent = f"owners/{OWNER}"
    if kind == "dense":
        return [
            retrieval_pb2.SearchRequest(
                parent=parent,
                query_embedding=q.tolist(),
                top_k=10,
                mode=retrieval_pb2.SearchRequest.DENSE,
            )
            for q in random_unit(n, seed)
        ]
    rng = np.random.default_rng(seed)
    return [
        retrieval_pb2.SearchRequest(
            parent=parent,
            query_text=" ".join(str(w) for w in rng.choice(WORDS, 3, replace=False)),
            top_k=10,
            mode=retrieval_pb2.SearchRequest.LEXICAL,
        )
        for _ in range(n)
    ]


class ConnectCaller:
    """Unary Connect calls on one kept-alive HTTP/1.1 connection, bodies encoded ahead."""

    def __init__(self, port: int, token: str, codec: str) -> None:
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self._codec = codec
        self._headers = {
            "content-type": f"application/{codec}",
            "authorization": f"Bearer {token}",
            "x-lethe-owner": OWNER,
        }

    def encode(self, request: retrieval_pb2.SearchRequest) -> bytes:
        """The request's body in this caller's encoding."""
        if self._codec == "json":
            return json.dumps(json_format.MessageToDict(request)).encode()
        return request.SerializeToString()

    def search(self, body: bytes) -> int:
        """One Search; returns the number of hits."""
        self._conn.request("POST", "/lethe.v1.Retrieval/Search", body, self._headers)
        response = self._conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"Search over Connect failed: {response.status} {data[:300]!r}")
        if self._codec == "json":
            return len(json.loads(data).get("hits", []))
        return len(retrieval_pb2.SearchResponse.FromString(data).hits)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


def _searcher(caller: ConnectCaller, bodies: list[bytes]) -> Callable[[int], int]:
    """Search ``i``: the ``i``-th body through ``caller``."""
    return lambda i: caller.search(bodies[i])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(
    callers: dict[str, Callable[[int], int]], n_queries: int, rounds: int, batch: int
) -> dict[str, Any]:
    """Interleave ``callers`` round by round; latencies in ms and per-round ratios to gRPC."""
    latencies: dict[str, list[float]] = {name: [] for name in callers}
    round_p50: dict[str, list[float]] = {name: [] for name in callers}
    names = list(callers)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            call = callers[name]
            these = []
            for k in range(batch):
                i = (r * batch + k) % n_queries
                t0 = time.perf_counter()
                hits = call(i)
                these.append((time.perf_counter() - t0) * 1000)
                if hits != 10:
                    raise RuntimeError(f"{name}: {hits} hits, expected 10")
            latencies[name] += these
            round_p50[name].append(statistics.median(these))
    out: dict[str, Any] = {}
    for name in names:
        values = latencies[name]
        out[name] = {
            "calls": len(values),
            "p50_ms": round(statistics.median(values), 3),
            "p99_ms": round(_percentile(values, 0.99), 3),
        }
        if name != "grpc":
            ratios = [a / b for a, b in zip(round_p50[name], round_p50["grpc"], strict=True)]
            out[name]["p50_over_grpc"] = round(statistics.median(ratios), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=25, help="calls per transport per round")
    parser.add_argument("--warmup", type=int, default=200, help="calls per transport first")
    parser.add_argument("--smoke", action="store_true", help="seconds: 500 records, 4 rounds")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "connect.json"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.records, args.rounds, args.batch, args.warmup = 500, 4, 5, 10
    http_port = free_port()
    serve = ["--embedder", "none", "--metrics-listen", "off"]
    with served(*serve, "--http-listen", f"127.0.0.1:{http_port}") as (port, token):
        stubs = Stubs(grpc.insecure_channel(f"127.0.0.1:{port}"), token)
        try:
            _log(f"ingesting {args.records} records (256-d client vectors) ...")
            seconds = _ingest(stubs, random_unit(args.records, 1), per_thread=1000)
            _log(f"  {seconds:.1f} s")
            result: dict[str, Any] = {
                "machine": machine_info(),
                "config": {
                    "records": args.records,
                    "rounds": args.rounds,
                    "batch": args.batch,
                    "http": "HTTP/1.1, one kept-alive connection (http.client)",
                },
                "ingest_seconds": round(seconds, 2),
                "search": {},
            }
            connect = {
                "connect_binary": ConnectCaller(http_port, token, "proto"),
                "connect_json": ConnectCaller(http_port, token, "json"),
            }
            md = (*stubs.md, ("x-lethe-owner", OWNER))
            for kind in ("dense", "lexical"):
                requests = _requests(kind, 200, seed=2)
                bodies = {name: [c.encode(q) for q in requests] for name, c in connect.items()}

                def over_grpc(i: int, requests: list[Any] = requests) -> int:
                    return len(stubs.retrieval.Search(requests[i], metadata=md).hits)

                callers: dict[str, Callable[[int], int]] = {"grpc": over_grpc}
                for name, caller in connect.items():
                    callers[name] = _searcher(caller, bodies[name])
                measure(callers, len(requests), 1, args.warmup)
                _log(f"{kind}: {args.rounds} rounds of {args.batch} calls per transport ...")
                figures = measure(callers, len(requests), args.rounds, args.batch)
                figures["request_bytes"] = {
                    "grpc": len(requests[0].SerializeToString()),
                    **{name: len(b[0]) for name, b in bodies.items()},
                }
                result["search"][kind] = figures
                for name in TRANSPORTS:
                    f = figures[name]
                    ratio = f" ({f['p50_over_grpc']:.2f}x gRPC)" if "p50_over_grpc" in f else ""
                    _log(f"  {name:15s} p50 {f['p50_ms']:.2f} ms  p99 {f['p99_ms']:.2f} ms{ratio}")
            for caller in connect.values():
                caller.close()
        finally:
            stubs.channel.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
