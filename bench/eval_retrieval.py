"""Offline retrieval evaluation on LoCoMo: every leg, the fusions, and their tuning.

No server: each LoCoMo conversation (Maharana et al., ACL 2024; CC BY-NC 4.0, read from
``../shared/data/locomo/locomo10.json`` and never copied into this repository) is one
owner; every turn is one memory, indexed in an :class:`index.VectorIndex` (WordLlama,
the shipped embedder) and in :class:`index.LexicalIndex` (BM25). Each question of
categories 1-4 with evidence is searched among its own conversation's turns only.

Scoring follows ``shared/data/README.md``: evidence ids normalised by
``lethe.locomo.normalise_evidence`` (unmatched ids dropped, items left empty skipped);
recall@k = |R ∩ E| / |E| averaged over items, k ∈ {1, 5, 10, 20}.

Memory texts per turn:

- plain: ``"{speaker}: {text}"`` (``text`` already carries ``" [image: {caption}]"``);
- contextual: ``"{date}. {previous turn's plain text} {plain text}"`` where ``date`` is
  the session date as ``"8 May 2023"`` and the previous turn is the one before it in
  the same session (none for a session's first turn).

Legs: DENSE (embed query, FAISS exact cosine), LEXICAL (BM25 over plain texts),
LEXICAL-ctx (BM25 over contextual texts), and the session and time legs as the server
builds them — SESSION (:class:`index.SessionIndex`: one document per session, date plus
every turn; the members of the best few sessions with their session's score), PRIOR
(:meth:`index.TimeIndex.prior`: for when-questions, the candidates of the first three
legs whose text carries a time expression) and WINDOW (:meth:`index.TimeIndex.window`:
for questions naming a date, month or year, the turns of sessions on or just after it).
A LoCoMo session is one Lethe thread (the demo ingests it so) said on one day.

HYBRID variants fuse leg lists of depth ``--depth`` with :func:`index.rrf` or
:func:`index.convex_fusion`. The three-leg families are grid-searched as before; the
six-leg convex fusion is tuned by coordinate search (each weight moved by ±0.05 and
±0.1, then the number of sessions and the window's slack, until no move improves),
starting from the three-leg weights (0.2, 0.2, 0.6) and 0.3 for each new leg. The
objective is the sum of recall@1/5/10/20 on the tuning split (conversations 1-5); the
result is reported on the held-out split (6-10) and on all ten, beside the shipped
configuration (:data:`index.HYBRID_TUNED_WEIGHTS`), which must be what the search finds.
Latency p50 per query is measured per mode in this run: dense = embed + FAISS search;
lexical = ``LexicalIndex.search``; hybrid = every leg it uses + fusion.

``--memorybank`` also evaluates MemoryBank (Zhong et al., AAAI 2024; MIT; read from
``../shared/data/memorybank/``). It has no evidence annotations, so recall of evidence
cannot be measured; what can be is narrower: 35 of its 100 probing questions name the
day they ask about ("On May 4th, I shared..."), and for those the day's session is
taken as the gold — *day-hit@k*, whether a top-k turn was said that day. It measures
whether retrieval reaches the right conversation (which the session-date window does
by construction), not whether it finds the answering turn.

Usage::

    .venv/bin/python bench/eval_retrieval.py [--locomo PATH] [--memorybank]
        [--embedder wordllama|onnx:DIR] [--compare-libraries]

``--compare-libraries`` also measures tantivy (if installed) against bm25s: recall,
query latency and update cost, and the bm25s rebuild cost at 700 and 10,000 documents.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from index import (
    HYBRID_LOWER_BOUNDS,
    HYBRID_SESSIONS,
    HYBRID_TUNED_WEIGHTS,
    HYBRID_WEIGHTS,
    WINDOW_DEPTH,
    WINDOW_SLACK,
    Embedder,
    LexicalIndex,
    NamedPeriod,
    SessionIndex,
    TimeIndex,
    VectorIndex,
    analyze,
    convex_fusion,
    load_embedder,
    rrf,
)
from lethe.locomo import load_locomo, normalise_evidence

KS = (1, 5, 10, 20)
CATS = (1, 2, 3, 4)
Ranked = list[tuple[int, float]]
_DEFAULT_LOCOMO = Path(__file__).resolve().parents[2] / "shared/data/locomo/locomo10.json"
_DEFAULT_MEMORYBANK = Path(__file__).resolve().parents[2] / "shared/data/memorybank"
SESSION_DEPTHS = (1, 2, 3, 4, 5)
"""Numbers of sessions the session leg may keep. The search takes the largest; more
would raise recall a little on conversations 1-5 (offered up to 15 it takes 12: objective
+0.013), but each session adds its ~20 members to every fusion: 12 sessions measured
HYBRID p50 1.32x DENSE over gRPC (``bench/bench_search.py``) against 1.24x with 5 in
the same hour, past the latency goal's bound of 1.2x (:func:`goals`)."""
DAY = 86400.0
SLACKS = {  # (day slack, month slack) in days -> WINDOW_SLACK-like mapping
    (d, m): {"day": d * DAY, "month": m * DAY, "year": 0.0} for d in (0, 1, 3) for m in (0, 14, 31)
}


