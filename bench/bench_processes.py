"""Searches a second with ``lethe serve --processes N``, against one process, in the same run.

One owner of ``--records`` committed turns (LoCoMo-derived texts, random unit
256-d vectors sent by the client: ``--embedder none``) in one data directory.
Then, in rounds, for each process count of ``--processes`` (interleaved, so
every count meets the same noise): the group is started on that data (its
index snapshot, written at the previous stop, loads in each process), every
process's indexes are warmed and its start-up audit has finished (the
steady state: ``_scale_procs.wait_quiet``; ``--during-audit`` measures inside it
instead), and ``--clients`` client *processes* (each its
own connection, so the kernel spreads them over the group) search in a closed
loop for ``--seconds`` (DENSE, top 10, like ``bench_scale``). Per count:
searches a second (all calls over the wall span), p50 and p99 latency, and the
resident set of the serving processes together after the run; the medians over
rounds and their ratios to the first count (the floor: one process).

Then, for the largest count, a member is SIGKILLed: the supervisor starts the
group again (recovery in the new primary first) and ``kill_to_first_search_s``
is the time from the kill until a new connection's search of the owner
answers (``--records`` decides the owner's size: the warm snapshot load).

Last, ``join_to_first_search_s``: with that group running, SIGTTIN makes the
supervisor start one more member beside the others (no restart, no recovery);
new connections search until one lands on the new member (told from
``/proc``: the only process that then holds a connection it did not hold
before), whose first search of the owner loads it from its index snapshot.
Timed from the signal to that answer, with the spawn-to-ready part apart.

Writes ``bench/results/processes[-smoke].{json,md}``::

    .venv/bin/python bench/bench_processes.py                      # 20k, 1 and 2 processes
    .venv/bin/python bench/bench_processes.py --processes 1,2,4,8,16   # on a larger machine
    .venv/bin/python bench/bench_processes.py --smoke              # seconds; proves it runs

The machine is shared and noisy: quote medians and ratios from one run, with
the load average (``machine``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from _scale_data import load_corpus, random_unit, varied_texts
from _scale_procs import (
    CallBatch,
    ClientPool,
    LetheProcess,
    cpu_by_thread,
    cpu_seconds,
    machine_cpu,
    memory_of,
    wait_quiet,
)
from _scale_report import machine_info, write_report
from bench_restart import OWNER, _ingest, _log

from lethe._rpc import Stubs
from lethe.v1 import retrieval_pb2

BENCH = Path(__file__).resolve().parent


def _members(proc: LetheProcess) -> list[int]:
    """The serving processes: the supervisor's members, or the one process."""
    text = proc.log.read_text(errors="replace")
    line = text[text.rfind("lethe serving") :].splitlines()[0]
    listed = line.partition("processes: ")[2].rstrip().rstrip(")")
    return [int(p) for p in listed.split(", ")] if listed else [proc.pid]


def _search_once(address: str, token: str, vector: np.ndarray) -> float:
    """One search on a connection of its own; seconds."""
    stubs = Stubs.insecure(address, token)
    try:
        request = retrieval_pb2.SearchRequest(
            parent=f"owners/{OWNER}",
            query_embedding=vector.tolist(),
            top_k=10,
            mode=retrieval_pb2.SearchRequest.DENSE,
        )
        t0 = time.perf_counter()
        stubs.retrieval.Search(request, metadata=stubs.md, timeout=600)
        return time.perf_counter() - t0
    finally:
        stubs.close()


