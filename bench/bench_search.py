"""Retrieval hot-path, write and delete benchmark against floors measured in the same run.

Starts ``lethe serve`` as a separate process (so client and server do not share
a GIL), ingests the LoCoMo conversations (``--copies N`` appends each session N
times per owner to grow every owner's index), then measures from this process:

- ``Search`` over gRPC (top_k 10) on every LoCoMo question in each mode
  (HYBRID, DENSE, LEXICAL, interleaved per question);
- floor 1: an empty gRPC call (``grpc.health.v1.Health/Check``) on the same channel;
- floor 2: raw in-process FAISS (``IndexFlatIP``, 1 thread) over the same vectors
  with the same query vectors, plus the cost of embedding the query;
- ``AppendTurns`` throughput (turns/s, batches of ``--batch``) and ``Forget``
  latency of one turn and of one thread.

Prints medians, p99 and ratios, and writes them to ``--out`` (JSON). Usage::

    .venv/bin/python bench/bench_search.py [--copies 1] [--conversations 10]

The machines are shared and noisy: compare ratios within one run, not
absolute figures across runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from _server import served
from grpc_health.v1 import health_pb2

from index import WordLlamaEmbedder
from lethe.client import Client
from lethe.locomo import Conversation, load_locomo, sample_conversation
from lethe.v1 import (
    common_pb2,
    threads_pb2,
)

ROOT = Path(__file__).resolve().parents[1]


def _ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q) * 1e3)


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(_ms(values, 50), 4), "p99_ms": round(_ms(values, 99), 4)}


def _ingest(api: Client, convs: list[Conversation], copies: int, batch: int) -> tuple[float, int]:
    """Append every session ``copies`` times per owner (committed). Returns (s, turns)."""
    total = 0
    start = time.perf_counter()
    for conv in convs:
        for copy in range(copies):
            for n, turns in conv.sessions.items():
                thread = api.create_thread(f"owners/{conv.owner}", thread_id=f"s{n}-c{copy}")
                for i in range(0, len(turns), batch):
                    chunk = turns[i : i + batch]
                    api.append_turns(
                        thread.name,
                        [
                            threads_pb2.TurnInput(
                                role=common_pb2.USER, speaker=spk, text=text, commit=True
                            )
                            for spk, _, text in chunk
                        ],
                    )
                    total += len(chunk)
    return time.perf_counter() - start, total


def main() -> int:
    """Ingest, measure as the module docstring lists, print and write to ``--out`` (JSON).

    Without the LoCoMo file at ``--locomo``, a built-in sample conversation is ingested.

    Returns:
        The exit status, 0.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--locomo", type=Path, default=ROOT.parent / "shared/data/locomo/locomo10.json"
    )
    parser.add_argument("--conversations", type=int, default=10)
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("bench-results.json"))
    args = parser.parse_args()

    convs = load_locomo(args.locomo) if args.locomo.exists() else sample_conversation()
    convs = convs[: args.conversations]
    with (
        served("--metrics-listen", "off") as (port, token),
        Client(f"127.0.0.1:{port}", token) as api,
    ):
        seconds, turns = _ingest(api, convs, args.copies, args.batch)
        print(
            f"ingest: {turns} turns in {seconds:.2f} s = {turns / seconds:.0f} turns/s "
            f"(AppendTurns batches of {args.batch}, committed, server-side embedding)"
        )

        questions = [(c.owner, str(q["question"])) for c in convs for q in c.qa]
        for owner, q in questions[:50]:  # warm every owner's index
            api.search(f"owners/{owner}", query_text=q, top_k=10)
        modes = ("HYBRID", "DENSE", "LEXICAL")
        by_mode: dict[str, list[float]] = {m: [] for m in modes}
        for owner, q in questions:  # interleaved so every mode sees the same machine load
            for mode in modes:
                t0 = time.perf_counter()
                api.search(f"owners/{owner}", query_text=q, top_k=10, mode=mode)
                by_mode[mode].append(time.perf_counter() - t0)
        search = by_mode["HYBRID"]
        empty: list[float] = []
        for _ in range(len(questions)):
            t0 = time.perf_counter()
            api.stubs.health.Check(health_pb2.HealthCheckRequest())
            empty.append(time.perf_counter() - t0)

        embedder = WordLlamaEmbedder()
        faiss.omp_set_num_threads(1)
        owner_texts: dict[str, list[str]] = {}
        for c in convs:
            owner_texts[c.owner] = [
                f"{s}: {t}"
                for _ in range(args.copies)
                for turns in c.sessions.values()
                for s, _, t in turns
            ]
        flats = {}
        for owner, texts in owner_texts.items():
            flat = faiss.IndexFlatIP(embedder.dim)
            flat.add(embedder.embed(texts))
            flats[owner] = flat
        embed_t: list[float] = []
        raw: list[float] = []
        for owner, q in questions:
            t0 = time.perf_counter()
            vec = embedder.embed([q])
            embed_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            flats[owner].search(vec, 10)
            raw.append(time.perf_counter() - t0)

        # Deletes: one turn, then one whole thread, per owner.
        forget_turn: list[float] = []
        forget_thread: list[float] = []
        for c in convs:
            first = next(iter(c.sessions))
            t0 = time.perf_counter()
            api.forget([f"owners/{c.owner}/threads/s{first}-c0/turns/1"])
            forget_turn.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            api.forget([f"owners/{c.owner}/threads/s{first}-c0"])
            forget_thread.append(time.perf_counter() - t0)

        result: dict[str, Any] = {
            "turns": turns,
            "owners": len(convs),
            "vectors_per_owner_median": statistics.median(len(t) for t in owner_texts.values()),
            "queries": len(questions),
            "ingest_turns_per_s": round(turns / seconds, 1),
            "search_grpc_hybrid": _summary(search),
            "search_grpc_dense": _summary(by_mode["DENSE"]),
            "search_grpc_lexical": _summary(by_mode["LEXICAL"]),
            "floor_empty_grpc_call": _summary(empty),
            "floor_raw_faiss": _summary(raw),
            "query_embedding": _summary(embed_t),
            "forget_turn": _summary(forget_turn),
            "forget_thread": _summary(forget_thread),
        }
        p50 = result["search_grpc_hybrid"]["p50_ms"]
        result["ratio_hybrid_over_dense_p50"] = round(
            p50 / result["search_grpc_dense"]["p50_ms"], 2
        )
        result["ratio_search_over_empty_call_p50"] = round(
            p50 / result["floor_empty_grpc_call"]["p50_ms"], 2
        )
        result["ratio_search_over_raw_faiss_plus_embed_p50"] = round(
            p50 / (result["floor_raw_faiss"]["p50_ms"] + result["query_embedding"]["p50_ms"]), 2
        )
        for key, value in result.items():
            print(f"{key:45} {value}")
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