@dataclass
class Owner:
    """One conversation indexed as one owner."""

    name: str
    dia: list[str]  # position -> dia_id; the position is the memory id
    plain: list[str]
    contextual: list[str]
    session: list[str] = field(default_factory=list)  # position -> session key
    date: list[str] = field(default_factory=list)  # position -> its session's date text
    time: list[float] = field(default_factory=list)  # position -> seconds since the epoch


@dataclass
class Query:
    """One question with its normalised evidence."""

    owner: int
    question: str
    category: int
    evidence: set[str]


@dataclass
class Legs:
    """The ranked lists of every leg for one query."""

    dense: Ranked
    lexical: Ranked
    contextual: Ranked
    sessions: dict[int, Ranked] = field(default_factory=dict)  # by sessions kept
    prior: Ranked = field(default_factory=list)
    periods: list[NamedPeriod] = field(default_factory=list)


@dataclass
class Indexes:
    """Every owner's three indexes, in owner order."""

    dense: list[VectorIndex]
    lexical: list[LexicalIndex]
    contextual: list[LexicalIndex]
    sessions: list[SessionIndex] = field(default_factory=list)
    times: list[TimeIndex] = field(default_factory=list)


def _date(ts: float) -> str:
    d = datetime.fromtimestamp(ts, tz=UTC)
    return f"{d.day} {d.strftime('%B %Y')}"


def contextual_text(date: str, previous: str | None, plain: str) -> str:
    """The contextual memory text: session date, previous turn, the turn itself."""
    return f"{date}. {previous} {plain}" if previous else f"{date}. {plain}"


def load(path: Path) -> tuple[list[Owner], list[Query], int]:
    """Owners and queries (categories 1-4 with evidence); also the dropped-reference count."""
    owners: list[Owner] = []
    queries: list[Query] = []
    dropped = 0
    for conv in load_locomo(path):
        owner = Owner(conv.sample_id, [], [], [])
        for n, turns in conv.sessions.items():
            previous: str | None = None
            for speaker, dia, text in turns:
                plain = f"{speaker}: {text}"
                owner.dia.append(dia)
                owner.plain.append(plain)
                owner.contextual.append(contextual_text(_date(conv.dates[n]), previous, plain))
                owner.session.append(f"session-{n}/{_date(conv.dates[n])}")
                owner.date.append(_date(conv.dates[n]))
                owner.time.append(conv.dates[n])
                previous = plain
        known = set(owner.dia)
        for qa in conv.qa:
            if int(qa["category"]) not in CATS:
                continue
            ev, d = normalise_evidence([str(e) for e in qa.get("evidence", [])], known)
            dropped += d
            if ev:
                queries.append(
                    Query(len(owners), str(qa["question"]), int(qa["category"]), set(ev))
                )
        owners.append(owner)
    return owners, queries, dropped


def _dense_search(embedder: Embedder, index: VectorIndex, question: str, depth: int) -> Ranked:
    q = embedder.embed_queries([question])
    if not np.any(q):
        return []
    return index.search(q[0], depth)