def _run(
    pool: ClientPool, batch: CallBatch, clients: int, pids: list[int] | None = None
) -> dict[str, Any]:
    """One closed-loop run: searches a second over the wall span, p50 and p99 in ms.

    With ``pids`` (the serving processes), also ``cpu_ms``: their CPU time
    (user + system) over the run per search answered, in ms; and
    ``cpu_ms_by_thread``: the same split by thread name, summed over the
    processes (``lethe-rpc`` the workers, ``lethe-loop`` the event loop,
    ``event_engine`` grpc's own threads; see ``_scale_procs.cpu_by_thread``).

    Always ``client_cpu_ms``, the client processes' CPU time per search
    answered (ms), and ``machine_busy``, the fraction of all the machine's
    cores busy over the run (``_scale_procs.machine_cpu``): where the clients
    share the server's machine, the searches a second cannot pass
    ``cores * 1000 / (server + client CPU ms per search)``.
    """
    clients_at = pool.pids[:clients]
    machine0 = machine_cpu()
    client0 = sum(cpu_seconds(p) for p in clients_at)
    cpu0 = sum(cpu_seconds(p) for p in pids or [])
    threads0 = [cpu_by_thread(p) for p in pids or []]
    results = pool.run(batch, clients)
    cpu1 = sum(cpu_seconds(p) for p in pids or [])
    threads1 = [cpu_by_thread(p) for p in pids or []]
    client1 = sum(cpu_seconds(p) for p in clients_at)
    machine1 = machine_cpu()
    calls = [lat for r in results for lat in r.latencies]
    span = max(r.end for r in results) - min(r.start for r in results)
    out: dict[str, Any] = {
        "qps": len(calls) / span,
        "p50_ms": float(np.percentile(calls, 50)) * 1e3,
        "p99_ms": float(np.percentile(calls, 99)) * 1e3,
        "calls": float(len(calls)),
    }
    per = 1e3 / max(len(calls), 1)
    out["client_cpu_ms"] = (client1 - client0) * per
    out["machine_busy"] = (machine1[0] - machine0[0]) / max(machine1[1] - machine0[1], 1e-9)
    if pids:
        out["cpu_ms"] = (cpu1 - cpu0) * per
        split: dict[str, float] = {}
        for before, after in zip(threads0, threads1, strict=True):
            for name, seconds in after.items():
                split[name] = split.get(name, 0.0) + (seconds - before.get(name, 0.0)) * per
        out["cpu_ms_by_thread"] = {
            name: round(ms, 3) for name, ms in sorted(split.items(), key=lambda kv: -kv[1]) if ms
        }
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Ingest, then the rounds and the kill (module docstring); the report."""
    counts = [int(c) for c in args.processes.split(",")]
    texts = varied_texts(load_corpus(None).turns, args.records)
    vectors = random_unit(args.records, seed=1)
    queries = [q.tolist() for q in random_unit(64, seed=3)]
    proc = LetheProcess(["--processes", str(counts[0])])
    pool = ClientPool(args.clients)
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    memory: dict[int, list[int]] = {n: [] for n in counts}
    try:
        proc.start()
        stubs = Stubs.insecure(proc.address, proc.token)
        _log(f"ingest {args.records} turns")
        ingest_s = _ingest(stubs, texts, vectors)
        stubs.close()
        _search_once(proc.address, proc.token, vectors[0])  # built: the stop writes its snapshot
        for r in range(args.rounds):
            for n in counts:
                proc.stop(timeout=900)
                proc.serve_args = [*proc.serve_args[:-1], str(n)]
                proc.start()
                batch = CallBatch(proc.address, "search", f"owners/{OWNER}", queries, proc.token, 0)
                warm = CallBatch(**{**batch.__dict__, "seconds": args.warmup})
                pool.run(warm, args.clients)  # every process has loaded the owner
                # past the start-up audit: the steady state (unless measuring during it)
                quiet = 0.0 if args.during_audit else wait_quiet(_members(proc))
                run = _run(
                    pool,
                    CallBatch(**{**batch.__dict__, "seconds": args.seconds}),
                    args.clients,
                    _members(proc),
                )
                rss = sum(memory_of(pid).get("vm_rss", 0) for pid in _members(proc))
                runs[n].append(run)
                memory[n].append(rss)
                _log(
                    f"round {r + 1}: {n} processes (steady {quiet:.1f} s after the warm-up): "
                    f"{run['qps']:.0f} searches/s, "
                    f"p50 {run['p50_ms']:.2f} ms, p99 {run['p99_ms']:.2f} ms, "
                    f"server CPU {run['cpu_ms']:.2f} ms/search, clients "
                    f"{run['client_cpu_ms']:.2f}, machine {run['machine_busy']:.0%} busy, "
                    f"rss {rss >> 20} MiB "
                    f"({', '.join(f'{k} {v:.2f}' for k, v in run['cpu_ms_by_thread'].items())})"
                )
        # A lone process has no supervisor to start it again: no kill then.
        kill = _kill_to_first_search(proc, counts[-1], vectors[1]) if counts[-1] > 1 else None
        join = _join_to_first_search(proc, vectors[2]) if counts[-1] > 1 else None
    finally:
        pool.close()
        proc.close()
    floor = counts[0]
    table = []
    for n in counts:
        qps = median(x["qps"] for x in runs[n])
        p50 = median(x["p50_ms"] for x in runs[n])
        table.append(
            {
                "processes": n,
                "qps": round(qps, 1),
                "p50_ms": round(p50, 3),
                "p99_ms": round(median(x["p99_ms"] for x in runs[n]), 3),
                "cpu_ms_per_search": round(median(x["cpu_ms"] for x in runs[n]), 3),
                "cpu_ms_by_thread": _median_split([x["cpu_ms_by_thread"] for x in runs[n]]),
                "client_cpu_ms_per_search": round(median(x["client_cpu_ms"] for x in runs[n]), 3),
                "machine_busy": round(median(x["machine_busy"] for x in runs[n]), 3),
                "rss_bytes": int(median(memory[n])),
                "qps_ratio": round(qps / median(x["qps"] for x in runs[floor]), 3),
                "p50_ratio": round(p50 / median(x["p50_ms"] for x in runs[floor]), 3),
            }
        )
    return {
        "records": args.records,
        "clients": args.clients,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "ingest_s": round(ingest_s, 1),
        "table": table,
        "runs": {str(n): runs[n] for n in counts},
        "kill": kill,
        "join": join,
    }


def _kill_to_first_search(proc: LetheProcess, n: int, vector: np.ndarray) -> dict[str, Any]:
    """SIGKILL one member of an ``n``-process group; seconds until a search answers again."""
    proc.stop(timeout=900)
    proc.serve_args = [*proc.serve_args[:-1], str(n)]
    proc.start()
    _search_once(proc.address, proc.token, vector)
    members = _members(proc)
    victim = members[-1]
    t0 = time.perf_counter()
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.3)  # the supervisor notices within 0.2 s and stops the others
    while True:
        try:
            _search_once(proc.address, proc.token, vector)
            break
        except Exception:
            if time.perf_counter() - t0 > 600:
                raise
            time.sleep(0.05)
    return {"processes": n, "kill_to_first_search_s": round(time.perf_counter() - t0, 3)}


def _connections(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` whose local port is ``port`` (``/proc``)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            f = row.split()
            local_port = int(f[1].rpartition(":")[2], 16)
            count += f[3] == "01" and local_port == port and int(f[9]) in inodes
    return count


def _join_to_first_search(proc: LetheProcess, vector: np.ndarray) -> dict[str, Any]:
    """SIGTTIN to the running group; seconds until the new member answers a search.

    Returns:
        ``join_to_first_search_s`` (the signal to the new member's first
        answer), ``join_to_ready_s`` (to its ready line in the supervisor's
        log) and the group's size after.
    """
    log_at = len(proc.log.read_text(errors="replace"))
    t0 = time.perf_counter()
    os.kill(proc.pid, signal.SIGTTIN)
    while "joined" not in (tail := proc.log.read_text(errors="replace")[log_at:]):
        if time.perf_counter() - t0 > 600:
            raise RuntimeError("no member joined")
        time.sleep(0.02)
    ready_s = time.perf_counter() - t0
    found = re.search(r"member \d+ \(pid (\d+)\) joined; (\d+) processes", tail)
    assert found is not None, tail
    joined, size = int(found[1]), int(found[2])
    port = int(proc.address.rpartition(":")[2])
    tries = 0
    while True:
        held = _connections(joined, port)
        stubs = Stubs.insecure(proc.address, proc.token)
        try:
            stubs.retrieval.Search(
                retrieval_pb2.SearchRequest(
                    parent=f"owners/{OWNER}", query_embedding=vector.tolist(), top_k=10
                ),
                metadata=stubs.md,
                timeout=600,
            )
            answered = time.perf_counter() - t0
            landed = _connections(joined, port) > held
        finally:
            stubs.close()
        tries += 1
        if landed:
            break
        if tries > 200:
            raise RuntimeError("no connection reached the new member")
    return {
        "processes": size,
        "join_to_ready_s": round(ready_s, 3),
        "join_to_first_search_s": round(answered, 3),
        "connections_tried": tries,
    }


def _median_split(splits: list[dict[str, float]]) -> dict[str, float]:
    """Per thread name, the median over runs of its server CPU ms per search (0 where absent)."""
    names = sorted({name for split in splits for name in split})
    out = {name: round(median(split.get(name, 0.0) for split in splits), 3) for name in names}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _ceiling(cores: int, row: dict[str, Any]) -> float:
    """Searches a second the machine's ``cores`` could answer at ``row``'s CPU per search.

    ``cores * 1000 / (server + client CPU ms per search)``: the bound where the
    clients share the server's machine and every core is busy.
    """
    spent = float(row["cpu_ms_per_search"]) + float(row["client_cpu_ms_per_search"])
    return cores * 1e3 / max(spent, 1e-9)


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# --processes: searches a second at {report['records']} turns, "
        f"{report['clients']} client processes",
        "",
        f"Medians of {report['rounds']} rounds of {report['seconds']} s; ratios to "
        f"{report['table'][0]['processes']} process(es). Machine: "
        f"{report['machine'].get('cpu_count')} CPUs, load average at start "
        f"{report['machine'].get('loadavg_start')}.",
        "",
        "| processes | searches/s | ratio | p50 ms | p50 ratio | p99 ms | server CPU ms/search "
        "| RSS (all, MiB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["table"]:
        lines.append(
            f"| {row['processes']} | {row['qps']:.0f} | {row['qps_ratio']:.2f} | "
            f"{row['p50_ms']:.2f} | {row['p50_ratio']:.2f} | {row['p99_ms']:.2f} | "
            f"{row['cpu_ms_per_search']:.2f} | {row['rss_bytes'] >> 20} |"
        )
    lines += [
        "",
        "Server CPU per search by thread (ms; `lethe-rpc` the workers, `lethe-loop` the "
        "event loop, `event_engine` grpc's own threads):",
        "",
    ]
    for row in report["table"]:
        split = ", ".join(f"{name} {ms:.3f}" for name, ms in row["cpu_ms_by_thread"].items())
        lines.append(f"- {row['processes']} process(es): {split}")
    cores = report["machine"].get("cpu_count") or 1
    lines += [
        "",
        f"The client processes run on the same {cores} CPUs. What the machine can answer "
        "at all is its cores over the CPU a search takes, server and client together:",
        "",
        "| processes | client CPU ms/search | machine busy | ceiling searches/s | "
        "searches/s of the ceiling |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in report["table"]:
        ceiling = _ceiling(cores, row)
        lines.append(
            f"| {row['processes']} | {row['client_cpu_ms_per_search']:.2f} | "
            f"{row['machine_busy']:.0%} | {ceiling:.0f} | {row['qps'] / ceiling:.0%} |"
        )
    kill = report["kill"]
    if kill is not None:
        lines += [
            "",
            f"A member of {kill['processes']} SIGKILLed: the group answers a new connection's "
            f"search {kill['kill_to_first_search_s']:.2f} s later (restart, recovery, warm load).",
        ]
    join = report.get("join")
    if join is not None:
        lines += [
            "",
            f"SIGTTIN to the running group: member {join['processes']} is started beside the "
            f"others, ready {join['join_to_ready_s']:.2f} s after the signal, and answers its "
            f"first search of the owner (loaded from its snapshot) "
            f"{join['join_to_first_search_s']:.2f} s after it.",
        ]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its results; 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="1,2", help="process counts, the floor first")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--during-audit",
        action="store_true",
        help="measure right after each start, the start-up audit inside the run",
    )
    parser.add_argument("--smoke", action="store_true", help="seconds: 300 records, 1 round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.records, args.clients, args.seconds, args.warmup, args.rounds = 300, 2, 1.0, 0.5, 1
    machine = machine_info()
    report = {"machine": machine, **measure(args)}
    name = "processes-smoke" if args.smoke else "processes"
    out = args.out or BENCH / "results" / f"{name}.json"
    write_report(out, report, _markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
