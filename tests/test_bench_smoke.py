"""``bench/bench_scale.py --smoke`` runs end to end and writes what it promises.

It starts the real server, the minimal server and client processes, so it
runs as a user would, in a subprocess. Speed never fails this test: it checks
the shape of the JSON and that every figure is a positive number. Without
the optional ``bench`` group (Chroma, matplotlib) the run must still pass and
say ``skipped: not installed``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("lethe", "lethe_empty_owner", "empty_call", "faiss_inprocess", "minimal_grpc_faiss")


def _bench(script: str, *args: str, timeout: float = 170) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<script> <args>`` from the repository and require that it succeeds."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    out = tmp_path_factory.mktemp("bench-smoke")
    run = _bench("bench_scale.py", "--smoke", "--no-cache", "--out-dir", str(out))
    return json.loads((out / "scale-smoke.json").read_text()), run.stdout, out


@pytest.mark.slow
def test_smoke_searches_every_size_and_kind(smoke: tuple[dict[str, Any], str, Path]) -> None:
    result, _, _ = smoke
    cfg = result["config"]
    got = {(e["kind"], e["n"]) for e in result["search"]}
    assert got == {(k, n) for k in cfg["kinds"] for n in cfg["sizes"]}
    for e in result["search"]:
        for name in SYSTEMS:
            s = e["sequential"][name]
            assert _positive(s["p50_ms"]), (e["owner"], name, s)
            assert _positive(s["p99_ms"]), (e["owner"], name, s)
        assert 0 < e["sequential"]["lethe"]["recall_at_10"] <= 1
        assert 0 < e["sequential"]["minimal_grpc_faiss"]["recall_at_10"] <= 1
        assert _positive(e["ratios"]["lethe_over_minimal"]["median"])
        for level in e["concurrency"]["levels"].values():
            for name in ("lethe", "minimal_grpc_faiss", "empty_call", "faiss_inprocess"):
                assert _positive(level[name]["qps"]), (e["owner"], name)


def test_smoke_measures_writes_forgets_and_builds(smoke: tuple[dict[str, Any], str, Path]) -> None:
    result, _, _ = smoke
    for mode in ("HYBRID", "LEXICAL", "DENSE"):
        v = result["after_write"]["modes"][mode]
        assert _positive(v["steady"]["p50_ms"]), mode
        assert _positive(v["first_after_write"]["p50_ms"]), mode
    for phase in ("cold", "warm"):
        for target in ("new_threads", "long_thread"):
            assert _positive(result["writes"]["phases"][phase][target]["turns_per_s_median"])
    for op in ("turn", "thread", "descendants", "range"):
        v = result["forget"]["ops"][op]
        assert _positive(v["records_deleted"]), op
        assert _positive(v["lethe"]["p50_ms"]), op
        assert _positive(v["floor"]["p50_ms"]), op
    layouts = {e["layout"] for e in result["build"]}
    assert layouts == {"threads of 100", "one thread"}
    assert result["build"][0]["fresh_restart"]
    for e in result["build"]:
        for key in ("first_search_s", "rss_peak_bytes", "rss_steady_bytes"):
            assert _positive(e[key]), (e["owner"], key)
        if e["fresh_restart"]:
            assert _positive(e["restart_to_serving_s"]), e["owner"]


def test_smoke_describes_the_machine(smoke: tuple[dict[str, Any], str, Path]) -> None:
    result, _, out = smoke
    m = result["machine"]
    assert _positive(m["cpu_count"])
    assert _positive(m["ram_bytes"])
    assert m["cpu_model"]
    assert m["python"]
    assert m["libraries"]["faiss-cpu"]
    text = (out / "scale-smoke.md").read_text()
    assert "## DENSE Search" in text
    assert m["cpu_model"] in text


def test_smoke_reports_the_optional_peers_or_says_they_are_skipped(
    smoke: tuple[dict[str, Any], str, Path],
) -> None:
    result, stdout, out = smoke
    if importlib.util.find_spec("chromadb") is None:
        assert "chroma: skipped: not installed" in stdout
    else:
        ladders = [e["chroma"] for e in result["search"] if "chroma" in e]
        assert ladders
        assert all(0 < s["recall_at_10"] <= 1 for c in ladders for s in c["ladder"])
    if importlib.util.find_spec("matplotlib") is None:
        assert "plot: skipped: not installed" in stdout
    else:
        assert (out / "scale-smoke.png").stat().st_size > 0


def test_the_move_benchmark_runs_and_loses_no_write(tmp_path: Path) -> None:
    """``bench/bench_move.py`` on a small owner moves it under write load and loses no write.

    Every acknowledged write is on the destination (its figures are not
    checked).
    """
    out = tmp_path / "move.json"
    _bench("bench_move.py", "--turns", "300", "--others", "1", "--out", str(out))
    (row,) = json.loads(out.read_text())
    assert row["every_acknowledged_write_on_destination"] is True
    assert row["rows_removed_at_source"] > 300
    assert _positive(row["writes_refused_seconds"])


def test_the_connect_benchmark_runs_every_transport(tmp_path: Path) -> None:
    """``bench/bench_connect.py --smoke``: Search over gRPC, Connect binary and JSON, interleaved.

    Speed never fails it: it checks that every transport answered and that
    every figure is a positive number.
    """
    out = tmp_path / "connect.json"
    _bench("bench_connect.py", "--smoke", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["config"]["records"] == 500
    for kind in ("dense", "lexical"):
        figures = result["search"][kind]
        for name in ("grpc", "connect_binary", "connect_json"):
            assert _positive(figures[name]["p50_ms"]), (kind, name)
            assert _positive(figures[name]["p99_ms"]), (kind, name)
            assert figures[name]["calls"] == 20
        assert _positive(figures["connect_json"]["p50_over_grpc"])
        assert figures["request_bytes"]["connect_json"] > figures["request_bytes"]["connect_binary"]


def test_the_echo_benchmarks_run_and_the_shipped_rule_is_the_one_they_find(
    tmp_path: Path, locomo_path: Path
) -> None:
    """``bench/eval_echoes.py`` picks the shipped rule; ``bench_echo_forget.py`` runs small.

    Speed is not checked; the rule's figures are (they are deterministic).
    """
    run = _bench("eval_echoes.py", "--locomo", str(locomo_path))
    assert "search finds the shipped configuration: True" in run.stdout
    assert "the server's sweep (index.find_echoes) agrees: True" in run.stdout
    held = next(line for line in run.stdout.splitlines() if line.startswith("held6-10"))
    false_rate = float(held.split()[3].rstrip("%"))
    catches = [float(x) for x in held.split()[4:]]
    assert false_rate <= 1.0
    assert min(catches[:2]) >= 0.95  # verbatim
    assert min(catches[2:]) >= 0.80  # lightly edited
    out = tmp_path / "echo-forget.json"
    run = _bench("bench_echo_forget.py", "--turns", "1300", "--forgets", "5", "--json", str(out))
    report = json.loads(out.read_text())
    assert {k: report[k]["forgets"] for k in ("IGNORE", "REPORT", "TAINT")} == {
        "IGNORE": 5,
        "REPORT": 5,
        "TAINT": 5,
    }


def test_the_restart_benchmark_measures_cold_and_warm_restarts(tmp_path: Path) -> None:
    """``bench/bench_restart.py --smoke`` restarts each owner cold and warm.

    Every figure is a positive number, the warm restart loaded a snapshot
    (its stop wrote one) and answered what the cold one answered; speed is
    not checked.
    """
    _bench("bench_restart.py", "--smoke", "--out-dir", str(tmp_path))
    result = json.loads((tmp_path / "restart-smoke.json").read_text())
    assert [s["n"] for s in result["sizes"]] == [300, 1000]
    for size in result["sizes"]:
        assert size["same_hits"] is True
        assert _positive(size["snapshot_bytes"])
        assert _positive(size["cold_over_warm"])
        for kind in ("cold", "warm"):
            for key in ("serving_s", "first_search_s", "restart_to_first_search_s"):
                assert _positive(size[kind][key]), (size["n"], kind, key)
            ratios = size[kind]["rss_over_raw"]  # resident set over the raw vectors
            assert set(ratios) == {"first_peak", "settled_peak", "steady"}
            assert all(isinstance(v, float) for v in ratios.values()), ratios
            assert ratios["settled_peak"] >= ratios["first_peak"]
    assert "| 1,000 | warm |" in (tmp_path / "restart-smoke.md").read_text()
    assert "peak to first search" in (tmp_path / "restart-smoke.md").read_text()


def test_the_processes_benchmark_measures_each_count_against_one_process(tmp_path: Path) -> None:
    """``bench/bench_processes.py --smoke``: 1 and 2 processes searched, a member killed, one added.

    Every count has positive figures and the floor's ratios are 1; the group
    answered again after the kill, and a member added by SIGTTIN answered;
    speed is not checked.
    """
    out = tmp_path / "processes-smoke.json"
    _bench("bench_processes.py", "--smoke", "--out", str(out))
    result = json.loads(out.read_text())
    assert [row["processes"] for row in result["table"]] == [1, 2]
    floor, group = result["table"]
    assert (floor["qps_ratio"], floor["p50_ratio"]) == (1.0, 1.0)
    for row in (floor, group):
        for key in (
            "qps",
            "p50_ms",
            "p99_ms",
            "rss_bytes",
            "cpu_ms_per_search",
            "client_cpu_ms_per_search",
        ):
            assert _positive(row[key]), (row["processes"], key)
        assert 0 < row["machine_busy"] <= 1, row["machine_busy"]
    assert group["rss_bytes"] > floor["rss_bytes"]  # two processes hold two copies
    for row in (floor, group):  # the server's threads, by the names it gave them
        assert _positive(row["cpu_ms_by_thread"].get("lethe-rpc", 0.0)), row["cpu_ms_by_thread"]
        assert _positive(row["cpu_ms_by_thread"].get("lethe-loop", 0.0)), row["cpu_ms_by_thread"]
    assert _positive(result["kill"]["kill_to_first_search_s"])
    join = result["join"]  # SIGTTIN: a third member beside the two, then its first answer
    assert join["processes"] == 3
    assert 0 < join["join_to_ready_s"] <= join["join_to_first_search_s"]
    assert join["connections_tried"] >= 1
    md = out.with_suffix(".md").read_text()
    assert "| 2 |" in md
    assert "SIGTTIN to the running group" in md
    assert "Server CPU per search by thread" in md
    assert "ceiling searches/s" in md


def test_the_processes_benchmark_of_one_process_alone_kills_nothing(tmp_path: Path) -> None:
    """``--processes 1``: a lone process has no supervisor, so no kill (it hung, then failed)."""
    out = tmp_path / "processes-one.json"
    _bench("bench_processes.py", "--smoke", "--processes", "1", "--out", str(out), timeout=120)
    result = json.loads(out.read_text())
    assert [row["processes"] for row in result["table"]] == [1]
    assert result["kill"] is None
    assert result["join"] is None
    assert "SIGKILLed" not in out.with_suffix(".md").read_text()


def test_the_langgraph_benchmark_runs_beside_in_memory_store(tmp_path: Path) -> None:
    """``bench/bench_langgraph.py --smoke``: batches, single puts, filter searches.

    Speed never fails it: it checks that every figure is there and positive,
    beside ``InMemoryStore``'s and the one-turn ``AppendTurns`` floor.
    """
    out = tmp_path / "langgraph.json"
    _bench("bench_langgraph.py", "--smoke", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["config"]["items"] == 200
    for store in ("lethe", "in_memory"):
        assert _positive(result["batch"]["new_s_median"][store])
        assert _positive(result["batch"]["update_s_median"][store])
        assert len(result["batch"]["new_s"][store]) == 2
        for kind in ("new", "update"):
            assert result["put"][kind][store]["n"] == 10
            assert _positive(result["put"][kind][store]["p50_ms"])
        assert _positive(result["filter_search"][store]["p50_ms"])
        for case in ("worst_no_match", "worst_created_last"):
            assert result["filter_search"][case][store]["n"] == 4  # 2 rounds of 2
            assert _positive(result["filter_search"][case][store]["p50_ms"])
    assert _positive(result["put"]["append_turns_floor"]["p50_ms"])
    assert _positive(result["put"]["new_over_append"]["median"])
    assert _positive(result["filter_search"]["lethe_over_in_memory"]["median"])


def test_the_chroma_server_benchmark_runs_both_systems(tmp_path: Path) -> None:
    """``bench_chroma_server.py --smoke``: Lethe and ``chroma run`` answer, recall is measured.

    Without chromadb it skips on a developer machine and fails under ``CI``
    (``scripts/test.sh`` installs the ``bench`` extras).
    """
    if importlib.util.find_spec("chromadb") is None:
        why = "chromadb is missing (pip install -e '.[bench]')"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; scripts/test.sh installs it")
        pytest.skip(why)
    out = tmp_path / "chroma-server-smoke.json"
    _bench("bench_chroma_server.py", "--smoke", "--out", str(out), timeout=300)
    result = json.loads(out.read_text())
    for system in ("lethe", "chroma"):
        for key in ("qps", "p50_ms", "p99_ms"):
            assert _positive(result["table"][system][key]), (system, key)
    assert result["lethe_recall_at_10"] >= 0.99  # exact search at 2,000 vectors
    assert 0 < result["chroma_ladder"][-1]["recall_at_10"] <= 1
    assert _positive(result["qps_ratio_lethe_over_chroma"])
    assert "| chroma |" in out.with_suffix(".md").read_text()


def test_the_rpc_floors_benchmark_measures_each_server(tmp_path: Path) -> None:
    """``bench/bench_rpc_floors.py --smoke``: the three gRPC floors and Lethe, each with figures.

    Every server answered with a positive latency and CPU per call, the aio
    floor's ratio to itself is 1, and Lethe's CPU is split by its threads'
    names; speed is not checked.
    """
    out = tmp_path / "rpc-floors-smoke.json"
    _bench("bench_rpc_floors.py", "--smoke", "--out", str(out))
    result = json.loads(out.read_text())
    rows = {row["server"]: row for row in result["table"]}
    assert list(rows) == ["sync", "aio", "aio+hop", "lethe"]
    for name, row in rows.items():
        assert _positive(row["p50_ms"]), name
        assert _positive(row["cpu_ms_per_call"]), name
    assert rows["aio"]["cpu_ratio_to_aio"] == 1.0
    assert _positive(result["lethe_cpu_ms_by_thread"].get("lethe-loop", 0.0))
    assert "| aio+hop |" in out.with_suffix(".md").read_text()