def build(owners: list[Owner], embedder: Embedder) -> Indexes:
    """Index every owner's turns for every leg.

    Dense over plain texts, BM25 over plain and contextual texts, sessions, and turn
    times with their time expressions.
    """
    out = Indexes([], [], [])
    for owner in owners:
        ids = np.arange(len(owner.dia), dtype=np.int64)
        vix = VectorIndex(embedder.dim)
        vix.add(ids, embedder.embed(owner.plain))
        lix = LexicalIndex()
        lix.add(ids, owner.plain)
        cix = LexicalIndex()
        cix.add(ids, owner.contextual)
        lix.search("warm up", 1)  # build the BM25 scorers before timing
        cix.search("warm up", 1)
        six = SessionIndex()
        six.add(ids, owner.session, owner.plain, owner.date)
        tix = TimeIndex()
        tix.add(ids, owner.time, owner.plain)
        out.dense.append(vix)
        out.lexical.append(lix)
        out.contextual.append(cix)
        out.sessions.append(six)
        out.times.append(tix)
    return out


def run_legs(ix: Indexes, queries: list[Query], depth: int, embedder: Embedder) -> list[Legs]:
    """Run every query through every leg, keeping ``depth`` results per BM25/dense leg.

    The session leg runs for each of :data:`SESSION_DEPTHS`; the window leg is made per
    slack (:func:`windows`).
    """
    out = []
    for q in queries:
        g = Legs(
            _dense_search(embedder, ix.dense[q.owner], q.question, depth),
            ix.lexical[q.owner].search(q.question, depth),
            ix.contextual[q.owner].search(q.question, depth),
        )
        g.sessions = {s: ix.sessions[q.owner].search(q.question, s) for s in SESSION_DEPTHS}
        found = {i for leg in (g.dense, g.lexical, g.contextual) for i, _ in leg}
        g.prior = ix.times[q.owner].prior(q.question, found)
        g.periods = ix.times[q.owner].periods(q.question)
        out.append(g)
    return out


def windows(
    ix: Indexes, queries: list[Query], legs: list[Legs], slack: dict[str, float]
) -> list[Ranked]:
    """The session-date window leg of every query with ``slack``."""
    return [
        ix.times[q.owner].window(g.periods, WINDOW_DEPTH, slack)
        for q, g in zip(queries, legs, strict=True)
    ]


def latency(ix: Indexes, queries: list[Query], depth: int, embedder: Embedder) -> dict[str, float]:
    """Per-query p50 (microseconds) of each mode, one pass over all queries per mode."""
    clock = time.perf_counter

    def dense(q: Query) -> Ranked:
        return _dense_search(embedder, ix.dense[q.owner], q.question, depth)

    def lexical(q: Query) -> Ranked:
        return ix.lexical[q.owner].search(q.question, depth)

    def contextual(q: Query) -> Ranked:
        return ix.contextual[q.owner].search(q.question, depth)

    def hybrid3(q: Query) -> Ranked:
        return three_legs(Legs(dense(q), lexical(q), contextual(q)))

    def hybrid(q: Query) -> Ranked:  # as the server: the query analysed once
        terms = analyze(q.question)
        g = Legs(
            dense(q),
            ix.lexical[q.owner].search_terms(terms, depth),
            ix.contextual[q.owner].search_terms(terms, depth),
        )
        times = ix.times[q.owner]
        found = {i for leg in (g.dense, g.lexical, g.contextual) for i, _ in leg}
        return convex_fusion(
            [
                g.dense,
                g.lexical,
                g.contextual,
                ix.sessions[q.owner].search_terms(terms, HYBRID_SESSIONS),
                times.prior(q.question, found),
                times.window(times.periods(q.question), WINDOW_DEPTH),
            ],
            HYBRID_WEIGHTS,
            HYBRID_LOWER_BOUNDS,
        )

    modes: dict[str, Callable[[Query], Ranked]] = {
        "DENSE (embed + FAISS)": dense,
        "LEXICAL (plain)": lexical,
        "LEXICAL (contextual)": contextual,
        "HYBRID 3 legs (+ fusion)": hybrid3,
        "HYBRID shipped (6 legs + fusion)": hybrid,
    }
    out = {}
    for name, run in modes.items():
        times = []
        for q in queries:
            t0 = clock()
            run(q)
            times.append(clock() - t0)
        out[name] = _p50_us(times)
    return out


