"""What a unary call costs a server before any work: gRPC's floors, and Lethe's empty search.

Four servers answer ``lethe.v1.Retrieval/Search``, one at a time, to one
client calling in sequence (one call in flight, so nothing contends):

- ``sync``: grpc's thread-pool server (``grpc.server``, 16 threads, as
  ``bench/minimal_server.py``) whose handler returns an empty reply;
- ``aio``: a ``grpc.aio`` server whose handler returns it on the event loop;
- ``aio+hop``: the same, the reply made on a thread of a 16-thread pool and
  awaited (``loop.run_in_executor``), the hop Lethe's unary calls take from
  the event loop to a worker and back;
- ``lethe``: ``lethe serve`` answering a DENSE search of an owner that holds
  nothing (authentication, admission, routing, decoding and validation of
  the request, the hop, the reply: everything but the search).

Each server runs in its own process; per server, the median latency seen by
the client and the server's CPU time per call (user + system of the whole
process, ``/proc/PID/stat``), over ``--calls`` calls after 300 to warm up;
servers interleaved over ``--rounds`` rounds, medians over rounds. For
``lethe``, the CPU split by thread too (``_scale_procs.cpu_by_thread``).

Writes ``bench/results/rpc-floors[-smoke].{json,md}``::

    .venv/bin/python bench/bench_rpc_floors.py            # 3 rounds of 3,000 calls
    .venv/bin/python bench/bench_rpc_floors.py --smoke    # seconds; proves it runs

The machine is shared and noisy: compare figures within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path
from statistics import median
from typing import Any

import grpc
from _scale_procs import LetheProcess, cpu_by_thread, cpu_seconds
from _scale_report import machine_info, write_report

from lethe.v1 import retrieval_pb2, retrieval_pb2_grpc

BENCH = Path(__file__).resolve().parent
FLOORS = ("sync", "aio", "aio+hop")
"""The framework floors, served by this script itself (``--serve KIND``)."""
POOL_THREADS = 16
"""Threads of the floors' pools, as Lethe's default ``--workers``."""


def _handlers(handler: Any) -> grpc.GenericRpcHandler[Any, Any]:
    return grpc.method_handlers_generic_handler(
        "lethe.v1.Retrieval", {"Search": grpc.unary_unary_rpc_method_handler(handler)}
    )


def serve(kind: str) -> None:
    """Serve one floor on a free loopback port; prints the port, then serves until killed.

    Requests are not decoded (the handler takes the raw bytes, as Lethe's
    generic handlers do) and every reply is an empty ``SearchResponse``.
    """
    reply = retrieval_pb2.SearchResponse().SerializeToString()
    if kind == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(POOL_THREADS))
        server.add_generic_rpc_handlers((_handlers(lambda raw, context: reply),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        print(port, flush=True)
        server.wait_for_termination()
        return
    pool = futures.ThreadPoolExecutor(POOL_THREADS)

    async def on_loop(raw: bytes, context: Any) -> bytes:
        return reply

    async def hop(raw: bytes, context: Any) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(pool, lambda: reply)

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handlers(on_loop if kind == "aio" else hop),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def _measure_pid(pid: int, address: str, token: str, calls: int) -> dict[str, Any]:
    """Sequential searches of an empty owner on one connection, after 300 to warm up.

    Returns:
        ``p50_ms`` (client latency), ``cpu_ms`` (process ``pid``'s CPU time per
        call) and ``cpu_ms_by_thread`` (the same by thread name).
    """
    metadata = (("authorization", f"Bearer {token}"),)
    request = retrieval_pb2.SearchRequest(
        parent="owners/nobody",
        query_embedding=[0.0625] * 256,
        top_k=10,
        mode=retrieval_pb2.SearchRequest.DENSE,
    )
    latencies = []
    with grpc.insecure_channel(address) as channel:
        stub = retrieval_pb2_grpc.RetrievalStub(channel)
        for _ in range(300):
            stub.Search(request, metadata=metadata, timeout=60)
        cpu0, threads0 = cpu_seconds(pid), cpu_by_thread(pid)
        for _ in range(calls):
            t0 = time.perf_counter()
            stub.Search(request, metadata=metadata, timeout=60)
            latencies.append(time.perf_counter() - t0)
        cpu1, threads1 = cpu_seconds(pid), cpu_by_thread(pid)
    per = 1e3 / calls
    return {
        "p50_ms": median(latencies) * 1e3,
        "cpu_ms": (cpu1 - cpu0) * per,
        "cpu_ms_by_thread": {
            name: round((seconds - threads0.get(name, 0.0)) * per, 3)
            for name, seconds in sorted(threads1.items())
            if seconds - threads0.get(name, 0.0) > 0
        },
    }


def _measure_floor(kind: str, calls: int) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        return _measure_pid(proc.pid, f"127.0.0.1:{port}", "-", calls)
    finally:
        proc.kill()
        proc.wait()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The rounds (module docstring); the report without the machine."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in (*FLOORS, "lethe")}
    lethe = LetheProcess([])
    try:
        lethe.start()
        for r in range(args.rounds):
            for kind in FLOORS:
                runs[kind].append(_measure_floor(kind, args.calls))
            runs["lethe"].append(_measure_pid(lethe.pid, lethe.address, lethe.token, args.calls))
            print(
                f"round {r + 1}: "
                + ", ".join(
                    f"{name} p50 {runs[name][-1]['p50_ms']:.3f} ms "
                    f"cpu {runs[name][-1]['cpu_ms']:.3f} ms"
                    for name in runs
                ),
                flush=True,
            )
    finally:
        lethe.close()
    floor = median(x["cpu_ms"] for x in runs["aio"])
    table = [
        {
            "server": name,
            "p50_ms": round(median(x["p50_ms"] for x in runs[name]), 3),
            "cpu_ms_per_call": round(median(x["cpu_ms"] for x in runs[name]), 3),
            "cpu_ratio_to_aio": round(median(x["cpu_ms"] for x in runs[name]) / floor, 3),
        }
        for name in runs
    ]
    split_names = sorted({n for x in runs["lethe"] for n in x["cpu_ms_by_thread"]})
    lethe_split = {
        n: round(median(x["cpu_ms_by_thread"].get(n, 0.0) for x in runs["lethe"]), 3)
        for n in split_names
    }
    return {
        "calls": args.calls,
        "rounds": args.rounds,
        "table": table,
        "lethe_cpu_ms_by_thread": lethe_split,
        "runs": runs,
    }


def _markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# What a unary call costs the server before any work",
        "",
        f"One client, calls in sequence; medians of {report['rounds']} interleaved rounds of "
        f"{report['calls']} calls. Machine: {m.get('cpu_count')} CPUs, load average at start "
        f"{m.get('loadavg_start')}.",
        "",
        "| server | p50 ms | server CPU ms/call | CPU / aio |",
        "|---|---:|---:|---:|",
    ]
    for row in report["table"]:
        lines.append(
            f"| {row['server']} | {row['p50_ms']:.3f} | {row['cpu_ms_per_call']:.3f} | "
            f"{row['cpu_ratio_to_aio']:.2f}x |"
        )
    split = ", ".join(f"{n} {ms:.3f}" for n, ms in report["lethe_cpu_ms_by_thread"].items())
    lines += ["", f"Lethe's CPU per call by thread (ms): {split}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its results (or serve one floor with ``--serve``); 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=FLOORS, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="seconds: 500 calls, 1 round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    if args.smoke:
        args.calls, args.rounds = 500, 1
    report = {"machine": machine_info(), **measure(args)}
    name = "rpc-floors-smoke" if args.smoke else "rpc-floors"
    out = args.out or BENCH / "results" / f"{name}.json"
    write_report(out, report, _markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
