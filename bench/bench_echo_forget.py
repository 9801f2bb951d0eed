"""What the echo sweep and guard add to a forget of one turn, on an owner of 20,000 turns.

In-process, on the server's own objects (``Store``, ``Retriever``, ``Lifecycle``;
no gRPC, whose fixed cost would flatter the ratio): one owner of ``--turns``
committed turns in threads of 600, each with a client vector (random unit rows,
256 dimensions: the FAISS removal is part of a forget), its indexes loaded as a
searched owner's are. Then ``--forgets`` forgets of one random turn each, the
policies interleaved so that drift hits them alike:

- ``IGNORE``: declared lineage only (the forget before echoes were looked for);
- ``REPORT``: the sweep (the texts read, BM25 candidates, containment), no guard;
- ``TAINT`` (the default): the sweep, acting on echoes, and a guard (a key in the
  keystore's write group, digest rows in the plan's transaction).

The turns: LoCoMo's 5,882 turns, and past them copies whose words are permuted
per copy (each copy maps every word of the vocabulary to another, a fixed random
bijection of its own), so that every turn is distinct in its words — lengths and
word frequencies stay LoCoMo's — and a forget finds no echo it would not find in
a real owner. ``--near-duplicates`` uses ``bench_scale``'s copies instead
(an interjection and a tag around the same text): every forget then finds the
turn's other copies as echoes and acts on them, the worst case.

Prints the p50, mean, p90 and maximum of each policy (milliseconds), the ratio
of its p50 to ``IGNORE``'s, and how many times its forgets rebuilt a BM25 main
segment (:mod:`index._lexical`: amortised over every change, it lands on
whichever forget crosses the line, whatever its policy, and dominates the mean
and the maximum); ``--json`` writes them too::

    .venv/bin/python bench/bench_echo_forget.py [--turns 20000] [--forgets 300]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _scale_data import load_corpus, random_unit, varied_texts

from server._metrics import Metrics
from server.lifecycle import Lifecycle
from server.retrieval import Retriever
from server.store import ECHO_IGNORE, ECHO_REPORT, ECHO_TAINT, ForgetTargets, Store, TurnDraft
from shredder import KekRing

POLICIES = (ECHO_IGNORE, ECHO_REPORT, ECHO_TAINT)
THREAD_TURNS = 600
"""Turns per thread (a LoCoMo conversation's length)."""
_WORD = re.compile(r"[A-Za-z]+")


def permuted_texts(base: list[tuple[str, str]], n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` turns: ``base``, then copies whose words are permuted per copy (module docstring)."""
    vocab = sorted({w.lower() for _, text in base for w in _WORD.findall(text)})
    out = list(base[:n])
    copy = 1
    while len(out) < n:
        shuffled = vocab[:]
        random.Random(f"{seed}/{copy}").shuffle(shuffled)
        mapping = dict(zip(vocab, shuffled, strict=True))

        def swap(m: re.Match[str], mapping: dict[str, str] = mapping) -> str:
            return mapping[m.group(0).lower()]

        for speaker, text in base[: n - len(out)]:
            out.append((speaker, _WORD.sub(swap, text)))
        copy += 1
    return out


def build(store: Store, owner: str, turns: list[tuple[str, str]], seed: int) -> list[str]:
    """Append ``turns`` committed, in threads of :data:`THREAD_TURNS`; returns the thread ids."""
    vectors = random_unit(len(turns), seed)
    threads = []
    for start in range(0, len(turns), THREAD_TURNS):
        thread = f"t{start // THREAD_TURNS}"
        store.create_thread(owner, thread, "")
        threads.append(thread)
        chunk = turns[start : start + THREAD_TURNS]
        drafts = [
            TurnDraft(
                role=1,
                speaker=speaker,
                text=text,
                time=None,
                embedding=vectors[start + i],
                context_manifest="",
                context_refs=[],
                commit=True,
                pending_ttl=3600.0,
            )
            for i, (speaker, text) in enumerate(chunk)
        ]
        store.append_turns(owner, thread, drafts, "")
    return threads


def _split(plain: str) -> tuple[str, str]:
    speaker, _, text = plain.partition(": ")
    return speaker, text


def main(argv: list[str] | None = None) -> int:
    """Build the owner, run the forgets, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--forgets", type=int, default=300, help="forgets per policy")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--near-duplicates", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    corpus = load_corpus(None)
    if args.near_duplicates:
        texts = [_split(t) for t in varied_texts(corpus.turns, args.turns)]
    else:
        texts = permuted_texts(corpus.turns, args.turns, args.seed)
    os.environ.setdefault("LETHE_KEK", KekRing.generate_env_value())  # in memory, for the run
    owner = "bench"
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "data")
        try:
            started = time.perf_counter()
            threads = build(store, owner, texts, args.seed)
            built = time.perf_counter() - started
            retriever = Retriever(store, None)
            lifecycle = Lifecycle(store, retriever, Metrics())
            started = time.perf_counter()
            retriever.search(owner, "warm", None, 10, None)  # loaded and searched, as in use
            loaded = time.perf_counter() - started
            print(
                f"{len(texts)} turns in {len(threads)} threads appended in {built:.1f} s, "
                f"indexes loaded in {loaded:.1f} s ({corpus.source})",
                flush=True,
            )
            rng = random.Random(args.seed)
            sizes = [min(THREAD_TURNS, len(texts) - i * THREAD_TURNS) for i in range(len(threads))]
            left = {t: list(range(1, n + 1)) for t, n in zip(threads, sizes, strict=True)}
            times: dict[str, list[float]] = {p: [] for p in POLICIES}
            found: dict[str, int] = {p: 0 for p in POLICIES}
            rebuilt: dict[str, int] = {p: 0 for p in POLICIES}
            bundle = retriever.owner_bundle(owner)

            def rebuilds() -> int:
                return bundle.plain.rebuilds + bundle.ctx.rebuilds

            for _ in range(args.forgets):
                for policy in rng.sample(POLICIES, len(POLICIES)):
                    thread = rng.choice(threads)
                    seq = left[thread].pop(rng.randrange(len(left[thread])))
                    targets = ForgetTargets.of(turns=[(thread, seq)])
                    before = rebuilds()
                    t0 = time.perf_counter()
                    try:
                        entry = lifecycle.forget(owner, targets, echoes=policy)
                    except Exception as exc:  # an echo forgotten by an earlier forget
                        if type(exc).__name__ != "RecordDeleted":
                            raise
                        continue
                    times[policy].append(time.perf_counter() - t0)
                    found[policy] += entry.echoes_found
                    rebuilt[policy] += rebuilds() - before
            base = statistics.median(times[ECHO_IGNORE])
            report: dict[str, dict[str, float]] = {}
            for policy in POLICIES:
                p50 = statistics.median(times[policy])
                mean = statistics.fmean(times[policy])
                report[policy] = {
                    "forgets": len(times[policy]),
                    "p50_ms": round(p50 * 1e3, 3),
                    "mean_ms": round(mean * 1e3, 3),
                    "p90_ms": round(float(np.percentile(times[policy], 90)) * 1e3, 3),
                    "max_ms": round(max(times[policy]) * 1e3, 3),
                    "ratio_p50": round(p50 / base, 3),
                    "echoes_found": found[policy],
                    "segment_rebuilds": rebuilt[policy],
                }
                print(
                    f"{policy:<7} forgets {len(times[policy]):4d}  p50 {p50 * 1e3:7.2f} ms  "
                    f"mean {mean * 1e3:7.2f} ms  p90 {report[policy]['p90_ms']:7.2f} ms  "
                    f"max {report[policy]['max_ms']:7.1f} ms  "
                    f"x{p50 / base:5.2f} of IGNORE  echoes found {found[policy]}  "
                    f"BM25 segment rebuilds {rebuilt[policy]}",
                    flush=True,
                )
            if args.json is not None:
                args.json.write_text(json.dumps({"turns": len(texts), **report}, indent=2))
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