Fuser = Callable[[Legs], Ranked]


def recall(
    owners: list[Owner], queries: list[Query], ranked: Sequence[Ranked]
) -> dict[int | str, list[float]]:
    """Recall@k per category and overall ("all"), as lists over ``KS``."""
    per: dict[int | str, list[list[float]]] = defaultdict(list)
    for q, hits in zip(queries, ranked, strict=True):
        dia = owners[q.owner].dia
        found = [dia[i] for i, _ in hits[: max(KS)]]
        row = [len(set(found[:k]) & q.evidence) / len(q.evidence) for k in KS]
        per[q.category].append(row)
        per["all"].append(row)
    return {key: [float(v) for v in np.mean(rows, axis=0)] for key, rows in per.items()}


def _split(queries: list[Query], owners: set[int]) -> list[int]:
    return [i for i, q in enumerate(queries) if q.owner in owners]


def _fmt(r: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in r)


def print_table(
    title: str,
    owners: list[Owner],
    queries: list[Query],
    modes: dict[str, list[Ranked]],
    splits: dict[str, list[int]],
) -> None:
    """Print recall@1/5/10/20 per mode, split and category."""
    print(f"\n== {title}: recall@{'/'.join(map(str, KS))} ==")
    header = f"{'mode':<34}{'split':<10}" + "".join(f"{'cat' + str(c):<25}" for c in CATS)
    print(header + "overall (cats 1-4)")
    for name, ranked in modes.items():
        for split, idx in splits.items():
            r = recall(owners, [queries[i] for i in idx], [ranked[i] for i in idx])
            cats = "".join(f"{_fmt(r[c]):<25}" for c in CATS)
            print(f"{name:<34}{split:<10}{cats}{_fmt(r['all'])}  (n={len(idx)})")


def _p50_us(values: list[float]) -> float:
    return statistics.median(values) * 1e6


def tune(
    owners: list[Owner],
    queries: list[Query],
    legs: list[Legs],
    tune_idx: list[int],
) -> dict[str, tuple[str, Fuser]]:
    """Grid-search each fusion family on the tuning split; return the best of each."""
    tq = [queries[i] for i in tune_idx]
    tl = [legs[i] for i in tune_idx]

    def objective(fuse: Fuser) -> float:
        r = recall(owners, tq, [fuse(leg) for leg in tl])["all"]
        return r[0] + r[1] + r[2] + r[3]  # mean over k of recall@k, times 4

    grid = [round(x * 0.1, 1) for x in range(11)]
    best: dict[str, tuple[float, str, Fuser]] = {}

    def consider(family: str, label: str, fuse: Fuser) -> None:
        score = objective(fuse)
        if family not in best or score > best[family][0]:
            best[family] = (score, label, fuse)

    for wd in grid:
        w = (wd, round(1.0 - wd, 1))
        pair = f"({w[0]:.1f},{w[1]:.1f})"
        consider("convex dense+lexical", f"convex w(dense,lex)={pair}", _convex2(w, "lexical"))
        consider("convex dense+lexical-ctx", f"convex w(dense,ctx)={pair}", _convex2(w, "ctx"))
        consider("rrf dense+lexical", f"rrf k0=60 w(dense,lex)={pair}", _rrf3((w[0], w[1], 0.0)))
    for wd, wl in itertools.product(grid, grid):
        if wd + wl > 1.0 + 1e-9:
            continue
        w3 = (wd, wl, round(1.0 - wd - wl, 1))
        triple = f"({w3[0]:.1f},{w3[1]:.1f},{w3[2]:.1f})"
        consider("convex dense+lexical+ctx", f"convex w(dense,lex,ctx)={triple}", _convex3(w3))
        for k0 in (5.0, 60.0):
            consider(
                "rrf dense+lexical+ctx",
                f"rrf k0={k0:.0f} w(dense,lex,ctx)={triple}",
                _rrf3(w3, k0),
            )
    return {family: (label, fuse) for family, (_, label, fuse) in best.items()}


