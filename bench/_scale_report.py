"""The machine description, the Markdown tables and the plot of the scale benchmark.

:func:`machine_info` reads ``/proc/cpuinfo`` and ``/proc/meminfo`` (Linux)
and the installed versions of the libraries that shape the figures.
:func:`write_markdown` renders a result dict (as ``bench_scale.py`` writes it
to JSON) as tables; :func:`write_plot` draws DENSE p50 against owner size with
the floors and peers, if matplotlib is installed (optional group ``bench``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["machine_info", "write_markdown", "write_plot"]

_LIBRARIES = (
    "lethe-store",
    "grpcio",
    "protobuf",
    "faiss-cpu",
    "numpy",
    "lmdb",
    "PyNaCl",
    "bm25s",
    "wordllama",
    "chromadb",
    "matplotlib",
)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):  # no /proc (macOS): platform's answer
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _ram_bytes() -> int:
    with contextlib.suppress(OSError):  # no /proc: unknown, reported as 0
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def _git_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine_info() -> dict[str, Any]:
    """What the figures were measured on.

    Returns:
        ``cpu_count`` (``os.cpu_count()``), ``cpu_model``, ``ram_bytes``,
        ``python``, ``platform``, ``git_commit``, ``loadavg_start`` (1, 5, 15 min)
        and ``libraries`` (name to version, ``None`` when not installed).
    """
    libs: dict[str, str | None] = {}
    for name in _LIBRARIES:
        try:
            libs[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            libs[name] = None
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "ram_bytes": _ram_bytes(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git_commit": _git_commit(),
        "loadavg_start": [round(v, 2) for v in os.getloadavg()],
        "libraries": libs,
    }


def write_report(out: Path, report: dict[str, Any], markdown: str) -> None:
    """Write ``report`` as ``out`` (JSON) and ``markdown`` beside it (``.md``); print the latter.

    Creates ``out``'s directory when missing.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(markdown)


