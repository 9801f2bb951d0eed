"""``LetheStore`` (LangGraph's ``BaseStore`` on Lethe) beside ``InMemoryStore``, in one run.

One ``lethe serve`` (default embedder, WordLlama) in its own process and one
``LetheStore`` on a blocking client; LangGraph's ``InMemoryStore`` (no index)
in this process runs the same operations in the same rounds. Items are small
JSON values (``{"text": ..., "color": ..., "n": ...}``) in one namespace.

What is measured, on a store of ``--items`` items (10,000 by default):

- ``batch``: a ``batch`` of ``--batch`` (1,000) puts of new keys, then one of
  updates of those keys, once per round (seconds; median over rounds). The
  issue's goal: at most 1 s on a 10k-item store.
- ``put``: single ``put`` calls of new keys and of keys the store wrote
  (latency p50), beside a one-turn ``Threads.AppendTurns`` with ``commit``,
  the synced-write floor of one transaction (its ratio, median over rounds:
  about 1 means one call and one synced commit).
- ``filter_search``: ``search(namespace, filter={"color": "red"}, limit=10)``
  without a query (latency p50). The issue's goal: at most 20 ms at 10k items.
  A search reads the owner's items in creation order until ``limit`` matched,
  and red items come early; beside it, the worst cases, which read every
  item of the owner (``--worst-searches`` each per round): ``no_match``, a
  filter no item matches (``{"color": "violet"}``), and ``created_last``, the
  same red filter under the round's namespace, whose items were created after
  every other.

Usage::

    .venv/bin/python bench/bench_langgraph.py               # 10k items, about 2 minutes here
    .venv/bin/python bench/bench_langgraph.py --smoke --out /tmp/langgraph.json

Writes ``bench/results/langgraph.json`` (``--out``). The machine is shared
and noisy: quote the ratios of one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _scale_report import machine_info
from _scale_stats import median_ratio, summary
from _server import served
from langgraph.store.base import BaseStore, PutOp
from langgraph.store.memory import InMemoryStore

from lethe.client import Client
from lethe.langgraph import LetheStore

OWNER = "bench"
NAMESPACE = ("bench", "items")
COLORS = ("red", "blue", "green", "amber", "teal")
WORDS = ("puppy", "cello", "garden", "travel", "music", "recipe", "winter", "doctor", "lake")


def _log(message: str) -> None:
    print(message, flush=True)


def _value(i: int) -> dict[str, Any]:
    word = WORDS[i % len(WORDS)]
    return {"text": f"note {i} about the {word}", "color": COLORS[i % len(COLORS)], "n": i % 10}


def _timed(fn: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """Seconds one call of ``fn(*args, **kwargs)`` took."""
    started = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - started


def _fill(stores: dict[str, BaseStore], items: int, batch: int) -> dict[str, float]:
    """Put ``items`` items in batches of ``batch``; seconds per store."""
    took = dict.fromkeys(stores, 0.0)
    for lo in range(0, items, batch):
        ops = [PutOp(NAMESPACE, f"i{i}", _value(i)) for i in range(lo, min(items, lo + batch))]
        for name, store in stores.items():
            took[name] += _timed(store.batch, ops)
    return took


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, fill both stores, measure every round; the report as a dict."""
    with served("--metrics-listen", "off") as (port, token):
        client = Client(f"127.0.0.1:{port}", token)
        lethe = LetheStore(client, owner=OWNER)
        stores: dict[str, BaseStore] = {"lethe": lethe, "in_memory": InMemoryStore()}
        thread = client.create_thread(f"owners/{OWNER}", thread_id="floor").name
        _log(f"filling {args.items} items in batches of {args.batch}")
        fill = _fill(stores, args.items, args.batch)
        _log(f"  filled: lethe {fill['lethe']:.1f} s, in_memory {fill['in_memory']:.3f} s")
        batch_new: dict[str, list[float]] = {n: [] for n in stores}
        batch_update: dict[str, list[float]] = {n: [] for n in stores}
        put_new: dict[str, list[list[float]]] = {n: [] for n in stores}
        put_update: dict[str, list[list[float]]] = {n: [] for n in stores}
        append: list[list[float]] = []
        search: dict[str, list[list[float]]] = {n: [] for n in stores}
        worst: dict[str, dict[str, list[list[float]]]] = {
            case: {n: [] for n in stores} for case in ("no_match", "created_last")
        }
        for r in range(args.rounds):
            ns = ("bench", f"round{r}")
            new = [PutOp(ns, f"b{i}", _value(i)) for i in range(args.batch)]
            again = [PutOp(ns, f"b{i}", _value(i + 1)) for i in range(args.batch)]
            for name, store in stores.items():
                batch_new[name].append(_timed(store.batch, new))
                batch_update[name].append(_timed(store.batch, again))
            floor: list[float] = []
            for i in range(args.singles):
                turn = {"role": "USER", "text": f"turn {r} {i}", "commit": True}
                floor.append(_timed(client.append_turns, thread, [turn]))
            append.append(floor)
            for name, store in stores.items():
                put_new[name].append(
                    [_timed(store.put, ns, f"p{i}", _value(i)) for i in range(args.singles)]
                )
                put_update[name].append(
                    [_timed(store.put, ns, f"p{i}", _value(i + 1)) for i in range(args.singles)]
                )
                search[name].append(
                    [
                        _timed(store.search, NAMESPACE, filter={"color": "red"})
                        for _ in range(args.searches)
                    ]
                )
                for case, prefix, flt in (
                    ("no_match", NAMESPACE, {"color": "violet"}),
                    ("created_last", ns, {"color": "red"}),
                ):
                    worst[case][name].append(
                        [
                            _timed(store.search, prefix, filter=flt)
                            for _ in range(args.worst_searches)
                        ]
                    )
            _log(
                f"round {r + 1}/{args.rounds}: batch of {args.batch} new "
                f"{batch_new['lethe'][-1]:.3f} s, put p50 "
                f"{statistics.median(put_new['lethe'][-1]) * 1e3:.1f} ms, append p50 "
                f"{statistics.median(floor) * 1e3:.1f} ms, filter search p50 "
                f"{statistics.median(search['lethe'][-1]) * 1e3:.1f} ms"
            )
        lethe.close()
        client.close()

    def flat(rounds: list[list[float]]) -> list[float]:
        return [x for r in rounds for x in r]

    return {
        "config": {**vars(args), "out": str(args.out)},
        "machine": machine_info(),
        "load_average": os.getloadavg(),
        "fill_s": fill,
        "batch": {
            "new_s_median": {n: statistics.median(v) for n, v in batch_new.items()},
            "update_s_median": {n: statistics.median(v) for n, v in batch_update.items()},
            "new_s": batch_new,
            "update_s": batch_update,
        },
        "put": {
            "new": {n: summary(flat(v)) for n, v in put_new.items()},
            "update": {n: summary(flat(v)) for n, v in put_update.items()},
            "append_turns_floor": summary(flat(append)),
            "new_over_append": median_ratio(put_new["lethe"], append),
            "update_over_append": median_ratio(put_update["lethe"], append),
        },
        "filter_search": {
            **{n: summary(flat(v)) for n, v in search.items()},
            "lethe_over_in_memory": median_ratio(search["lethe"], search["in_memory"]),
            **{
                f"worst_{case}": {n: summary(flat(v)) for n, v in by_store.items()}
                for case, by_store in worst.items()
            },
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON report (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=10_000, help="items before the rounds")
    parser.add_argument("--batch", type=int, default=1000, help="puts per batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--singles", type=int, default=50, help="single puts per round")
    parser.add_argument("--searches", type=int, default=20, help="filter searches per round")
    parser.add_argument(
        "--worst-searches", type=int, default=5, help="searches of each worst case per round"
    )
    parser.add_argument("--smoke", action="store_true", help="a short run (200 items)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "langgraph.json"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.items, args.batch, args.rounds, args.singles, args.searches = 200, 100, 2, 5, 3
        args.worst_searches = 2
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    b, p, s = result["batch"], result["put"], result["filter_search"]
    _log(
        f"batch of {args.batch} new puts: lethe {b['new_s_median']['lethe']:.3f} s, "
        f"in_memory {b['new_s_median']['in_memory'] * 1e3:.1f} ms; updates: lethe "
        f"{b['update_s_median']['lethe']:.3f} s"
    )
    _log(
        f"put p50: new {p['new']['lethe']['p50_ms']:.2f} ms, update "
        f"{p['update']['lethe']['p50_ms']:.2f} ms, one-turn AppendTurns "
        f"{p['append_turns_floor']['p50_ms']:.2f} ms; ratios "
        f"{p['new_over_append']['median']:.2f}, {p['update_over_append']['median']:.2f}; "
        f"in_memory put p50 {p['new']['in_memory']['p50_ms'] * 1e3:.1f} µs"
    )
    _log(
        f"filter search p50 at {args.items}: lethe {s['lethe']['p50_ms']:.1f} ms, "
        f"in_memory {s['in_memory']['p50_ms']:.2f} ms "
        f"(ratio {s['lethe_over_in_memory']['median']:.0f})"
    )
    for case in ("no_match", "created_last"):
        w = s[f"worst_{case}"]
        _log(
            f"  worst case {case} (reads every item): lethe {w['lethe']['p50_ms']:.1f} ms, "
            f"in_memory {w['in_memory']['p50_ms']:.2f} ms"
        )
    _log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