def _convex2(w: tuple[float, float], lexical: str) -> Fuser:
    def fuse(g: Legs) -> Ranked:
        other = g.lexical if lexical == "lexical" else g.contextual
        return convex_fusion([g.dense, other], w, [None, 0.0])

    return fuse


def _convex3(w: tuple[float, float, float]) -> Fuser:
    def fuse(g: Legs) -> Ranked:
        return convex_fusion([g.dense, g.lexical, g.contextual], w, [None, 0.0, 0.0])

    return fuse


def _rrf3(w: tuple[float, float, float], k0: float = 60.0) -> Fuser:
    def fuse(g: Legs) -> Ranked:
        return rrf([g.dense, g.lexical, g.contextual], w, k0)

    return fuse


THREE_LEG_WEIGHTS = (0.2, 0.2, 0.6)
"""Three-leg weights shipped before the session and time legs (tuned here on conversations 1-5)."""


def three_legs(g: Legs) -> Ranked:
    """The previous default: dense, lexical and contextual legs, :data:`THREE_LEG_WEIGHTS`."""
    return convex_fusion([g.dense, g.lexical, g.contextual], THREE_LEG_WEIGHTS, [None, 0.0, 0.0])


@dataclass(frozen=True)
class SixLegs:
    """One six-leg convex fusion: weights, sessions kept, window slack (days)."""

    weights: tuple[float, float, float, float, float, float]
    sessions: int
    slack: tuple[int, int]

    def label(self) -> str:
        """This configuration in one line for the report: weights, sessions, slack."""
        w = ",".join(f"{x:g}" for x in self.weights)
        return f"convex w(dense,lex,ctx,sess,prior,window)=({w}) sessions={self.sessions} " + (
            f"slack(day,month)={self.slack} days"
        )


def six_legs(config: SixLegs, legs: Sequence[Legs], window: Sequence[Ranked]) -> list[Ranked]:
    """Fuse every query's six legs with ``config`` (``window`` made with its slack)."""
    return [
        convex_fusion(
            [g.dense, g.lexical, g.contextual, g.sessions[config.sessions], g.prior, w],
            config.weights,
            HYBRID_LOWER_BOUNDS,
        )
        for g, w in zip(legs, window, strict=True)
    ]


SHIPPED = SixLegs(
    HYBRID_TUNED_WEIGHTS,
    HYBRID_SESSIONS,
    (round(WINDOW_SLACK["day"] / DAY), round(WINDOW_SLACK["month"] / DAY)),
)
"""What the library ships (:data:`index.HYBRID_TUNED_WEIGHTS` and friends)."""


