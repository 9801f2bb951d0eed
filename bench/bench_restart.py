"""Restart to first search, with and without the owner's index snapshot.

Per owner size (20k and 100k turns; ``--large`` adds 1M; ``--sizes`` any), in
a data directory of its own: ``lethe serve --embedder none`` (clients send the
vectors: ``TurnInput.embedding``), one owner ingested as committed threads of
100 turns (LoCoMo-derived texts, random unit 256-d vectors), one first search
to load it. Then, in rounds, each kind of restart of the same process on the
same data:

- **cold**: the snapshot file removed after the stop, so the first search
  builds the owner's indexes from LMDB (as every restart did before snapshots);
- **warm**: the stop writes the snapshot (``stop_s`` includes it), the first
  search loads it and checks it against the store.

Each restart records ``serving_s`` (spawn until the server prints that it
serves: imports, start-up recovery), ``first_search_s`` (one HYBRID search with
text and vector: the build or the load, then the search) and their sum,
``restart_to_first_search_s``, whose medians and cold/warm ratio are reported;
plus the snapshot's size and the server's resident set against the raw vectors
(``n x 256 x 4`` bytes), each figure less the resident set the server had when
it started serving (its base: code, libraries): the peak to the first search's
answer (the build or the load), then the peak and the resident set after
``--settle`` seconds of one search a second (what follows a first search: a
cold build's snapshot save, the sweeper's first audit). Every warm first
search must answer what the cold one answered (``same_hits``).

Writes ``bench/results/restart[-smoke].{json,md}``::

    .venv/bin/python bench/bench_restart.py             # 20k and 100k, 3 rounds
    .venv/bin/python bench/bench_restart.py --large     # adds 1M (about 12 GB RAM, an hour)
    .venv/bin/python bench/bench_restart.py --sizes 1000000 --rounds 1 --cold-rounds 0 \
        --name restart-1m    # 1M warm only: its cold figure is the first build after ingest
    .venv/bin/python bench/bench_restart.py --smoke     # seconds; proves it runs

The machine is shared and noisy: quote medians and ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from _scale_data import load_corpus, random_unit, varied_texts
from _scale_procs import LetheProcess
from _scale_report import machine_info

from lethe._rpc import Stubs
from lethe.v1 import common_pb2, retrieval_pb2, threads_pb2

BENCH = Path(__file__).resolve().parent
OWNER = "bench"
SETTLE_S = 10.0
"""Seconds of one search a second after the first search before the settled figures."""
THREAD_LEN = 100
BATCH = 1000


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _ingest(stubs: Stubs, texts: list[str], vectors: np.ndarray) -> float:
    """Append every text as a committed turn of ``OWNER``, threads of 100; returns seconds.

    Appends to distinct threads are kept up to 4 in flight (the writer groups them).
    """
    t0 = time.perf_counter()
    inflight: deque[Any] = deque()
    for j, start in enumerate(range(0, len(texts), THREAD_LEN)):
        thread = stubs.threads.CreateThread(
            threads_pb2.CreateThreadRequest(parent=f"owners/{OWNER}", thread_id=f"t{j}"),
            metadata=stubs.md,
        ).name
        turns = [
            threads_pb2.TurnInput(
                role=common_pb2.USER, text=texts[i], commit=True, embedding=vectors[i].tolist()
            )
            for i in range(start, min(start + THREAD_LEN, len(texts)))
        ]
        while len(inflight) >= 4:
            inflight.popleft().result()
        inflight.append(
            stubs.threads.AppendTurns.future(
                threads_pb2.AppendTurnsRequest(parent=thread, turns=turns), metadata=stubs.md
            )
        )
    while inflight:
        inflight.popleft().result()
    return time.perf_counter() - t0


def _search(stubs: Stubs, text: str, vector: np.ndarray) -> tuple[float, list[str]]:
    """One HYBRID search (text and vector): ``(seconds, hit names)``."""
    request = retrieval_pb2.SearchRequest(
        parent=f"owners/{OWNER}",
        query_text=text,
        query_embedding=vector.tolist(),
        top_k=10,
        mode=retrieval_pb2.SearchRequest.HYBRID,
    )
    t0 = time.perf_counter()
    got = stubs.retrieval.Search(request, metadata=stubs.md, timeout=3600)
    return time.perf_counter() - t0, [h.turn.name or h.memory.name for h in got.hits]


def _restart(
    proc: LetheProcess, *, warm: bool, query: tuple[str, np.ndarray], raw: int, settle: float
) -> dict[str, Any]:
    """Stop, (cold: remove the snapshot), start, first search, settle: one restart's figures."""
    snapshot = proc.data / "index" / f"{OWNER}.snapshot"
    t0 = time.perf_counter()
    proc.stop(timeout=900)  # a large owner's snapshot is written at the stop
    stop_s = time.perf_counter() - t0
    size = snapshot.stat().st_size if snapshot.exists() else 0
    if not warm:
        snapshot.unlink(missing_ok=True)
    serving_s = proc.start()
    base = proc.memory()
    proc.reset_peak()
    stubs = Stubs.insecure(proc.address, proc.token)
    try:
        first_s, hits = _search(stubs, *query)
        first = proc.memory()
        until = time.perf_counter() + settle
        while time.perf_counter() < until:
            time.sleep(1.0)
            _search(stubs, *query)
        settled = proc.memory()
    finally:
        stubs.close()
    rss: dict[str, float | None] = dict.fromkeys(("first_peak", "settled_peak", "steady"))
    if base and first and settled:
        rss = {
            "first_peak": round((first["vm_hwm"] - base["vm_rss"]) / raw, 2),
            "settled_peak": round((settled["vm_hwm"] - base["vm_rss"]) / raw, 2),
            "steady": round((settled["vm_rss"] - base["vm_rss"]) / raw, 2),
        }
    return {
        "kind": "warm" if warm else "cold",
        "stop_s": round(stop_s, 3),
        "snapshot_bytes": size if warm else 0,
        "serving_s": round(serving_s, 3),
        "first_search_s": round(first_s, 3),
        "restart_to_first_search_s": round(serving_s + first_s, 3),
        "rss_peak_bytes": settled.get("vm_hwm", 0),
        "rss_base_bytes": base.get("vm_rss", 0),
        "rss_over_raw": rss,
        "hits": hits,
    }


