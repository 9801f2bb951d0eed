"""Searches a second at 16 clients: Lethe against Chroma's own server, same vectors, same run.

One owner of ``--records`` committed turns: LoCoMo-derived texts embedded by
the server's embedder (WordLlama ``l2_supercat``, 256-d, cached as in
``bench_scale.py``), sent as vectors to ``lethe serve --embedder none``; the
same vectors in a Chroma collection (HNSW, inner product) served by
``chroma run`` in its own process. Queries are the LoCoMo questions, embedded
the same way.

First recall@10 against exact search (``_scale_stats.recall_at``: ties at the
k-th exact score count) over ``--recall-queries`` questions, for Lethe (its
own layout: exact search below 50,000 vectors, the calibrated IVF above) and
for Chroma along ``--efs`` (``hnsw.ef_search``; the server is restarted after
each change, since the index reads it when loaded) until it reaches
``--recall`` (0.99). Then, in ``--rounds`` rounds, each system in turn:
``--clients`` client *processes* (a connection each: gRPC for Lethe, Chroma's
``HttpClient``) query in a closed loop for ``--seconds`` (DENSE top 10 for
Lethe, ``query(n_results=10, include=[])`` for Chroma). Medians over rounds of
searches a second, p50 and p99; the ratio Lethe / Chroma (the issue's goal:
at least 1 at 100k with both at recall@10 >= 0.99).

Writes ``bench/results/chroma-server[-smoke].{json,md}``::

    .venv/bin/pip install -e '.[bench]'                        # chromadb
    .venv/bin/python bench/bench_chroma_server.py              # 100k, 3 rounds of 10 s
    .venv/bin/python bench/bench_chroma_server.py --smoke      # 2,000 records; proves it runs

The machine is shared and noisy: quote ratios from one run with its load.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from _scale_data import EmbeddingCache, load_corpus, varied_texts
from _scale_procs import CallBatch, ClientPool, LetheProcess, cpu_seconds
from _scale_report import machine_info, write_report
from _scale_stats import exact_top, recall_at
from _server import free_port
from bench_restart import OWNER, THREAD_LEN, _ingest, _log

from lethe._rpc import Stubs
from lethe.v1 import retrieval_pb2

BENCH = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "lethe-bench"


class ChromaServer:
    """``chroma run`` on a throwaway directory; restartable on the same data."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lethe-bench-chroma-server-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server on a new free port; return once it answers a heartbeat.

        Raises:
            RuntimeError: it did not answer within 120 s.
        """
        import chromadb

        self.port = free_port()
        chroma = Path(sys.executable).with_name("chroma")
        argv = [str(chroma), "run", "--path", str(self.root / "data"), "--host", "127.0.0.1"]
        log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen([*argv, "--port", str(self.port)], stdout=log, stderr=log)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                chromadb.HttpClient(host="127.0.0.1", port=self.port).heartbeat()
                return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError("chroma run did not answer within 120 s")

    def client(self) -> Any:
        """A new ``chromadb.HttpClient`` of this server."""
        import chromadb

        return chromadb.HttpClient(host="127.0.0.1", port=self.port)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 30 s)."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def close(self) -> None:
        """Stop and delete the data."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _chroma_loop(args: tuple[int, list[list[float]], float, float]) -> dict[str, Any]:
    """One client process: query until ``seconds`` after ``start_at`` (epoch); latencies in s."""
    import chromadb

    port, queries, seconds, start_at = args
    col: Any = chromadb.HttpClient(host="127.0.0.1", port=port).get_collection("bench")
    col.query(query_embeddings=[queries[0]], n_results=10, include=[])  # connected
    time.sleep(max(0.0, start_at - time.time()))
    latencies = []
    start = time.time()
    end = start + seconds
    i = 0
    while time.time() < end:
        t0 = time.perf_counter()
        col.query(query_embeddings=[queries[i % len(queries)]], n_results=10, include=[])
        latencies.append(time.perf_counter() - t0)
        i += 1
    return {"latencies": latencies, "start": start, "end": time.time()}