def tune_six(
    owners: list[Owner],
    queries: list[Query],
    legs: list[Legs],
    windows_by_slack: dict[tuple[int, int], list[Ranked]],
    tune_idx: list[int],
) -> SixLegs:
    """Coordinate search of the six-leg fusion on the tuning split (module docstring)."""
    tq = [queries[i] for i in tune_idx]
    tl = [legs[i] for i in tune_idx]
    tw = {k: [w[i] for i in tune_idx] for k, w in windows_by_slack.items()}
    seen: dict[SixLegs, float] = {}

    def objective(c: SixLegs) -> float:
        if c not in seen:
            r = recall(owners, tq, six_legs(c, tl, tw[c.slack]))["all"]
            seen[c] = r[0] + r[1] + r[2] + r[3]
        return seen[c]

    best = SixLegs((*THREE_LEG_WEIGHTS, 0.3, 0.3, 0.3), 3, (3, 14))
    for _ in range(20):
        start = objective(best)
        for j in range(6):  # one weight at a time, keeping the best so far
            for step in (0.05, -0.05, 0.1, -0.1):
                w = list(best.weights)
                w[j] = round(w[j] + step, 2)
                if w[j] < 0.0:
                    continue
                c = SixLegs((w[0], w[1], w[2], w[3], w[4], w[5]), best.sessions, best.slack)
                if objective(c) > objective(best) + 1e-12:
                    best = c
        for n in SESSION_DEPTHS:
            c = SixLegs(best.weights, n, best.slack)
            if objective(c) > objective(best) + 1e-12:
                best = c
        for slack in windows_by_slack:
            c = SixLegs(best.weights, best.sessions, slack)
            if objective(c) > objective(best) + 1e-12:
                best = c
        if objective(best) <= start + 1e-12:
            break
    print(f"six-leg coordinate search: {len(seen)} configurations tried")
    return best


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--locomo", type=Path, default=_DEFAULT_LOCOMO)
    parser.add_argument("--depth", type=int, default=30, help="depth of each leg's list")
    parser.add_argument(
        "--embedder", default="wordllama", help="wordllama (default) or onnx:DIR for the dense leg"
    )
    parser.add_argument("--memorybank", nargs="?", const=_DEFAULT_MEMORYBANK, type=Path)
    parser.add_argument("--compare-libraries", action="store_true")
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(1)

    started = time.perf_counter()
    owners, queries, dropped = load(args.locomo)
    print(
        f"{len(owners)} owners, {sum(len(o.dia) for o in owners)} turns, "
        f"{len(queries)} questions (cats 1-4 with evidence), {dropped} evidence refs dropped"
    )
    embedder = load_embedder(args.embedder)
    if embedder is None:
        parser.error("--embedder none has no dense leg to evaluate")
    print(f"dense leg: {embedder.name} ({embedder.dim} dimensions)")
    ix = build(owners, embedder)
    legs = run_legs(ix, queries, args.depth, embedder)
    splits = {
        "tune1-5": _split(queries, {0, 1, 2, 3, 4}),
        "held6-10": _split(queries, {5, 6, 7, 8, 9}),
        "all10": list(range(len(queries))),
    }
    by_slack = {k: windows(ix, queries, legs, v) for k, v in SLACKS.items()}
    families = tune(owners, queries, legs, splits["tune1-5"])
    modes: dict[str, list[Ranked]] = {
        "DENSE": [g.dense for g in legs],
        "LEXICAL (plain)": [g.lexical for g in legs],
        "LEXICAL (contextual)": [g.contextual for g in legs],
    }
    for family, (label, fuse) in families.items():
        print(f"best on tuning split, {family}: {label}")
        modes[f"HYBRID {family}"] = [fuse(g) for g in legs]
    modes["HYBRID 3 legs (before)"] = [three_legs(g) for g in legs]
    found = tune_six(owners, queries, legs, by_slack, splits["tune1-5"])
    print(f"best on tuning split, six legs: {found.label()}")
    print(f"shipped:                        {SHIPPED.label()}")
    print(f"search finds the shipped configuration: {found == SHIPPED}")
    modes["HYBRID 6 legs tuned"] = six_legs(found, legs, by_slack[found.slack])
    shipped = six_legs(SHIPPED, legs, by_slack[SHIPPED.slack])
    w = SHIPPED.weights
    for name, keep in (("+ session", 3), ("+ prior", 4), ("+ window", 5)):
        alone = tuple(x if i < 3 or i == keep else 0.0 for i, x in enumerate(w))
        config = SixLegs(
            (alone[0], alone[1], alone[2], alone[3], alone[4], alone[5]),
            SHIPPED.sessions,
            SHIPPED.slack,
        )
        modes[f"HYBRID 3 legs {name} only"] = six_legs(config, legs, by_slack[SHIPPED.slack])
    modes["HYBRID shipped"] = shipped
    print_table("all modes", owners, queries, modes, splits)

    p50 = latency(ix, queries, args.depth, embedder)
    ratio = p50["HYBRID shipped (6 legs + fusion)"] / p50["DENSE (embed + FAISS)"]
    print("\n== latency per query, p50 (microseconds), one pass per mode ==")
    for name, value in p50.items():
        print(f"{name:<34}{value:8.1f}")
    print(f"HYBRID shipped / DENSE: {ratio:.2f}x")

    print_table(
        f"shipped: {SHIPPED.label()}, depth {args.depth}",
        owners,
        queries,
        {
            k: modes[k]
            for k in (
                "DENSE",
                "LEXICAL (plain)",
                "LEXICAL (contextual)",
                "HYBRID 3 legs (before)",
                "HYBRID shipped",
            )
        },
        splits,
    )
    goals(owners, queries, modes, splits, ratio)
    if args.memorybank:
        memorybank(args.memorybank, embedder, args.depth)
    if args.compare_libraries:
        compare_libraries(owners, queries)
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    return 0