def _n(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def _f(value: Any, digits: int = 2) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return [*out, ""]


def _ratio(r: dict[str, Any] | None) -> str:
    if not r:
        return "—"
    return f"{r['median']:.2f}x ({r['q25']:.2f}-{r['q75']:.2f})"


def _search_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for e in result.get("search", []):
        s, r = e["sequential"], e["ratios"]
        chroma = s.get("chroma_default")
        mini = s["minimal_grpc_faiss"]
        rows.append(
            [
                e["kind"],
                _n(e["n"]),
                f"{_f(s['lethe']['p50_ms'])} / {_f(s['lethe']['p99_ms'])}",
                _f(s["lethe"].get("recall_at_10"), 3),
                f"{_f(mini['p50_ms'])} / {_f(mini['p99_ms'])}",
                _f(s["empty_call"]["p50_ms"]),
                _f(s["faiss_inprocess"]["p50_ms"]),
                _f(s["lethe_empty_owner"]["p50_ms"]),
                _f(r["fixed_cost_ms"]),
                "—"
                if chroma is None
                else f"{_f(chroma['p50_ms'])} ({_f(chroma['recall_at_10'], 3)})",
                _ratio(r["lethe_over_minimal"]),
                _ratio(r["lethe_over_empty_call_plus_faiss"]),
                _f(r["lethe_p99_over_p50"]),
            ]
        )
    return rows


def write_markdown(result: dict[str, Any], path: Path) -> None:
    """Render ``result`` as Markdown tables at ``path``.

    Args:
        result: The benchmark's result dict.
        path: Output file.
    """
    m = result.get("machine", {})
    cfg = result.get("config", {})
    libs = ", ".join(f"{k} {v}" for k, v in m.get("libraries", {}).items() if v)
    lines = [
        f"# Lethe at scale — {cfg.get('mode', '?')} run",
        "",
        f"Machine: {m.get('cpu_count')} CPUs ({m.get('cpu_model')}), "
        f"{m.get('ram_bytes', 0) / 2**30:.1f} GiB RAM, Python {m.get('python')}, "
        f"{m.get('platform')}; commit {m.get('git_commit')}; load average at start "
        f"{m.get('loadavg_start')}, at end {m.get('loadavg_end')}. {libs}.",
        "",
        f"Corpus: {cfg.get('corpus')} ({cfg.get('corpus_turns')} turns, "
        f"{cfg.get('corpus_questions')} questions). FAISS index: `{cfg.get('faiss_factory')}`. "
        f"Server flags: `{' '.join(cfg.get('server_args', []))}`. "
        f"Total {result.get('total_seconds')} s.",
        "",
        "Times in ms unless marked; every figure is a median (p50) or p99 over all calls of "
        "the run; ratios are the median over rounds of the per-round p50 ratio, with the "
        "interquartile range of the rounds in brackets. The machine is shared and noisy: "
        "compare ratios within the run.",
        "",
        "## DENSE Search, top 10, sequential (interleaved round by round)",
        "",
    ]
    lines += _table(
        [
            "vectors",
            "owner",
            "Lethe p50 / p99",
            "Lethe recall@10",
            "minimal gRPC+FAISS p50 / p99",
            "empty call",
            "in-process FAISS",
            "Lethe, empty owner",
            "fixed cost",
            "Chroma default (recall@10)",
            "Lethe / minimal",
            "Lethe / (empty + FAISS)",
            "Lethe p99/p50",
        ],
        _search_rows(result),
    )
    conc_rows = []
    for e in result.get("search", []):
        for c, level in e.get("concurrency", {}).get("levels", {}).items():
            for name in (
                "lethe",
                "minimal_grpc_faiss",
                "empty_call",
                "faiss_inprocess",
                "chroma_default",
            ):
                if name in level:
                    v = level[name]
                    conc_rows.append(
                        [
                            e["kind"],
                            _n(e["n"]),
                            c,
                            name,
                            _f(v["qps"], 0),
                            _f(v["p50_ms"]),
                            _f(v["p99_ms"]),
                        ]
                    )
            conc_rows.append(
                [
                    e["kind"],
                    _n(e["n"]),
                    c,
                    "**Lethe QPS / minimal**",
                    _f(level["lethe_qps_over_minimal"]),
                    "",
                    "",
                ]
            )
    if conc_rows:
        harness = next(
            (e["concurrency"]["harness"] for e in result.get("search", []) if "concurrency" in e),
            "",
        )
        lines += ["## Concurrency (closed loop)", "", f"Harness: {harness}.", ""]
        lines += _table(["vectors", "owner", "clients", "system", "QPS", "p50", "p99"], conc_rows)
    chroma_rows = []
    for e in result.get("search", []):
        ch = e.get("chroma")
        if ch:
            for step in ch["ladder"]:
                chroma_rows.append(
                    [
                        e["kind"],
                        _n(e["n"]),
                        str(step["ef_search"]),
                        _f(step["recall_at_10"], 3),
                        _f(step["p50_ms"]),
                        _f(step["qps_sequential"], 0),
                        _f(next((v for k, v in step.items() if k.endswith("_threads")), None), 0),
                    ]
                )
    if chroma_rows:
        lines += ["## Chroma (in process), recall@10 against exact search", ""]
        lines += _table(
            [
                "vectors",
                "owner",
                "ef_search",
                "recall@10",
                "p50",
                "QPS (sequential)",
                "QPS, as many threads as the most clients, at the first ef reaching 0.99",
            ],
            chroma_rows,
        )
    aw = result.get("after_write")
    if aw:
        lines += [f"## First search after a one-turn write ({aw['owner']}, {aw['reps']} reps)", ""]
        rows = [
            [
                mode,
                _f(v["steady"]["p50_ms"]),
                _f(v["first_after_write"]["p50_ms"]),
                _f(v["second_after_write"]["p50_ms"]),
                _f(v["first_over_steady_p50"]) + "x",
            ]
            for mode, v in aw["modes"].items()
        ]
        lines += _table(
            ["mode", "steady p50", "first after write p50", "second p50", "first / steady"], rows
        )
    w = result.get("writes")
    if w:
        lines += [
            f"## AppendTurns, batches of {w['batch']}, committed (turns/s, median over batches)",
            "",
            f"Owner of {w['owner_turns_before']:,} turns; the long thread grows from "
            f"{w['long_thread_turns_before']:,} to {w['long_thread_turns_after']:,} turns. "
            f"Warm = the owner's index loaded (first search {w.get('warm_first_search_s')} s).",
            "",
        ]
        rows = []
        for phase, v in w["phases"].items():
            for target in ("new_threads", "long_thread"):
                t = v[target]
                rows.append(
                    [
                        phase,
                        target.replace("_", " "),
                        _f(t["turns_per_s_median"]),
                        f"{_f(t['turns_per_s_min'])}-{_f(t['turns_per_s_max'])}",
                        str(t["batches"]),
                    ]
                )
        lines += _table(["index", "into", "turns/s", "range", "batches"], rows)
    f = result.get("forget")
    if f:
        lines += [
            f"## Forget (owner of {f['owner_turns']:,} turns, index loaded, {f['rounds']} rounds)",
            "",
            f"Floor: {f['floor']}. {f.get('note', '')}",
            "",
        ]
        rows = [
            [
                op,
                _f(v["records_deleted"]),
                f"{_f(v['lethe']['p50_ms'])} / {_f(v['lethe']['p99_ms'])}",
                _f(v["floor"]["p50_ms"]),
                _f(v["ratio_p50"]) + "x",
                _ratio(v["ratio_per_round"]),
            ]
            for op, v in f["ops"].items()
        ]
        lines += _table(
            ["forget", "records", "Lethe p50 / p99", "floor p50", "ratio", "per round"], rows
        )
    b = result.get("build")
    if b:
        lines += ["## Restart, build (first Search) and server RSS", ""]
        rows = [
            [
                e["owner"],
                e["layout"],
                _f(e["restart_to_serving_s"]) if e["fresh_restart"] else "(no restart)",
                _f(e["first_search_s"]),
                _f(e["build_us_per_turn"], 1),
                f"{e['raw_vector_bytes'] / 2**20:.1f}",
                f"{e['rss_base_bytes'] / 2**20:.0f}",
                f"{e['rss_peak_bytes'] / 2**20:.0f}",
                f"{e['rss_steady_bytes'] / 2**20:.0f}",
                _f(e.get("peak_minus_base_over_raw")),
                _f(e.get("steady_minus_base_over_raw")),
            ]
            for e in b
        ]
        lines += _table(
            [
                "owner",
                "layout",
                "restart s",
                "first Search s",
                "µs/turn",
                "raw MiB",
                "base RSS MiB",
                "peak RSS MiB",
                "steady RSS MiB",
                "(peak - base) / raw",
                "(steady - base) / raw",
            ],
            rows,
        )
    if result.get("plot"):
        lines += [f"![DENSE p50 against owner size]({result['plot']})", ""]
    notes = [*result.get("notes", []), *result.get("skipped", [])]
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    sections = result.get("sections", {})
    if sections:
        lines += _table(
            ["section", "seconds", "load avg (1 min) start → end"],
            [
                [k, _f(v["seconds"], 1), f"{v['loadavg_1min_start']} → {v['loadavg_1min_end']}"]
                for k, v in sections.items()
            ],
        )
    path.write_text("\n".join(lines))


def write_plot(result: dict[str, Any], path: Path) -> Path | None:
    """Plot DENSE p50 against owner size, one panel per vector kind.

    Args:
        result: The benchmark's result dict.
        path: Output PNG.

    Returns:
        ``path``, or None when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullLocator
    except ImportError:
        return None
    entries = result.get("search", [])
    kinds = sorted({e["kind"] for e in entries})
    if not kinds:
        return None
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.8), squeeze=False)
    series: list[tuple[str, Callable[[dict[str, Any]], float], str]] = [
        ("Lethe", lambda s: s["lethe"]["p50_ms"], "o-"),
        ("minimal gRPC + FAISS", lambda s: s["minimal_grpc_faiss"]["p50_ms"], "s--"),
        (
            "empty call + in-process FAISS",
            lambda s: s["empty_call"]["p50_ms"] + s["faiss_inprocess"]["p50_ms"],
            "^:",
        ),
        ("empty authenticated call", lambda s: s["empty_call"]["p50_ms"], "v:"),
        ("in-process FAISS", lambda s: s["faiss_inprocess"]["p50_ms"], "x:"),
    ]
    for ax, kind in zip(axes[0], kinds, strict=True):
        rows = sorted((e for e in entries if e["kind"] == kind), key=lambda e: e["n"])
        sizes = [e["n"] for e in rows]
        for label, get, style in series:
            ax.plot(sizes, [get(e["sequential"]) for e in rows], style, label=label)
        ch = [e for e in rows if "chroma_default" in e["sequential"]]
        if ch:
            ax.plot(
                [e["n"] for e in ch],
                [e["sequential"]["chroma_default"]["p50_ms"] for e in ch],
                "d-.",
                label="Chroma, default ef",
            )
        hi = [(e["n"], e["chroma"]["at_recall_0_99"]) for e in rows if e.get("chroma")]
        hi = [(n, s) for n, s in hi if s]
        if hi:
            ax.plot(
                [n for n, _ in hi],
                [s["p50_ms"] for _, s in hi],
                "D--",
                markersize=11,
                markerfacecolor="none",
                label="Chroma, first ef with recall ≥ 0.99",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(sizes, [_n(n) for n in sizes])
        ax.set_xlabel("turns in the owner")
        ax.set_ylabel("DENSE Search p50 (ms)")
        ax.set_title(f"{kind} vectors, d=256, top 10")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    m = result.get("machine", {})
    fig.suptitle(
        f"Lethe {result.get('config', {}).get('mode', '')} run — {m.get('cpu_count')} CPUs "
        f"{m.get('cpu_model')}, commit {m.get('git_commit')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
