"""Lethe at every owner size, against its floors and peers, in one interleaved run.

Starts ``lethe serve --embedder none`` in its own process (clients send the
vectors: ``TurnInput.embedding``, ``SearchRequest.query_embedding``) and the
minimal gRPC+FAISS server (``bench/minimal_server.py``) in another, then per
owner size (1k, 20k, 100k; ``--large`` adds 1M) and vector kind (random unit
vectors and WordLlama vectors of LoCoMo-derived turns, LoCoMo questions as
queries, see ``_scale_data``) it ingests one owner (threads of 100 turns,
committed), searches it once and waits for Lethe's steady state (the owner's
index snapshot written once its writes settled, the sweeper quiet:
``LetheProcess.settle``; ``settle_s`` in the results), then measures DENSE
``Search`` top 10:

- sequentially, interleaved round by round (each round a short batch of the
  same queries for every system, the order rotated each round) with: Lethe on
  that owner; Lethe on an empty owner; the empty authenticated call
  (``Threads.ListThreads`` of an empty owner); in-process FAISS of the same
  index type (``--faiss-factory``); the minimal server; Chroma in process
  (optional dependency group ``bench``) at its default ``ef_search``;
- at concurrency 1/4/16, again interleaved: gRPC systems from client
  *processes* (one ``ClientPool`` for all of them), in-process FAISS and Chroma
  from *threads* of this process (they cannot be shared across processes);
- recall@10 of Lethe, the minimal server and Chroma against exact search, and
  Chroma's recall and speed along an ``ef_search`` ladder up to recall 0.99.

Then, once: the first HYBRID/LEXICAL/DENSE search after a one-turn write
against the steady p50; ``AppendTurns`` throughput (batches of 1000,
committed) cold and warm, into new threads and into a long thread;
``Forget`` of one turn, a thread, a turn with 100 descendants and a
1,000-turn ``TurnRange``, each against the in-process durability floor
(``_scale_floor``); and per size a restart (time to serve), the build (time to
the first Search), the one-long-thread variant, and the server's peak and
steady resident set against the raw vector bytes (n x 256 x 4).

Writes ``bench/results/scale[-quick|-smoke].{json,md,png}``::

    .venv/bin/python bench/bench_scale.py --quick     # under 5 minutes here
    .venv/bin/python bench/bench_scale.py             # 1k, 20k, 100k
    .venv/bin/python bench/bench_scale.py --large     # adds 1M (about 20 GB RAM)
    .venv/bin/python bench/bench_scale.py --smoke     # seconds; proves it runs

The machine is shared and noisy: quote medians and per-round ratios from one
run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import faiss
import grpc
import numpy as np
from _scale_data import DIM, EmbeddingCache, Vectors, load_corpus, random_unit, varied_texts
from _scale_floor import DurableFloor
from _scale_procs import CallBatch, ClientPool, LetheProcess, MinimalProcess, RunResult
from _scale_report import machine_info, write_markdown, write_plot
from _scale_stats import (
    ChromaPeer,
    chroma_available,
    exact_top,
    median_ratio,
    qps_of,
    recall_at,
    run_threads,
    summary,
)
from minimal_server import build_index

from lethe._rpc import Stubs
from lethe.v1 import (
    common_pb2,
    lifecycle_pb2,
    memories_pb2,
    retrieval_pb2,
    retrieval_pb2_grpc,
    threads_pb2,
)

BENCH = Path(__file__).resolve().parent
EMPTY_OWNER = "bench-empty"
DEFAULT_FACTORY = "IDMap2,Flat"
"""``faiss.index_factory`` string of the server's index today:
``IndexIDMap2(IndexFlatIP(d))`` (``index/_vectors.py``). Used when the
``index`` package exports no ``FAISS_FACTORY``."""

DENSE = retrieval_pb2.SearchRequest.DENSE
HYBRID = retrieval_pb2.SearchRequest.HYBRID
LEXICAL = retrieval_pb2.SearchRequest.LEXICAL


@dataclass
class Plan:
    """What one run measures; :func:`plan_for` fills it per mode.

    Sizes are turns per owner; times are seconds.
    """

    mode: str
    sizes: list[int]
    kinds: list[str] = field(default_factory=lambda: ["random", "real"])
    thread_len: int = 100
    batch: int = 1000
    seq_queries: int = 1000
    round_queries: int = 20
    conc_levels: list[int] = field(default_factory=lambda: [1, 4, 16])
    conc_seconds: float = 0.5
    conc_rounds: int = 3
    conc_queries: int = 200
    conc_sizes: list[int] | None = None
    chroma_kinds: list[str] = field(default_factory=lambda: ["random", "real"])
    chroma_max: int = 100_000
    chroma_efs: list[int] = field(default_factory=lambda: [200, 400, 800, 1600, 3200])
    chroma_recall_queries: int = 200
    after_write_size: int = 20_000
    after_write_reps: int = 7
    steady_queries: int = 100
    append_base: int = 20_000
    append_long: int = 5_000
    append_batches: int = 8
    forget_turns: int = 30_000
    forget_long: int = 5000
    forget_range: int = 1000
    forget_rounds: int = 5
    range_rounds: int = 3
    descendants: int = 100
    long_sizes: list[int] = field(default_factory=lambda: [20_000, 100_000])
    restart_each: bool = True
    build_steady_queries: int = 100


def plan_for(mode: str, large: bool) -> Plan:
    """The plan of a mode.

    Args:
        mode: ``"full"``, ``"quick"`` or ``"smoke"``.
        large: Add a 1M owner (full and quick only).

    Returns:
        The plan.
    """
    if mode == "smoke":
        return Plan(
            mode=mode,
            sizes=[200, 600],
            batch=100,
            seq_queries=40,
            round_queries=10,
            conc_levels=[1, 2],
            conc_seconds=0.2,
            conc_rounds=1,
            conc_queries=20,
            chroma_kinds=["real"],
            chroma_efs=[200],
            chroma_recall_queries=20,
            after_write_size=600,
            after_write_reps=2,
            steady_queries=10,
            append_base=200,
            append_long=200,
            append_batches=1,
            forget_turns=300,
            forget_long=100,
            forget_range=100,
            forget_rounds=1,
            range_rounds=1,
            descendants=4,
            long_sizes=[600],
            restart_each=False,
            build_steady_queries=10,
        )
    extra = [1_000_000] if large else []
    if mode == "quick":
        return Plan(
            mode=mode,
            sizes=[1000, 20_000, *extra],
            seq_queries=300,
            conc_seconds=0.3,
            conc_rounds=2,
            conc_sizes=[20_000],
            chroma_kinds=["real"],
            chroma_recall_queries=100,
            after_write_reps=3,
            steady_queries=40,
            append_base=2000,
            append_long=5000,
            append_batches=2,
            forget_turns=4000,
            forget_long=2000,
            forget_rounds=3,
            range_rounds=1,
            long_sizes=[20_000],
            restart_each=False,
            build_steady_queries=40,
        )
    return Plan(mode=mode, sizes=[1000, 20_000, 100_000, *extra])


# --------------------------------------------------------------------- helpers


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _turn(text: str, vector: Vectors) -> threads_pb2.TurnInput:
    return threads_pb2.TurnInput(
        role=common_pb2.USER, text=text, commit=True, embedding=vector.tolist()
    )


def _dense(parent: str, q: Vectors) -> retrieval_pb2.SearchRequest:
    return retrieval_pb2.SearchRequest(
        parent=parent, query_embedding=q.tolist(), top_k=10, mode=DENSE
    )


@contextmanager
def _section(result: dict[str, Any], name: str) -> Iterator[None]:
    _log(f"{name} ...")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    yield
    result.setdefault("sections", {})[name] = {
        "seconds": round(time.perf_counter() - t0, 2),
        "loadavg_1min_start": round(load0, 2),
        "loadavg_1min_end": round(os.getloadavg()[0], 2),
    }


class Bench:
    """The processes, data and results of one run."""

    def __init__(self, plan: Plan, args: argparse.Namespace) -> None:
        self.plan = plan
        self.args = args
        self.result: dict[str, Any] = {"skipped": [], "notes": []}
        self.corpus = load_corpus(args.locomo)
        cache = None if args.no_cache else args.cache_dir
        self.embeddings = EmbeddingCache(cache)
        self.explicit_factory = bool(args.faiss_factory)
        self.factory: str = args.faiss_factory or DEFAULT_FACTORY
        self.params: str = args.faiss_params
        self.texts = varied_texts(self.corpus.turns, max(plan.sizes))
        self.workdir = Path(tempfile.mkdtemp(prefix="lethe-bench-vectors-"))
        self.chroma = chroma_available()
        if self.chroma is None:
            self.result["skipped"].append(
                "chroma: skipped: not installed (pip install -e '.[bench]')"
            )
        self.lethe = LetheProcess(args.server_arg)
        self.minimal = MinimalProcess(self.workdir, self.factory, self.params)
        self.pool: ClientPool | None = None
        self.floor: DurableFloor | None = None
        self.stubs: Stubs | None = None
        self.min_stub: Any = None
        self._real: Vectors | None = None
        self._queries: dict[str, Vectors] = {}
        self.names: dict[str, dict[str, int]] = {}

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start both servers, the client pool and the floor."""
        self.lethe.start()
        self._connect()
        self.minimal.start()
        self.min_stub = retrieval_pb2_grpc.RetrievalStub(
            grpc.insecure_channel(self.minimal.address)
        )
        self.pool = ClientPool(max(self.plan.conc_levels))
        self.floor = DurableFloor()

    def _connect(self) -> None:
        if self.stubs is not None:
            self.stubs.close()
        self.stubs = Stubs.insecure(self.lethe.address, self.lethe.token)

    def close(self) -> None:
        """Stop everything this run started."""
        if self.stubs is not None:
            self.stubs.close()
        if self.pool is not None:
            self.pool.close()
        if self.floor is not None:
            self.floor.close()
        self.minimal.stop()
        self.lethe.close()
        for p in self.workdir.glob("*"):
            p.unlink()
        self.workdir.rmdir()

    @property
    def st(self) -> Stubs:
        """The stubs of the running Lethe server."""
        assert self.stubs is not None
        return self.stubs

    # ---------------------------------------------------------------- data

    def vectors(self, kind: str, n: int) -> Vectors:
        """The first ``n`` stored vectors of ``kind`` (``(n, 256) float32``)."""
        if kind == "random":
            return random_unit(n, seed=1)
        if self._real is None:
            self._real = self.embeddings.embed(self.texts)
        return self._real[:n]

    def queries(self, kind: str) -> Vectors:
        """Query vectors of ``kind``: ``(q, 256) float32``, unit rows."""
        if kind not in self._queries:
            if kind == "random":
                self._queries[kind] = random_unit(2000, seed=2)
            else:
                q = self.embeddings.embed(self.corpus.questions)
                self._queries[kind] = np.ascontiguousarray(q[np.linalg.norm(q, axis=1) > 0.5])
        return self._queries[kind]

    def query_texts(self) -> list[str]:
        """The question texts whose embeddings are the ``real`` queries."""
        q = self.embeddings.embed(self.corpus.questions)
        keep = np.linalg.norm(q, axis=1) > 0.5
        return [t for t, k in zip(self.corpus.questions, keep, strict=True) if k]

    def ingest(
        self,
        owner: str,
        x: Vectors,
        thread_len: int,
        *,
        text_offset: int = 0,
        prefix: str = "t",
    ) -> dict[str, float]:
        """Append ``x`` as committed turns of ``owner``, ``thread_len`` per thread.

        Batches are ``min(plan.batch, thread_len)`` turns; appends to distinct
        threads are kept up to 4 in flight (the server's writer groups them),
        appends to one thread one at a time. Records every turn's name.

        Args:
            owner: Owner id.
            x: ``(n, 256) float32`` vectors; texts are the benchmark's texts from
                ``text_offset``.
            thread_len: Turns per thread.
            text_offset: Index of the first text.
            prefix: Thread ids are ``{prefix}{j}``.

        Returns:
            ``turns``, ``seconds`` and ``turns_per_s``.
        """
        names = self.names.setdefault(owner, {})
        batch = min(self.plan.batch, thread_len)
        depth = 4 if thread_len <= batch else 1
        inflight: deque[tuple[Any, int]] = deque()

        def drain(keep: int) -> None:
            while len(inflight) > keep:
                fut, lo = inflight.popleft()
                for i, t in enumerate(fut.result().turns):
                    names[t.name] = lo + i

        t0 = time.perf_counter()
        for j, start in enumerate(range(0, len(x), thread_len)):
            thread = self.st.threads.CreateThread(
                threads_pb2.CreateThreadRequest(parent=f"owners/{owner}", thread_id=f"{prefix}{j}"),
                metadata=self.st.md,
            )
            for lo in range(start, min(start + thread_len, len(x)), batch):
                hi = min(lo + batch, start + thread_len, len(x))
                turns = [_turn(self.text(text_offset + i), x[i]) for i in range(lo, hi)]
                drain(depth - 1)
                request = threads_pb2.AppendTurnsRequest(parent=thread.name, turns=turns)
                inflight.append(
                    (self.st.threads.AppendTurns.future(request, metadata=self.st.md), lo)
                )
        drain(0)
        seconds = time.perf_counter() - t0
        return {
            "turns": len(x),
            "seconds": round(seconds, 3),
            "turns_per_s": round(len(x) / seconds),
        }

    def text(self, i: int) -> str:
        """The ``i``-th turn text (wrapping around the benchmark's texts)."""
        return self.texts[i % len(self.texts)]

    def search(self, owner: str, q: Vectors) -> list[int]:
        """One DENSE Lethe search; the hits as row ids of ``owner``'s vectors."""
        got = self.st.retrieval.Search(_dense(f"owners/{owner}", q), metadata=self.st.md)
        names = self.names.get(owner, {})
        return [names.get(h.turn.name, -1) for h in got.hits]

    # -------------------------------------------------------------- search

    def layout_of(self, x: np.ndarray) -> tuple[str, str]:
        """The FAISS layout the floors use for ``x``, so they search Lethe's index type.

        ``--faiss-factory`` when given, else the one Lethe's ``VectorIndex`` chooses
        for these vectors (``(n, d) float32``) added in the server's build chunks
        (exact below ``index.IVF_MIN_VECTORS``, else the calibrated IVF).
        """
        if self.explicit_factory:
            return self.factory, self.params
        from index import VectorIndex
        from server.retrieval import BUILD_CHUNK

        probe = VectorIndex(x.shape[1])
        for start in range(0, len(x), BUILD_CHUNK):
            probe.add(
                np.arange(start, min(start + BUILD_CHUNK, len(x))), x[start : start + BUILD_CHUNK]
            )
        layout = probe.layout
        del probe
        return layout

    def measure_size(self, kind: str, n: int) -> None:
        """Ingest ``{kind}-{n}`` and measure every system on it.

        Sequential and concurrent searches, and Chroma's ef ladder.
        """
        plan = self.plan
        owner = f"{kind}-{n}"
        x = self.vectors(kind, n)
        np.save(self.workdir / f"{owner}.npy", x)
        ingest = self.ingest(owner, x, plan.thread_len)
        _log(f"  ingested {owner}: {ingest}")
        allq = self.queries(kind)
        qs = allq[: min(len(allq), plan.seq_queries)]
        exact_ids, exact_scores = exact_top(x, qs, 10)
        del exact_ids
        faiss.omp_set_num_threads(1)
        factory, params = self.layout_of(x)
        (self.workdir / f"{owner}.layout").write_text(f"{factory}\n{params}\n")
        inproc = build_index(x, factory, params)
        t0 = time.perf_counter()
        self.search(owner, qs[0])
        first_search_s = time.perf_counter() - t0
        settle_s = self.lethe.settle(owner)  # its snapshot written, its sweeper quiet
        _log(f"  {owner}: steady {settle_s:.1f} s after its first search")
        parent = f"owners/{owner}"
        lethe_req = [_dense(parent, q) for q in qs]
        empty_req = [_dense(f"owners/{EMPTY_OWNER}", q) for q in qs]
        list_req = threads_pb2.ListThreadsRequest(parent=f"owners/{EMPTY_OWNER}")
        names = self.names[owner]
        md = self.st.md
        retrieval, threads_stub = self.st.retrieval, self.st.threads
        mstub = self.min_stub
        mprefix = f"{parent}/threads/v/turns/"

        def lethe(i: int) -> list[int]:
            return [
                names.get(h.turn.name, -1) for h in retrieval.Search(lethe_req[i], metadata=md).hits
            ]

        def lethe_empty(i: int) -> None:
            retrieval.Search(empty_req[i], metadata=md)

        def empty_call(i: int) -> None:
            threads_stub.ListThreads(list_req, metadata=md)

        def inprocess(i: int) -> list[int]:
            _, ids = inproc.search(qs[i : i + 1], 10)
            return [int(v) for v in ids[0]]

        def minimal(i: int) -> list[int]:
            return [int(h.turn.name.removeprefix(mprefix)) for h in mstub.Search(lethe_req[i]).hits]

        systems: dict[str, Callable[[int], list[int] | None]] = {
            "lethe": lethe,
            "lethe_empty_owner": lethe_empty,
            "empty_call": empty_call,
            "faiss_inprocess": inprocess,
            "minimal_grpc_faiss": minimal,
        }
        chroma: ChromaPeer | None = None
        use_chroma = self.chroma is not None and kind in plan.chroma_kinds and n <= plan.chroma_max
        if self.chroma is not None and not use_chroma:
            self.result["skipped"].append(
                f"chroma {owner}: not in this mode's plan (chroma kinds {plan.chroma_kinds}, "
                f"sizes <= {plan.chroma_max})"
            )
        if use_chroma:
            chroma = ChromaPeer(x)
            peer = chroma

            def chroma_call(i: int) -> list[int]:
                return peer.search(qs[i])

            systems["chroma_default"] = chroma_call
        for call in systems.values():  # warm every system (connections, lazy loads, caches)
            for i in range(plan.round_queries):
                call(i % len(qs))

        # Sequential, interleaved round by round.
        rounds: dict[str, list[list[float]]] = {s: [] for s in systems}
        answers: dict[str, dict[int, list[int]]] = {s: {} for s in systems}
        order = list(systems)
        for r, lo in enumerate(range(0, plan.seq_queries, plan.round_queries)):
            idx = [i % len(qs) for i in range(lo, lo + plan.round_queries)]
            for name in order[r % len(order) :] + order[: r % len(order)]:
                call = systems[name]
                lat: list[float] = []
                for i in idx:
                    t0 = time.perf_counter()
                    got = call(i)
                    lat.append(time.perf_counter() - t0)
                    if got is not None and i not in answers[name]:
                        answers[name][i] = got
                rounds[name].append(lat)
        seq: dict[str, Any] = {}
        for name, per_round in rounds.items():
            seq[name] = summary([v for rr in per_round for v in rr])
            if answers[name]:
                rec = [recall_at(g, qs[i], x, exact_scores[i]) for i, g in answers[name].items()]
                seq[name]["recall_at_10"] = round(float(np.mean(rec)), 4)
        floor_rounds = [
            [a + b for a, b in zip(e, f, strict=True)]
            for e, f in zip(rounds["empty_call"], rounds["faiss_inprocess"], strict=True)
        ]
        ratios = {
            "lethe_over_minimal": median_ratio(rounds["lethe"], rounds["minimal_grpc_faiss"]),
            "lethe_over_empty_call_plus_faiss": median_ratio(rounds["lethe"], floor_rounds),
            "lethe_p99_over_p50": round(seq["lethe"]["p99_ms"] / seq["lethe"]["p50_ms"], 3),
            "fixed_cost_ms": round(
                seq["lethe_empty_owner"]["p50_ms"] - seq["empty_call"]["p50_ms"], 4
            ),
        }
        if chroma is not None:
            ratios["lethe_over_chroma_default"] = median_ratio(
                rounds["lethe"], rounds["chroma_default"]
            )
        entry: dict[str, Any] = {
            "kind": kind,
            "n": n,
            "owner": owner,
            "queries": len(qs),
            "ingest": ingest,
            "first_search_after_ingest_s": round(first_search_s, 3),
            "settle_s": round(settle_s, 1),
            "faiss_layout": f"{factory} {params}".strip(),
            "sequential": seq,
            "ratios": ratios,
            "empty_plus_faiss_p50_ms": round(
                seq["empty_call"]["p50_ms"] + seq["faiss_inprocess"]["p50_ms"], 4
            ),
        }
        if plan.conc_sizes is None or n in plan.conc_sizes:
            entry["concurrency"] = self.measure_concurrency(owner, qs, systems, chroma, inprocess)
        if chroma is not None:
            entry["chroma"] = self.chroma_ladder(chroma, qs, x, exact_scores, seq)
            chroma.close()
        self.result.setdefault("search", []).append(entry)
        lethe_p50, mini_p50 = seq["lethe"]["p50_ms"], seq["minimal_grpc_faiss"]["p50_ms"]
        _log(
            f"  {owner}: lethe p50 {lethe_p50} ms, minimal {mini_p50} ms,"
            f" ratio {ratios['lethe_over_minimal']['median']}"
        )
        (self.workdir / f"{owner}.npy").unlink()

    def measure_concurrency(
        self,
        owner: str,
        qs: Vectors,
        systems: dict[str, Callable[[int], list[int] | None]],
        chroma: ChromaPeer | None,
        inprocess: Callable[[int], list[int]],
    ) -> dict[str, Any]:
        """QPS and latency at each concurrency level, systems interleaved per round."""
        plan = self.plan
        assert self.pool is not None
        pool = self.pool
        qlist = [q.tolist() for q in qs[: plan.conc_queries]]
        nq = len(qlist)
        secs = plan.conc_seconds
        token = self.lethe.token
        grpc_batches = {
            "lethe": CallBatch(self.lethe.address, "search", f"owners/{owner}", qlist, token, secs),
            "empty_call": CallBatch(
                self.lethe.address, "list_threads", f"owners/{EMPTY_OWNER}", [], token, secs
            ),
            "minimal_grpc_faiss": CallBatch(
                self.minimal.address, "search", f"owners/{owner}", qlist, "", secs
            ),
        }
        local: dict[str, Callable[[int], object]] = {"faiss_inprocess": inprocess}
        if chroma is not None:
            local["chroma_default"] = systems["chroma_default"]
        names = [*grpc_batches, *local]
        out: dict[str, Any] = {
            "harness": "gRPC systems: client processes (spawned, one channel each); "
            "in-process peers: threads of the benchmark process",
            "seconds_per_run": secs,
            "levels": {},
        }
        for c in plan.conc_levels:
            runs: dict[str, list[list[RunResult]]] = {s: [] for s in names}
            for r in range(plan.conc_rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    if name in grpc_batches:
                        runs[name].append(pool.run(grpc_batches[name], c))
                    else:
                        runs[name].append(run_threads(local[name], nq, c, secs))
            level: dict[str, Any] = {}
            for name, rr in runs.items():
                lat = [v for one in rr for res in one for v in res.latencies]
                qps = [qps_of(one) for one in rr]
                level[name] = {**summary(lat), "qps": round(float(np.median(qps)), 1)}
            level["lethe_qps_over_minimal"] = round(
                level["lethe"]["qps"] / max(level["minimal_grpc_faiss"]["qps"], 1e-9), 3
            )
            out["levels"][str(c)] = level
        return out

    def chroma_ladder(
        self,
        chroma: ChromaPeer,
        qs: Vectors,
        x: Vectors,
        exact_scores: Vectors,
        seq: dict[str, Any],
    ) -> dict[str, Any]:
        """Chroma's recall@10 and speed at its default ef and up a ladder to >= 0.99."""
        plan = self.plan
        nq = min(len(qs), plan.chroma_recall_queries)
        steps: list[dict[str, Any]] = [
            {
                "ef_search": chroma.default_ef,
                "recall_at_10": seq["chroma_default"]["recall_at_10"],
                "p50_ms": seq["chroma_default"]["p50_ms"],
                "qps_sequential": round(1e3 / seq["chroma_default"]["mean_ms"], 1),
            }
        ]
        for ef in plan.chroma_efs:
            if steps[-1]["recall_at_10"] >= 0.99:
                break
            chroma.set_ef(ef)
            chroma.search(qs[0])
            lat: list[float] = []
            rec: list[float] = []
            for i in range(nq):
                t0 = time.perf_counter()
                got = chroma.search(qs[i])
                lat.append(time.perf_counter() - t0)
                rec.append(recall_at(got, qs[i], x, exact_scores[i]))
            s = summary(lat)
            steps.append(
                {
                    "ef_search": ef,
                    "recall_at_10": round(float(np.mean(rec)), 4),
                    "p50_ms": s["p50_ms"],
                    "qps_sequential": round(1e3 / s["mean_ms"], 1),
                }
            )
        reached = [s for s in steps if s["recall_at_10"] >= 0.99]
        if reached and reached[0]["ef_search"] == chroma.ef:  # the ef in force
            c = max(plan.conc_levels)
            runs = run_threads(lambda i: chroma.search(qs[i]), nq, c, plan.conc_seconds)
            reached[0][f"qps_{c}_threads"] = round(qps_of(runs), 1)
        return {
            "version": self.chroma,
            "client": "PersistentClient in a temporary directory, in process",
            "build_s": round(chroma.build_s, 2),
            "ladder": steps,
            "at_recall_0_99": reached[0] if reached else None,
            "note": "" if reached else "recall 0.99 not reached within the ladder",
        }

    # ---------------------------------------------------------- after write

    def measure_after_write(self) -> None:
        """First HYBRID/LEXICAL/DENSE search after a one-turn write vs the steady p50."""
        plan = self.plan
        kind = "real" if "real" in plan.kinds else plan.kinds[0]
        n = max([s for s in plan.sizes if s <= plan.after_write_size] or plan.sizes[:1])
        owner = f"{kind}-{n}"
        parent = f"owners/{owner}"
        qv = self.queries(kind)
        qt = self.query_texts()
        md = self.st.md
        retrieval = self.st.retrieval

        def request(
            mode: retrieval_pb2.SearchRequest.Mode.ValueType, i: int
        ) -> retrieval_pb2.SearchRequest:
            j = i % min(len(qv), len(qt))
            vec = qv[j].tolist() if mode != LEXICAL else []
            text = qt[j] if mode != DENSE else ""
            return retrieval_pb2.SearchRequest(
                parent=parent, query_text=text, query_embedding=vec, top_k=10, mode=mode
            )

        modes = {"HYBRID": HYBRID, "LEXICAL": LEXICAL, "DENSE": DENSE}
        for value in modes.values():
            retrieval.Search(request(value, 0), metadata=md)
        steady: dict[str, list[float]] = {m: [] for m in modes}
        for i in range(plan.steady_queries):
            for m, value in modes.items():
                req = request(value, i)
                t0 = time.perf_counter()
                retrieval.Search(req, metadata=md)
                steady[m].append(time.perf_counter() - t0)
        thread = self.st.threads.CreateThread(
            threads_pb2.CreateThreadRequest(parent=parent, thread_id="after-write"), metadata=md
        ).name
        extra = random_unit(plan.after_write_reps * len(modes), seed=5)
        first: dict[str, list[float]] = {m: [] for m in modes}
        second: dict[str, list[float]] = {m: [] for m in modes}
        k = 0
        for rep in range(plan.after_write_reps):
            for m, value in modes.items():
                self.st.threads.AppendTurns(
                    threads_pb2.AppendTurnsRequest(
                        parent=thread,
                        turns=[_turn(f"after write {rep} {m} " + self.text(k), extra[k])],
                    ),
                    metadata=md,
                )
                k += 1
                for bucket in (first, second):
                    req = request(value, 1000 + rep)
                    t0 = time.perf_counter()
                    retrieval.Search(req, metadata=md)
                    bucket[m].append(time.perf_counter() - t0)
        out: dict[str, Any] = {"owner": owner, "n": n, "reps": plan.after_write_reps, "modes": {}}
        for m in modes:
            s, f, f2 = summary(steady[m]), summary(first[m]), summary(second[m])
            out["modes"][m] = {
                "steady": s,
                "first_after_write": f,
                "second_after_write": f2,
                "first_over_steady_p50": round(f["p50_ms"] / s["p50_ms"], 2),
            }
        self.result["after_write"] = out

    # --------------------------------------------------------------- writes

    def measure_writes(self) -> None:
        """AppendTurns throughput: cold/warm x new threads/long thread."""
        plan = self.plan
        owner = "append"
        base = random_unit(plan.append_base + plan.append_long, seed=3)
        setup = [self.ingest(owner, base[: plan.append_base], plan.thread_len)]
        setup.append(self.ingest(owner, base[plan.append_base :], plan.append_long, prefix="long"))
        long_thread = f"owners/{owner}/threads/long0"
        md = self.st.md
        b = plan.batch
        fresh = random_unit(4 * plan.append_batches * b, seed=4)
        used = 0
        out: dict[str, Any] = {
            "owner_turns_before": plan.append_base + plan.append_long,
            "long_thread_turns_before": plan.append_long,
            "batch": b,
            "setup": setup,
            "phases": {},
        }
        new_threads = 0
        for phase in ("cold", "warm"):
            if phase == "warm":
                t0 = time.perf_counter()
                self.search(owner, fresh[0])
                out["warm_first_search_s"] = round(time.perf_counter() - t0, 3)
            rates: dict[str, list[float]] = {"new_threads": [], "long_thread": []}
            create: list[float] = []
            for _ in range(plan.append_batches):
                for target in ("new_threads", "long_thread"):
                    if target == "new_threads":
                        t0 = time.perf_counter()
                        parent = self.st.threads.CreateThread(
                            threads_pb2.CreateThreadRequest(
                                parent=f"owners/{owner}", thread_id=f"new{new_threads}"
                            ),
                            metadata=md,
                        ).name
                        create.append(time.perf_counter() - t0)
                        new_threads += 1
                    else:
                        parent = long_thread
                    turns = [_turn(self.text(used + i), fresh[used + i]) for i in range(b)]
                    used += b
                    req = threads_pb2.AppendTurnsRequest(parent=parent, turns=turns)
                    t0 = time.perf_counter()
                    self.st.threads.AppendTurns(req, metadata=md)
                    rates[target].append(b / (time.perf_counter() - t0))
            out["phases"][phase] = {
                t: {
                    "batches": len(r),
                    "turns_per_s_median": round(float(np.median(r))),
                    "turns_per_s_min": round(float(np.min(r))),
                    "turns_per_s_max": round(float(np.max(r))),
                }
                for t, r in rates.items()
            }
            out["phases"][phase]["create_thread"] = summary(create)
        out["long_thread_turns_after"] = plan.append_long + 2 * plan.append_batches * b
        self.result["writes"] = out

    # --------------------------------------------------------------- forget

    def measure_forget(self) -> None:
        """Forget latencies against the durability floor of the same record count."""
        plan = self.plan
        assert self.floor is not None
        owner = "forget"
        parent = f"owners/{owner}"
        long_len = plan.forget_long
        assert plan.range_rounds * plan.forget_range <= long_len
        in_threads = max(plan.forget_turns - long_len, plan.thread_len * 2 * plan.forget_rounds)
        x = random_unit(in_threads + long_len, seed=6)
        self.ingest(owner, x[:in_threads], plan.thread_len)
        self.ingest(owner, x[in_threads:], long_len, prefix="long", text_offset=in_threads)
        n_threads = in_threads // plan.thread_len
        md = self.st.md
        lifecycle, memories = self.st.lifecycle, self.st.memories
        t0 = time.perf_counter()
        self.search(owner, x[0])
        warm_s = time.perf_counter() - t0
        lineage = self.st.threads.CreateThread(
            threads_pb2.CreateThreadRequest(parent=parent, thread_id="lineage"), metadata=md
        ).name
        mem_vecs = random_unit(plan.descendants * plan.forget_rounds, seed=7)
        ops = ("turn", "thread", "descendants", "range")
        lethe_t: dict[str, list[float]] = {o: [] for o in ops}
        floor_t: dict[str, list[float]] = {o: [] for o in ops}
        deleted: dict[str, list[int]] = {o: [] for o in ops}

        def prepare_lineage(r: int) -> str:
            src = self.st.threads.AppendTurns(
                threads_pb2.AppendTurnsRequest(
                    parent=lineage, turns=[_turn(f"lineage source {r}", x[r])]
                ),
                metadata=md,
            ).turns[0]
            half = plan.descendants // 2
            first: list[tuple[str, int]] = []
            for i in range(plan.descendants):
                src_ref = (src.name, src.version) if i < half else first[i % len(first)]
                created = memories.CreateMemory(
                    memories_pb2.CreateMemoryRequest(
                        parent=parent,
                        memory=memories_pb2.Memory(
                            kind=memories_pb2.Memory.FACT,
                            text=f"derived {r}.{i}",
                            sources=[common_pb2.SourceRef(name=src_ref[0], version=src_ref[1])],
                            state=common_pb2.COMMITTED,
                            embedding=mem_vecs[r * plan.descendants + i].tolist(),
                        ),
                    ),
                    metadata=md,
                )
                if i < half:
                    first.append((created.name, created.version))
            return str(src.name)

        for r in range(plan.forget_rounds):
            for op in ops if r < plan.range_rounds else ops[:-1]:
                if op == "turn":
                    req = lifecycle_pb2.ForgetRequest(
                        names=[f"{parent}/threads/t{r}/turns/{plan.thread_len // 2}"]
                    )
                elif op == "thread":
                    req = lifecycle_pb2.ForgetRequest(
                        names=[f"{parent}/threads/t{n_threads - 1 - r}"]
                    )
                elif op == "descendants":
                    req = lifecycle_pb2.ForgetRequest(names=[prepare_lineage(r)])
                else:
                    lo = r * plan.forget_range + 1
                    req = lifecycle_pb2.ForgetRequest(
                        range=lifecycle_pb2.TurnRange(
                            thread=f"{parent}/threads/long0",
                            from_seq=lo,
                            to_seq=lo + plan.forget_range - 1,
                        )
                    )
                t0 = time.perf_counter()
                receipt = lifecycle.Forget(req, metadata=md)
                lethe_t[op].append(time.perf_counter() - t0)
                deleted[op].append(int(receipt.deleted))
                floor_t[op].append(self.floor.measure(max(1, int(receipt.deleted))))
        out: dict[str, Any] = {
            "owner_turns": in_threads + long_len,
            "index_loaded": True,
            "warm_first_search_s": round(warm_s, 3),
            "rounds": plan.forget_rounds,
            "range_rounds": plan.range_rounds,
            "long_thread_turns": long_len,
            "floor": "one synced data write transaction overwriting the records + one "
            "Keystore.destroy of their keys (in process, server durability flags)",
            "ops": {},
        }
        if plan.forget_turns < 30_000:
            out["note"] = (
                f"owner of {in_threads + long_len:,} turns (the issue asks 30,000; quick and "
                "smoke modes use a smaller owner)"
            )
        for op in ops:
            lt, ft = summary(lethe_t[op]), summary(floor_t[op])
            out["ops"][op] = {
                "records_deleted": int(np.median(deleted[op])),
                "lethe": lt,
                "floor": ft,
                "ratio_p50": round(lt["p50_ms"] / ft["p50_ms"], 2),
                "ratio_per_round": median_ratio(
                    [[v] for v in lethe_t[op]], [[v] for v in floor_t[op]]
                ),
            }
        self.result["forget"] = out

    # ---------------------------------------------------------------- build

    def measure_builds(self) -> None:
        """Per size: restart, first Search (build), RSS; and the one-long-thread layout."""
        plan = self.plan
        kind = "random" if "random" in plan.kinds else plan.kinds[0]
        targets = [(f"{kind}-{n}", n, "threads of 100") for n in plan.sizes]
        for n in plan.long_sizes:
            if n in plan.sizes:
                owner = f"long-{n}"
                ing = self.ingest(owner, self.vectors(kind, n), n, prefix="long")
                self.result.setdefault("long_thread_ingest", []).append({"owner": owner, **ing})
                targets.append((owner, n, "one thread"))
        out: list[dict[str, Any]] = []
        qs = self.queries(kind)
        for idx, (owner, n, layout) in enumerate(targets):
            restart_s: float | None = None
            if plan.restart_each or idx == 0:
                restart_s = self.lethe.restart()
                self._connect()
                self.st.threads.ListThreads(
                    threads_pb2.ListThreadsRequest(parent=f"owners/{EMPTY_OWNER}"),
                    metadata=self.st.md,
                )
            self.lethe.reset_peak()
            base = self.lethe.memory()
            t0 = time.perf_counter()
            self.search(owner, qs[0])
            build_s = time.perf_counter() - t0
            after = self.lethe.memory()
            for i in range(plan.build_steady_queries):
                self.search(owner, qs[i % len(qs)])
            steady = self.lethe.memory()
            raw = n * DIM * 4
            entry: dict[str, Any] = {
                "owner": owner,
                "n": n,
                "layout": layout,
                "fresh_restart": restart_s is not None,
                "restart_to_serving_s": None if restart_s is None else round(restart_s, 3),
                "first_search_s": round(build_s, 3),
                "build_us_per_turn": round(build_s / n * 1e6, 1),
                "raw_vector_bytes": raw,
                "rss_base_bytes": base.get("vm_rss", 0),
                "rss_peak_bytes": after.get("vm_hwm", 0),
                "rss_steady_bytes": steady.get("vm_rss", 0),
                "rss_anon_steady_bytes": steady.get("rss_anon", 0),
            }
            if base and after and steady:
                entry["peak_minus_base_over_raw"] = round(
                    (after["vm_hwm"] - base["vm_rss"]) / raw, 2
                )
                entry["steady_minus_base_over_raw"] = round(
                    (steady["vm_rss"] - base["vm_rss"]) / raw, 2
                )
            out.append(entry)
            restarted = "" if restart_s is None else f"restart {restart_s:.2f} s, "
            _log(f"  {owner} ({layout}): {restarted}first search {build_s:.2f} s")
        if not plan.restart_each:
            self.result["notes"].append(
                "build: one restart, then each owner's first Search in turn; RSS figures of "
                "later owners include the indexes loaded before them (the peak is reset "
                "through /proc/PID/clear_refs before each build, so peak - base is that build's)"
            )
        self.result["build"] = out


def _factory_default() -> str | None:
    import index

    value = getattr(index, "FAISS_FACTORY", None)
    return value if isinstance(value, str) else None


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON, Markdown and (with matplotlib) plot to ``--out-dir``.

    Args:
        argv: The command line without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status, 0.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="1k and 20k, short rounds (< 5 min)")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes; only proves it runs")
    parser.add_argument("--large", action="store_true", help="add a 1M-turn owner")
    parser.add_argument("--sizes", type=str, default="", help="comma-separated owner sizes")
    parser.add_argument("--kinds", type=str, default="", help="random,real (default both)")
    parser.add_argument("--locomo", type=Path, default=None, help="path of locomo10.json")
    parser.add_argument("--out-dir", type=Path, default=BENCH / "results")
    parser.add_argument("--name", type=str, default="", help="output file stem (default by mode)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "lethe-bench",
        help="where WordLlama embeddings of the texts are cached (outside the repo)",
    )
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument(
        "--faiss-factory",
        type=str,
        default=_factory_default(),
        help="faiss.index_factory string the floors use for every owner (default: the "
        "layout Lethe's VectorIndex chooses for each owner's vectors; index.FAISS_FACTORY "
        "if the package exports one)",
    )
    parser.add_argument("--faiss-params", type=str, default="", help="faiss ParameterSpace string")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra `lethe serve` flag, repeatable (e.g. --server-arg=--tagger=none)",
    )
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    mode_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    plan = plan_for(mode_name, args.large)
    if args.sizes:
        plan = replace(plan, sizes=[int(s) for s in args.sizes.split(",")])
    if args.kinds:
        plan = replace(plan, kinds=args.kinds.split(","))
    stem = args.name or ("scale" if mode_name == "full" else f"scale-{mode_name}")
    bench = Bench(plan, args)
    result = bench.result
    t_start = time.perf_counter()
    result["machine"] = machine_info()
    result["config"] = {
        **asdict(plan),
        "faiss_factory": bench.factory,
        "faiss_params": bench.params,
        "server_args": bench.lethe.serve_args,
        "corpus": bench.corpus.source,
        "corpus_turns": len(bench.corpus.turns),
        "corpus_questions": len(bench.corpus.questions),
        "argv": sys.argv[1:] if argv is None else argv,
    }
    try:
        bench.start()
        for n in plan.sizes:
            for kind in plan.kinds:
                with _section(result, f"search {kind}-{n}"):
                    bench.measure_size(kind, n)
        with _section(result, "after_write"):
            bench.measure_after_write()
        with _section(result, "writes"):
            bench.measure_writes()
        with _section(result, "forget"):
            bench.measure_forget()
        with _section(result, "build"):
            bench.measure_builds()
    finally:
        bench.close()
    result["total_seconds"] = round(time.perf_counter() - t_start, 1)
    result["machine"]["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.out_dir / f"{stem}.json"
    if not args.no_plot:
        plot = write_plot(result, args.out_dir / f"{stem}.png")
        if plot is None:
            result["skipped"].append("plot: skipped: not installed (matplotlib)")
        else:
            result["plot"] = plot.name
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    md_path = args.out_dir / f"{stem}.md"
    write_markdown(result, md_path)
    for line in result["skipped"]:
        print(line)
    print(f"written: {json_path} {md_path} ({result['total_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