def goals(
    owners: list[Owner],
    queries: list[Query],
    modes: dict[str, list[Ranked]],
    splits: dict[str, list[int]],
    latency_ratio: float,
) -> None:
    """Print the retrieval goals for the shipped HYBRID configuration, met or not.

    The goals are recall@1 and recall@10 floors on all ten conversations and on the
    held-out split; the latency goal (HYBRID p50 at most 1.2x DENSE) is over gRPC,
    so only the offline ratio ``latency_ratio`` is printed beside it.
    """

    def r(mode: str, split: str) -> list[float]:
        idx = splits[split]
        return recall(owners, [queries[i] for i in idx], [modes[mode][i] for i in idx])["all"]

    hyb, held = r("HYBRID shipped", "all10"), r("HYBRID shipped", "held6-10")
    print("\n== goals (HYBRID shipped, cats 1-4) ==")
    for label, value, floor in (
        ("recall@1  all ten ", hyb[0], 0.38),
        ("recall@10 all ten ", hyb[2], 0.74),
        ("recall@1  held-out", held[0], 0.355),
        ("recall@10 held-out", held[2], 0.72),
    ):
        print(f"{label}  {value:.4f}  >= {floor}: {value >= floor}")
    print(
        f"offline HYBRID p50 / DENSE p50 {latency_ratio:.2f} (the goal, <= 1.2, is over gRPC: "
        "bench/bench_search.py and the demo)"
    )


def memorybank(root: Path, embedder: Embedder, depth: int) -> None:
    """Day-hit@k on MemoryBank's probing questions that name a day (module docstring)."""
    import json

    history = json.loads((root / "memory_bank_en.json").read_text())
    probes: dict[str, list[str]] = {}
    for line in (root / "probing_questions_en.jsonl").read_text().splitlines():
        if line.strip():
            for user, questions in json.loads(line).items():
                probes[user.strip()] = list(questions)
    rows: dict[str, list[list[float]]] = defaultdict(list)
    asked = 0
    for key, user in history.items():
        name = key.strip()
        texts, times, days, sessions = [], [], [], []
        for day, pairs in sorted(user["history"].items()):
            when = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
            for pair in pairs:
                for who, text in ((name, pair["query"]), ("AI", pair["response"])):
                    texts.append(f"{who}: {text}")
                    times.append(when)
                    days.append(day)
                    sessions.append(day)
        ids = np.arange(len(texts), dtype=np.int64)
        vix = VectorIndex(embedder.dim)
        vix.add(ids, embedder.embed(texts))
        lix, cix, six, tix = LexicalIndex(), LexicalIndex(), SessionIndex(), TimeIndex()
        lix.add(ids, texts)
        dates = [_date(t) for t in times]
        cix.add(
            ids,
            [
                contextual_text(dates[i], texts[i - 1] if i and days[i - 1] == days[i] else None, t)
                for i, t in enumerate(texts)
            ],
        )
        six.add(ids, sessions, texts, dates)
        tix.add(ids, times, texts)
        for question in probes.get(name, []):
            periods = [p for p in tix.periods(question) if p.granularity == "day"]
            if not periods:
                continue
            asked += 1
            gold = {datetime.fromtimestamp(p.start, UTC).strftime("%Y-%m-%d") for p in periods}
            g = Legs(
                _dense_search(embedder, vix, question, depth),
                lix.search(question, depth),
                cix.search(question, depth),
            )
            g.sessions = {HYBRID_SESSIONS: six.search(question, HYBRID_SESSIONS)}
            found = {i for leg in (g.dense, g.lexical, g.contextual) for i, _ in leg}
            g.prior = tix.prior(question, found)
            window = tix.window(tix.periods(question), WINDOW_DEPTH)
            for mode, ranked in (
                ("HYBRID 3 legs (before)", three_legs(g)),
                ("HYBRID shipped", six_legs(SHIPPED, [g], [window])[0]),
            ):
                got = [days[i] for i, _ in ranked]
                rows[mode].append([1.0 if gold & set(got[:k]) else 0.0 for k in KS])
    print(
        f"\n== MemoryBank: day-hit@{'/'.join(map(str, KS))} over the {asked} probing questions "
        "that name a day (no evidence annotations: the named day's session is the gold) =="
    )
    for mode, values in rows.items():
        print(f"{mode:<26}{_fmt([float(v) for v in np.mean(values, axis=0)])}  (n={len(values)})")