def _summary(latencies: list[float], span: float) -> dict[str, float]:
    return {
        "qps": len(latencies) / span,
        "p50_ms": float(np.percentile(latencies, 50)) * 1e3,
        "p99_ms": float(np.percentile(latencies, 99)) * 1e3,
        "calls": float(len(latencies)),
    }


def _lethe_rows(stubs: Stubs, query: np.ndarray) -> list[int]:
    """Lethe's DENSE top 10 for ``query``, as row numbers of the ingest order."""
    got = stubs.retrieval.Search(
        retrieval_pb2.SearchRequest(
            parent=f"owners/{OWNER}",
            query_embedding=query.tolist(),
            top_k=10,
            mode=retrieval_pb2.SearchRequest.DENSE,
        ),
        metadata=stubs.md,
        timeout=600,
    )
    rows = []
    for hit in got.hits:
        parts = hit.turn.name.split("/")  # owners/O/threads/tJ/turns/SEQ
        rows.append(int(parts[3][1:]) * THREAD_LEN + int(parts[5]) - 1)
    return rows


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Load both systems, then recall and the rounds (module docstring); the report."""
    corpus = load_corpus(None)
    cache = EmbeddingCache(CACHE)
    texts = varied_texts(corpus.turns, args.records)
    _log(f"embed {len(texts)} texts and {len(corpus.questions)} questions")
    x = cache.embed(texts)
    qv = cache.embed(corpus.questions)
    qv = qv[np.abs(qv).sum(axis=1) > 0]
    nq = min(args.recall_queries, len(qv))
    exact_ids, exact_scores = exact_top(x, qv[:nq], 10)
    del exact_ids
    queries = [q.tolist() for q in qv[:256]]
    lethe = LetheProcess(["--processes", str(args.processes)])
    chroma = ChromaServer()
    pool = ClientPool(args.clients)
    report: dict[str, Any] = {"records": args.records, "clients": args.clients}
    try:
        lethe.start()
        stubs = Stubs.insecure(lethe.address, lethe.token)
        _log(f"lethe: ingest {len(texts)} turns")
        report["lethe_ingest_s"] = round(_ingest(stubs, texts, x), 1)
        t0 = time.perf_counter()
        _lethe_rows(stubs, qv[0])
        report["lethe_first_search_s"] = round(time.perf_counter() - t0, 2)
        recalls = [
            recall_at(_lethe_rows(stubs, qv[i]), qv[i], x, exact_scores[i]) for i in range(nq)
        ]
        report["lethe_recall_at_10"] = round(float(np.mean(recalls)), 4)
        stubs.close()
        _log(f"lethe: recall@10 {report['lethe_recall_at_10']:.4f}")

        chroma.start()
        client = chroma.client()
        col = client.create_collection(
            "bench", configuration={"hnsw": {"space": "ip", "ef_search": args.efs[0]}}
        )
        step = min(5000, int(client.get_max_batch_size()))
        t0 = time.perf_counter()
        for i in range(0, len(x), step):
            chunk = x[i : i + step]
            col.add(ids=[str(j) for j in range(i, i + len(chunk))], embeddings=chunk)
        report["chroma_add_s"] = round(time.perf_counter() - t0, 1)
        ladder = []
        for ef in args.efs:
            if ef != args.efs[0]:
                client.get_collection("bench").modify(configuration={"hnsw": {"ef_search": ef}})
                chroma.stop()
                chroma.start()
                client = chroma.client()
            col = client.get_collection("bench")
            got = [
                [
                    int(i)
                    for i in col.query(query_embeddings=[qv[j]], n_results=10, include=[])["ids"][0]
                ]
                for j in range(nq)
            ]
            recall = float(
                np.mean([recall_at(g, qv[j], x, exact_scores[j]) for j, g in enumerate(got)])
            )
            ladder.append({"ef_search": ef, "recall_at_10": round(recall, 4)})
            _log(f"chroma: ef_search {ef}: recall@10 {recall:.4f}")
            if recall >= args.recall:
                break
        report["chroma_ladder"] = ladder

        runs: dict[str, list[dict[str, float]]] = {"lethe": [], "chroma": []}
        lethe_batch = CallBatch(lethe.address, "search", f"owners/{OWNER}", queries, lethe.token, 0)
        ctx = mp.get_context("spawn")
        with ctx.Pool(args.clients) as cpool:
            for r in range(args.rounds):
                cpu0 = cpu_seconds(lethe.pid)
                results = pool.run(
                    CallBatch(**{**lethe_batch.__dict__, "seconds": args.seconds}), args.clients
                )
                cpu = cpu_seconds(lethe.pid) - cpu0
                lat = [v for res in results for v in res.latencies]
                span = max(res.end for res in results) - min(res.start for res in results)
                run = _summary(lat, span)
                run["server_cpu_ms"] = cpu * 1e3 / max(len(lat), 1)
                runs["lethe"].append(run)
                start_at = time.time() + 2.0
                loops = cpool.map(
                    _chroma_loop, [(chroma.port, queries, args.seconds, start_at)] * args.clients
                )
                lat = [v for g in loops for v in g["latencies"]]
                span = max(g["end"] for g in loops) - min(g["start"] for g in loops)
                runs["chroma"].append(_summary(lat, span))
                _log(
                    f"round {r + 1}: lethe {runs['lethe'][-1]['qps']:.0f}/s "
                    f"(p50 {runs['lethe'][-1]['p50_ms']:.1f} ms), chroma "
                    f"{runs['chroma'][-1]['qps']:.0f}/s (p50 {runs['chroma'][-1]['p50_ms']:.1f} ms)"
                )
    finally:
        pool.close()
        lethe.close()
        chroma.close()
    report["runs"] = runs
    report["table"] = {
        system: {key: round(median(run[key] for run in runs[system]), 3) for key in runs[system][0]}
        for system in runs
    }
    report["qps_ratio_lethe_over_chroma"] = round(
        median(a["qps"] / b["qps"] for a, b in zip(runs["lethe"], runs["chroma"], strict=True)), 3
    )
    return report


def _markdown(report: dict[str, Any]) -> str:
    table, ladder = report["table"], report["chroma_ladder"]
    lines = [
        f"# Lethe against Chroma's server: {report['records']} LoCoMo vectors, "
        f"{report['clients']} client processes",
        "",
        f"Medians of {len(report['runs']['lethe'])} rounds; machine: "
        f"{report['machine'].get('cpu_count')} CPUs, load average at start "
        f"{report['machine'].get('loadavg_start')}. Lethe recall@10 "
        f"{report['lethe_recall_at_10']:.4f}; Chroma at ef_search {ladder[-1]['ef_search']}: "
        f"{ladder[-1]['recall_at_10']:.4f}.",
        "",
        "| system | searches/s | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
    ]
    for system in ("lethe", "chroma"):
        row = table[system]
        lines.append(f"| {system} | {row['qps']:.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |")
    lines += [
        "",
        f"Lethe / Chroma searches a second: **{report['qps_ratio_lethe_over_chroma']:.2f}** "
        f"(median of the per-round ratios); Lethe's server CPU per search "
        f"{table['lethe']['server_cpu_ms']:.2f} ms.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its results; 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=1, help="lethe serve --processes")
    parser.add_argument("--efs", default="100,200,400,800,1600", help="Chroma ef_search ladder")
    parser.add_argument("--recall", type=float, default=0.99)
    parser.add_argument("--recall-queries", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="2,000 records, 1 round of 2 s")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per Chroma request otherwise
    args.efs = [int(e) for e in args.efs.split(",")]
    if args.smoke:
        args.records, args.rounds, args.seconds, args.clients = 2000, 1, 2.0, 4
        args.recall_queries = 20
    out = args.out or BENCH / "results" / f"chroma-server{'-smoke' if args.smoke else ''}.json"
    started = machine_info()
    report = measure(args)
    report["machine"] = {**started, "args": {k: str(v) for k, v in vars(args).items()}}
    write_report(out, report, _markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