def measure(
    n: int,
    rounds: int,
    cold_rounds: int,
    texts: list[str],
    serve_args: list[str],
    settle: float = SETTLE_S,
) -> dict[str, Any]:
    """Ingest ``n`` turns into a data directory of their own; restart it cold and warm."""
    vectors = random_unit(n, seed=1)
    query_vec = random_unit(1, seed=2)[0]
    query = (texts[n // 2], query_vec)
    proc = LetheProcess(serve_args)
    try:
        proc.start()
        stubs = Stubs.insecure(proc.address, proc.token)
        try:
            ingest_s = _ingest(stubs, texts[:n], vectors)
            build_s, built_hits = _search(stubs, *query)
        finally:
            stubs.close()
        _log(f"  {n:,} turns ingested in {ingest_s:.1f} s, first build {build_s:.1f} s")
        runs = []
        for r in range(rounds):
            kinds = (True, False) if r % 2 else (False, True)
            for kind_warm in kinds if r < cold_rounds else (True,):
                run = _restart(proc, warm=kind_warm, query=query, raw=n * 256 * 4, settle=settle)
                runs.append(run)
                _log(
                    f"  {n:,} {run['kind']}: serving {run['serving_s']:.2f} s + first search "
                    f"{run['first_search_s']:.2f} s (stop {run['stop_s']:.2f} s)"
                )
    finally:
        proc.close()
    cold = [r for r in runs if r["kind"] == "cold"]
    warm = [r for r in runs if r["kind"] == "warm"]

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return round(float(median(r[key] for r in rows)), 3)

    figures: dict[str, Any] = {
        kind: {
            key: med(rows, key)
            for key in ("serving_s", "first_search_s", "restart_to_first_search_s", "stop_s")
        }
        if rows
        else None
        for kind, rows in (("cold", cold), ("warm", warm))
    }
    for kind, rows in (("cold", cold), ("warm", warm)):
        measured = [r["rss_over_raw"] for r in rows if r["rss_over_raw"]["steady"] is not None]
        if figures[kind] is not None and measured:
            figures[kind]["rss_over_raw"] = {
                key: round(float(median(m[key] for m in measured)), 2) for key in measured[0]
            }
    ratio = (
        round(
            figures["cold"]["restart_to_first_search_s"]
            / figures["warm"]["restart_to_first_search_s"],
            2,
        )
        if cold
        else None
    )
    return {
        "n": n,
        "ingest_s": round(ingest_s, 2),
        "first_build_s": round(build_s, 3),
        "rounds": rounds,
        "cold_rounds": min(rounds, cold_rounds),
        "cold": figures["cold"],
        "warm": figures["warm"],
        "cold_over_warm": ratio,
        "snapshot_bytes": max(r["snapshot_bytes"] for r in warm),
        "rss_peak_bytes": {
            "cold": max((r["rss_peak_bytes"] for r in cold), default=None),
            "warm": max(r["rss_peak_bytes"] for r in warm),
        },
        "same_hits": all(r["hits"] == built_hits for r in runs),
        "runs": [{k: v for k, v in r.items() if k != "hits"} for r in runs],
    }


def write_markdown(result: dict[str, Any], path: Path) -> None:
    """The figures of ``result`` as a Markdown table."""
    lines = [
        "# Restart to first search, with and without the index snapshot",
        "",
        f"Command: `{result['command']}`; machine: {result['machine']['cpu_count']} CPUs "
        f"({result['machine']['cpu_model']}), load average at start "
        f"{result['machine']['loadavg_start']}. Medians of {result['rounds']} rounds; "
        "seconds.",
        "",
        "| turns | kind | serving | first search | restart to first search | stop | "
        "snapshot MB | peak RSS MB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    memory = [
        "",
        f"Resident set above the server's base, over the raw vectors (n x 256 x 4 bytes); "
        f"medians; settled = after {result.get('settle_s', SETTLE_S):.0f} s of one search a "
        "second (a cold build's snapshot save, the first audit):",
        "",
        "| turns | kind | peak to first search | peak, settled | steady, settled |",
        "|---:|---|---:|---:|---:|",
    ]
    for size in result["sizes"]:
        for kind in ("cold", "warm"):
            f = size[kind]
            if f is None:
                lines.append(
                    f"| {size['n']:,} | {kind} | | (first build after ingest: "
                    f"{size['first_build_s']:.2f}) | | | | |"
                )
                continue
            snap = f"{size['snapshot_bytes'] / 1e6:.0f}" if kind == "warm" else ""
            lines.append(
                f"| {size['n']:,} | {kind} | {f['serving_s']:.2f} | {f['first_search_s']:.2f} | "
                f"{f['restart_to_first_search_s']:.2f} | {f['stop_s']:.2f} | {snap} | "
                f"{size['rss_peak_bytes'][kind] / 1e6:.0f} |"
            )
            ratios = f.get("rss_over_raw")
            if ratios:
                memory.append(
                    f"| {size['n']:,} | {kind} | {ratios['first_peak']:.2f}x | "
                    f"{ratios['settled_peak']:.2f}x | {ratios['steady']:.2f}x |"
                )
    lines += memory
    lines += ["", "| turns | cold / warm | same hits |", "|---:|---:|---|"]
    for size in result["sizes"]:
        lines.append(f"| {size['n']:,} | {size['cold_over_warm']} | {size['same_hits']} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON and Markdown to ``--out-dir``.

    Args:
        argv: The command line without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status: 0, or 1 when a warm first search answered otherwise than a cold one.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--large", action="store_true", help="add a 1M-turn owner")
    parser.add_argument("--sizes", type=str, default="", help="comma-separated owner sizes")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (default 3; smoke 1)")
    parser.add_argument(
        "--cold-rounds",
        type=int,
        default=-1,
        help="rounds with a cold restart (default: every round; 0: warm only)",
    )
    parser.add_argument("--locomo", type=Path, default=None, help="path of locomo10.json")
    parser.add_argument("--out-dir", type=Path, default=BENCH / "results")
    parser.add_argument("--name", type=str, default="", help="output file stem")
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra `lethe serve` flag, repeatable"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=-1.0,
        help=f"seconds of searches after the first before the settled figures "
        f"(default {SETTLE_S:.0f}; smoke 1)",
    )
    args = parser.parse_args(argv)
    sizes = [300, 1000] if args.smoke else [20_000, 100_000] + ([1_000_000] if args.large else [])
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
    rounds = args.rounds or (1 if args.smoke else 3)
    settle = args.settle if args.settle >= 0 else (1.0 if args.smoke else SETTLE_S)
    cold_rounds = rounds if args.cold_rounds < 0 else args.cold_rounds
    corpus = load_corpus(args.locomo)
    texts = varied_texts(corpus.turns, max(sizes))
    result: dict[str, Any] = {
        "command": " ".join(["bench/bench_restart.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine_info(),
        "corpus": corpus.source,
        "rounds": rounds,
        "serve_args": ["--embedder", "none", *args.server_arg],
        "settle_s": settle,
        "sizes": [],
    }
    started = time.perf_counter()
    for n in sizes:
        _log(f"{n:,} turns ...")
        result["sizes"].append(measure(n, rounds, cold_rounds, texts, args.server_arg, settle))
    result["total_seconds"] = round(time.perf_counter() - started, 1)
    result["machine"]["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    stem = args.name or ("restart-smoke" if args.smoke else "restart")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result, args.out_dir / f"{stem}.md")
    for size in result["sizes"]:
        cold_s = size["cold"]["restart_to_first_search_s"] if size["cold"] else None
        print(
            f"{size['n']:,} turns: cold {cold_s} s (first build {size['first_build_s']} s), "
            f"warm {size['warm']['restart_to_first_search_s']} s "
            f"({size['cold_over_warm']}x), same hits: {size['same_hits']}"
        )
    print(f"written: {args.out_dir / stem}.json, .md ({result['total_seconds']} s)")
    return 0 if all(size["same_hits"] for size in result["sizes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