def compare_libraries(owners: list[Owner], queries: list[Query]) -> None:
    """bm25s vs tantivy: recall, query p50, update cost; bm25s rebuild at 700 and 10k docs."""
    print("\n== lexical library comparison (plain texts) ==")
    rng = random.Random(0)
    words = [w for o in owners for t in o.plain for w in t.split()]
    for n in (700, 10_000):
        ix = LexicalIndex()
        ix.add(np.arange(n), [" ".join(rng.choices(words, k=25)) for _ in range(n)])
        costs = []
        for i in range(5):
            ix.remove([i])
            t0 = time.perf_counter()
            ix.search("warm", 1)
            costs.append(time.perf_counter() - t0)
        print(
            f"bm25s rebuild after a change, {n} docs: p50 {statistics.median(costs) * 1e3:.1f} ms"
        )
    lex: list[Ranked] = []
    lat = []
    indexes = []
    for o in owners:
        ix = LexicalIndex(k1=1.2, b=0.75)  # tantivy's fixed BM25 parameters
        ix.add(np.arange(len(o.plain)), o.plain)
        ix.search("warm", 1)
        indexes.append(ix)
    for q in queries:
        t0 = time.perf_counter()
        lex.append(indexes[q.owner].search(q.question, 20))
        lat.append(time.perf_counter() - t0)
    r = recall(owners, queries, lex)["all"]
    print(f"bm25s   (k1=1.2, b=0.75) recall {_fmt(r)}  query p50 {_p50_us(lat):.1f} us")
    try:
        tantivy_measure(owners, queries)
    except ImportError:
        print("tantivy not installed; skipped")


def tantivy_measure(owners: list[Owner], queries: list[Query]) -> None:
    """The same analyzer and BM25 in tantivy's in-RAM index."""
    import tantivy
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    def make() -> tuple[Any, Any]:
        sb = tantivy.SchemaBuilder()
        sb.add_integer_field("id", stored=True, indexed=True, fast=True)
        sb.add_text_field("body", stored=False, tokenizer_name="lethe_en")
        ix = tantivy.Index(sb.build())
        analyzer = (
            tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.regex(r"\w\w+"))
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.custom_stopword(list(STOPWORDS_EN_PLUS)))
            .filter(tantivy.Filter.stemmer("english"))
            .build()
        )
        ix.register_tokenizer("lethe_en", analyzer)
        writer = ix.writer(heap_size=15_000_000, num_threads=1)
        return ix, writer

    built = []
    for o in owners:
        ix, writer = make()
        for i, text in enumerate(o.plain):
            writer.add_document(tantivy.Document(id=i, body=text))
        writer.commit()
        ix.reload()
        built.append((ix, writer))
    ranked: list[Ranked] = []
    lat = []
    for q in queries:
        ix, _ = built[q.owner]
        t0 = time.perf_counter()
        searcher = ix.searcher()
        query = ix.parse_query_lenient(q.question, ["body"])[0]
        hits = searcher.search(query, 20).hits
        ranked.append([(int(searcher.doc(addr)["id"][0]), float(s)) for s, addr in hits])
        lat.append(time.perf_counter() - t0)
    r = recall(owners, queries, ranked)["all"]
    print(f"tantivy (k1=1.2, b=0.75) recall {_fmt(r)}  query p50 {_p50_us(lat):.1f} us")
    ix, writer = built[0]
    costs = []
    for i in range(20):
        t0 = time.perf_counter()
        writer.delete_documents_by_term("id", i)
        writer.add_document(tantivy.Document(id=i, body=owners[0].plain[i]))
        writer.commit()
        ix.reload()
        costs.append(time.perf_counter() - t0)
    print(
        f"tantivy update (delete + add + commit + reload), {len(owners[0].plain)} docs: "
        f"p50 {statistics.median(costs) * 1e3:.1f} ms, max {max(costs) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    raise SystemExit(main())
