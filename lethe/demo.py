"""``lethe demo``: the main job on real conversations.

Starts ``lethe serve`` on the data directory (default ``./lethe-data``), ingests the
LoCoMo conversations (Maharana et al., ACL 2024; CC BY-NC 4.0, read from
``../shared/data/locomo/locomo10.json`` and never copied into this
repository) — one owner per conversation, one thread per session, one turn per
dialog turn — commits them, runs every QA question as a ``Search`` over gRPC
and reports recall@k of the evidence dialog ids per category, with search
latency against two floors measured in the same run (an empty gRPC call and
raw in-process FAISS). Then it backs the store up, forgets one session, shows
its evidence is no longer retrievable, restores the backup beside the keystore
and shows the restore does not bring it back. Figures go to a JSON file.

Scoring follows ``shared/data/README.md``: recall@k = |R ∩ E| / |E| averaged
over items with evidence, hit@k = 1 if R ∩ E ≠ ∅; categories 1-4 are the
headline (1,536 items), category 5 (adversarial) is reported separately.

A client of the public API only, run as a user would run it: ``lethe serve``,
``lethe token create``, ``lethe backup`` and ``lethe restore`` are child
processes (the ``lethe`` console script beside ``sys.executable``, else
``python -m server.cli``); the demo never imports ``server``, ``shredder`` or
``index``. The KEK reaches them as it reaches the demo: ``--kek-file`` is
passed on, ``LETHE_KEK`` through the environment. The floors' raw FAISS search
runs over the owner's vectors as ``ListTurns`` (``view: FULL``) returns them,
and the query embedding loads WordLlama as the server does; ``numpy``,
``faiss`` and ``wordllama`` are imported by the floors only, ``tqdm`` by the
progress bars.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from google.protobuf import timestamp_pb2
from grpc_health.v1 import health_pb2

from lethe.client import Client, LetheError
from lethe.locomo import (
    Conversation,
    find_locomo,
    load_locomo,
    normalise_evidence,
    sample_conversation,
    session_of,
)
from lethe.v1 import common_pb2, retrieval_pb2, threads_pb2

__all__ = ["run_demo"]

KS = (1, 5, 10, 20)
CATEGORY_NAMES = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}


def _ts(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``; 0.0 for no values.

    Linear interpolation between closest ranks (numpy's default ``linear`` method).
    """
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


_T = TypeVar("_T")


def _progress(items: Sequence[_T], desc: str, unit: str) -> Iterator[_T]:
    """``items`` with a tqdm progress bar on stderr."""
    from tqdm import tqdm

    yield from tqdm(items, desc=desc, unit=unit)


class _ServeError(Exception):
    """A ``lethe`` child process failed (its own message went to stderr)."""


def _lethe_command() -> list[str]:
    """How to run ``lethe``.

    The console script beside ``sys.executable`` if it exists, else
    ``python -m server.cli``.
    """
    script = Path(sys.executable).parent / "lethe"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "server.cli"]


def _kek_args(kek_file: Path | None) -> list[str]:
    return ["--kek-file", str(kek_file)] if kek_file else []


CHILD_ENV_DROPPED = ("LETHE_JSON", "LETHE_CONFIG")
"""Settings of the demo's own run that its ``lethe`` children must not inherit:
they are read by their output (a token, a ready line), and are given their
data directory, KEK file and addresses explicitly."""


def _child_env() -> dict[str, str]:
    """The environment of a ``lethe`` child: the demo's, without :data:`CHILD_ENV_DROPPED`."""
    return {k: v for k, v in os.environ.items() if k not in CHILD_ENV_DROPPED}


def _lethe(argv: Sequence[str], *, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``lethe ARGV`` to completion.

    Its stdout is captured when ``capture``, else printed after it through the
    demo's own ``sys.stdout`` (stderr under ``--json``); stderr is shared.
    """
    sys.stdout.flush()  # keep the demo's lines and the child's in order
    done = subprocess.run(
        [*_lethe_command(), *argv],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
        env=_child_env(),
    )
    if not capture:
        print(done.stdout, end="", flush=True)
    return done


def _forward(stream: IO[str]) -> None:
    """Copy what ``lethe serve`` prints after its ready line to the demo's stdout."""
    for line in stream:
        print(line, end="", flush=True)


class _Served:
    """``lethe serve`` on ``127.0.0.1:0`` in a child process, stopped by SIGTERM.

    Attributes:
        port: the gRPC port the server reported on its ready line.
        kek: where the server's KEK is, as its second line says ("" if it
            did not say).
    """

    STOP_TIMEOUT_SECONDS = 60.0

    def __init__(self, data_dir: Path, kek_file: Path | None) -> None:
        """Start the server and wait for ``lethe serving DIR on HOST:PORT``.

        Raises:
            _ServeError: the server exited (or printed something else) first.
        """
        argv = ["serve", "--data", str(data_dir), "--listen", "127.0.0.1:0"]
        argv += ["--metrics-listen", "off", *_kek_args(kek_file)]
        sys.stdout.flush()
        self._proc = subprocess.Popen(
            [*_lethe_command(), *argv], stdout=subprocess.PIPE, text=True, env=_child_env()
        )
        assert self._proc.stdout is not None
        self._forwarder = threading.Thread(
            target=_forward, args=(self._proc.stdout,), name="lethe-serve-stdout", daemon=True
        )
        line = self._proc.stdout.readline().rstrip("\n")
        served, on, address = line.rpartition(" on ")
        port = address.rpartition(":")[2]
        if not (on and served.startswith("lethe serving ") and port.isdigit()):
            self.stop()
            raise _ServeError(f"lethe serve did not start (exit status {self._proc.returncode})")
        self.port = int(port)
        # The second line says where the KEK is (``lethe KEK <path> (...)``).
        kek_line = self._proc.stdout.readline().rstrip("\n")
        self.kek = kek_line.removeprefix("lethe KEK ") if kek_line.startswith("lethe KEK ") else ""
        self._forwarder.start()

    def stop(self) -> None:
        """SIGTERM, then wait for the graceful shutdown. Idempotent.

        SIGKILL after ``STOP_TIMEOUT_SECONDS``.
        """
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=self.STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._forwarder.is_alive():
            self._forwarder.join()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


DEMO_TOKEN_LIFETIME = "1h"  # noqa: S105 (a duration, not a secret)
"""How long the demo's admin token may live (``lethe token create --expires-in``).

It is revoked when the demo ends, and expires by itself if the demo is killed.
"""


def _admin_token(data_dir: Path, kek_file: Path | None) -> tuple[str, str]:
    """``lethe token create --admin`` beside the running server, labelled and expiring.

    Returns:
        ``(token, token id)``; the demo revokes the id when it ends.

    Raises:
        _ServeError: the command failed.
    """
    label = f"demo-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    done = _lethe(
        [
            "token",
            "create",
            "--data",
            str(data_dir),
            "--admin",
            "--label",
            label,
            "--expires-in",
            DEMO_TOKEN_LIFETIME,
            "--json",
            *_kek_args(kek_file),
        ],
        capture=True,
    )
    if done.returncode != 0:
        raise _ServeError(f"lethe token create exited with status {done.returncode}")
    created = json.loads(done.stdout)
    return str(created["token"]), str(created["id"])


def _revoke(data_dir: Path, kek_file: Path | None, token_id: str) -> bool:
    """``lethe token revoke ID``: the demo leaves no credential behind. Whether it did."""
    done = _lethe(
        ["token", "revoke", token_id, "--data", str(data_dir), *_kek_args(kek_file)],
        capture=True,
    )
    return done.returncode == 0


def _ingest(api: Client, convs: list[Conversation]) -> dict[str, dict[str, str]]:
    """Create threads, append turns (pending), then commit. Returns owner → name → dia_id."""
    from tqdm import tqdm

    names: dict[str, dict[str, str]] = {}
    total = sum(len(t) for c in convs for t in c.sessions.values())
    with tqdm(total=total, desc="ingest turns", unit="turn") as bar:
        for conv in convs:
            owner_names: dict[str, str] = {}
            for n, turns in conv.sessions.items():
                thread = api.create_thread(
                    f"owners/{conv.owner}",
                    thread_id=f"session-{n}",
                    title=f"{conv.sample_id} session {n}",
                )
                inputs = [
                    threads_pb2.TurnInput(
                        role=common_pb2.USER, speaker=speaker, text=text, time=_ts(conv.dates[n])
                    )
                    for speaker, _, text in turns
                ]
                resp = api.append_turns(thread.name, inputs, request_id=f"ingest-{n}")
                for turn, (_, dia, _) in zip(resp.turns, turns, strict=True):
                    owner_names[turn.name] = dia
                bar.update(len(turns))
            pending = list(owner_names)
            for start in range(0, len(pending), 1000):
                api.commit(pending[start : start + 1000])
            names[conv.owner] = owner_names
    return names


@dataclass
class _Item:
    owner: str
    question: str
    evidence: list[str]
    category: int


def _items(convs: list[Conversation]) -> tuple[list[_Item], int, int]:
    items: list[_Item] = []
    dropped = 0
    empty = 0
    for conv in convs:
        known = {dia for turns in conv.sessions.values() for _, dia, _ in turns}
        for qa in conv.qa:
            ev, d = normalise_evidence([str(e) for e in qa.get("evidence", [])], known)
            dropped += d
            if not ev:
                empty += 1
                continue
            items.append(_Item(conv.owner, str(qa["question"]), ev, int(qa["category"])))
    return items, dropped, empty


MODES = {
    "HYBRID": retrieval_pb2.SearchRequest.HYBRID,
    "DENSE": retrieval_pb2.SearchRequest.DENSE,
    "LEXICAL": retrieval_pb2.SearchRequest.LEXICAL,
}


def _run_queries(
    api: Client,
    items: list[_Item],
    names: dict[str, dict[str, str]],
    desc: str,
    mode: str = "HYBRID",
) -> tuple[list[list[str]], list[float]]:
    results: list[list[str]] = []
    latencies: list[float] = []
    for item in _progress(items, desc, "q"):
        start = time.perf_counter()
        resp = api.search(
            f"owners/{item.owner}", query_text=item.question, top_k=max(KS), mode=MODES[mode]
        )
        latencies.append(time.perf_counter() - start)
        results.append([names[item.owner].get(h.turn.name, "?") for h in resp.hits])
    return results, latencies


def _score(items: list[_Item], results: list[list[str]]) -> dict[str, Any]:
    groups: dict[str, list[tuple[_Item, list[str]]]] = defaultdict(list)
    for item, got in zip(items, results, strict=True):
        groups[f"{item.category} {CATEGORY_NAMES.get(item.category, '?')}"].append((item, got))
        if item.category in (1, 2, 3, 4):
            groups["overall (1-4)"].append((item, got))
    out: dict[str, Any] = {}
    for group, rows in sorted(groups.items()):
        entry: dict[str, Any] = {"items": len(rows)}
        for k in KS:
            rec = [len(set(got[:k]) & set(it.evidence)) / len(it.evidence) for it, got in rows]
            hit = [1.0 if set(got[:k]) & set(it.evidence) else 0.0 for it, got in rows]
            entry[f"recall@{k}"] = round(statistics.fmean(rec), 4)
            entry[f"hit@{k}"] = round(statistics.fmean(hit), 4)
        out[group] = entry
    return out


def _owner_vectors(api: Client, owner: str) -> list[list[float]]:
    """The stored embedding of every listable turn of ``owner``.

    ``ListThreads``, then ``ListTurns`` with ``view: FULL``, every page; turns
    without one are skipped.
    """
    threads = [t.name for t in api.iter_threads(f"owners/{owner}", page_size=1000)]
    return [
        list(t.embedding)
        for thread in threads
        for t in api.iter_turns(thread, page_size=1000, view="FULL")
        if t.embedding
    ]


def _floors(api: Client, owner: str, queries: list[str]) -> dict[str, float]:
    """Medians (ms) of the floors, measured in the same run as the searches.

    The empty call is ``grpc.health.v1.Health/Check`` on the same channel; the
    raw search is FAISS ``IndexFlatIP`` in this process over ``owner``'s stored
    vectors (fetched through the API); the query embedding loads WordLlama
    ``l2_supercat`` at 256 dimensions from its wheel and scales rows to unit L2
    norm, as ``index.WordLlamaEmbedder`` does in the server.
    """
    empty = []
    for _ in range(300):
        start = time.perf_counter()
        api.stubs.health.Check(health_pb2.HealthCheckRequest())
        empty.append(time.perf_counter() - start)
    import faiss
    import numpy as np
    import wordllama

    model: Any = wordllama.WordLlama.load(
        config="l2_supercat",
        cache_dir=Path(wordllama.__file__).parent,
        disable_download=True,
        dim=256,
    )

    def embed(texts: list[str]) -> Any:
        rows = np.asarray(model.embed(texts, norm=False), dtype=np.float64)
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        unit = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0.0)
        return np.ascontiguousarray(unit, dtype=np.float32)

    vecs = np.asarray(_owner_vectors(api, owner), dtype=np.float32)
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs / np.linalg.norm(vecs, axis=1, keepdims=True))
    qvecs = embed(queries)
    raw = []
    for q in qvecs:
        start = time.perf_counter()
        flat.search(q[None, :], max(KS))
        raw.append(time.perf_counter() - start)
    emb = []
    for q in queries[:300]:
        start = time.perf_counter()
        embed([q])
        emb.append(time.perf_counter() - start)
    return {
        "empty_grpc_call_p50_ms": statistics.median(empty) * 1e3,
        "raw_faiss_search_p50_ms": statistics.median(raw) * 1e3,
        "query_embedding_p50_ms": statistics.median(emb) * 1e3,
    }


def _scan(root: Path, needles: list[bytes]) -> int:
    """How many (file, needle) pairs have the needle in the file's raw bytes."""
    hits = 0
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += sum(1 for n in needles if n in data)
    return hits


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo (``lethe demo``).

    Args:
        args: ``data`` (the data directory, a path), ``locomo`` (path of
            ``locomo10.json`` or None to look in the usual places, falling
            back to the sample conversation when there is none), ``sample``
            (true: the sample conversation, LoCoMo not looked for), ``out``
            (the JSON file the figures go to), ``conversations`` (use only the
            first N; 0 = all), ``kek_file`` (path or None) and ``json`` (true:
            every line the demo prints goes to stderr and stdout gets the
            report ``out`` holds, one JSON document).

    Returns:
        The process exit status: 0 when every forgetting check passed, 1 if
        one failed, 2 (one line on stderr) when ``locomo`` names no file, or
        (after the child's own line) ``lethe serve`` or ``lethe token
        create`` failed.
    """
    locomo: Path | None = args.locomo
    if locomo is not None and not locomo.is_file():
        print(f"lethe demo: --locomo {locomo}: no such file", file=sys.stderr, flush=True)
        return 2
    if not getattr(args, "json", False):
        return _demo(args)
    with contextlib.redirect_stdout(sys.stderr):
        rc = _demo(args)
    if rc != 2:
        sys.stdout.write(args.out.read_text())
        sys.stdout.flush()
    return rc


def _demo(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except _ServeError as exc:
        print(f"lethe demo: {exc}", file=sys.stderr, flush=True)
        return 2


def _run(args: argparse.Namespace) -> int:
    """:func:`run_demo` itself.

    Raises:
        _ServeError: ``lethe serve`` or ``lethe token create`` failed.
    """
    path = None if getattr(args, "sample", False) else find_locomo(args.locomo)
    if getattr(args, "sample", False):
        convs = sample_conversation()
        source = "sample"
    elif path is None:
        print(
            "LoCoMo not found (looked for ../shared/data/locomo/locomo10.json): running on a "
            "short sample conversation written for this project instead."
        )
        convs = sample_conversation()
        source = "sample"
    else:
        convs = load_locomo(path)
        source = str(path)
    if args.conversations:
        convs = convs[: args.conversations]
    data_dir: Path = args.data
    server = _Served(data_dir, args.kek_file)
    try:
        token, token_id = _admin_token(data_dir, args.kek_file)
    except BaseException:
        server.stop()
        raise
    api = Client(f"127.0.0.1:{server.port}", token)
    report: dict[str, Any] = {"source": source, "data_dir": str(data_dir.resolve())}
    failures: list[str] = []
    try:
        print(f"server on 127.0.0.1:{server.port}, data in {data_dir.resolve()}")
        print(f"KEK: {server.kek}")
        report["kek"] = server.kek.split(" (", 1)[0]
        for conv in convs:  # a previous run's data: forget it first
            api.forget([f"owners/{conv.owner}"], reason="demo-reset")
        start = time.perf_counter()
        names = _ingest(api, convs)
        ingest_s = time.perf_counter() - start
        n_turns = sum(len(v) for v in names.values())
        print(
            f"ingested and committed {n_turns} turns of {len(convs)} conversations "
            f"({sum(len(c.sessions) for c in convs)} sessions) in {ingest_s:.1f} s"
        )
        items, dropped, empty = _items(convs)
        tune_owners = {c.owner for c in convs[:5]}
        splits: dict[str, Callable[[_Item], bool]] = {
            "all": lambda it: True,
            "tune (conv 1-5)": lambda it: it.owner in tune_owners,
            "held-out (conv 6-10)": lambda it: it.owner not in tune_owners,
        }
        per_mode: dict[str, Any] = {}
        mode_latency: dict[str, Any] = {}
        results: list[list[str]] = []
        for mode in MODES:
            got, latencies = _run_queries(api, items, names, f"search {mode}", mode)
            if mode == "HYBRID":
                results = got
            per_mode[mode] = {
                split: _score(
                    [i for i in items if keep(i)],
                    [r for i, r in zip(items, got, strict=True) if keep(i)],
                )
                for split, keep in splits.items()
                if any(keep(i) for i in items)
            }
            mode_latency[mode] = {
                "p50_ms": round(_pct(latencies, 50) * 1e3, 3),
                "p99_ms": round(_pct(latencies, 99) * 1e3, 3),
            }
        floors = _floors(api, convs[0].owner, [i.question for i in items])
        hybrid_p50 = mode_latency["HYBRID"]["p50_ms"]
        report.update(
            turns=n_turns,
            conversations=len(convs),
            ingest_seconds=round(ingest_s, 2),
            questions=len(items),
            evidence_refs_dropped=dropped,
            items_without_evidence=empty,
            recall=per_mode["HYBRID"]["all"],
            recall_by_mode=per_mode,
            latency_ms={
                **{f"search_{m}": v for m, v in mode_latency.items()},
                **{k: round(v, 4) for k, v in floors.items()},
                "hybrid_p50_over_dense_p50": round(hybrid_p50 / mode_latency["DENSE"]["p50_ms"], 2),
                "hybrid_p50_over_empty_call": round(
                    hybrid_p50 / floors["empty_grpc_call_p50_ms"], 2
                ),
            },
        )
        _print_scores(per_mode, report["latency_ms"], dropped, empty)

        # Back up, then forget the session holding the most evidence of conversation 1.
        backup_dir = Path(tempfile.mkdtemp(prefix="lethe-demo-backup-")) / "backup"
        backup = ["backup", "--data", str(data_dir), "--out", str(backup_dir)]
        if _lethe([*backup, *_kek_args(args.kek_file)]).returncode != 0:
            failures.append("backup failed")
        first = convs[0]
        per_session: dict[int, int] = defaultdict(int)
        for item in items:
            if item.owner == first.owner:
                for dia in item.evidence:
                    per_session[session_of(dia)] += 1
        session = max(per_session, key=lambda s: per_session[s])
        gone = {dia for _, dia, _ in first.sessions[session]}
        needles = [text.encode() for _, _, text in first.sessions[session] if len(text) > 40][:5]
        thread_name = f"owners/{first.owner}/threads/session-{session}"
        receipt = api.forget([thread_name])
        dests = [f"{d.name}:{'done' if d.done else 'OUTSTANDING'}" for d in receipt.destinations]
        print(
            f"\nforgot {thread_name}: {receipt.deleted} turns, receipt {receipt.name}, "
            f"destinations {dests}"
        )
        affected = [i for i in items if i.owner == first.owner and set(i.evidence) & gone]
        after, _ = _run_queries(api, affected, names, "re-query affected")
        leaked = sum(1 for got in after if set(got) & gone)
        probe = next(n for n, d in names[first.owner].items() if d in gone)
        try:
            api.get_turn(probe)
            get_result = "READABLE"
        except LetheError as err:
            get_result = f"{err.code().name}/{err.reason_name}"
        others = [i for i in items if i.owner != first.owner]
        other_before = [r for i, r in zip(items, results, strict=True) if i.owner != first.owner]
        other_after, _ = _run_queries(api, others, names, "re-query other conversations")
        unchanged = other_before == other_after
        plain_data = _scan(data_dir, needles)
        plain_backup = _scan(backup_dir, needles)
        print(
            f"queries with evidence in the forgotten session: {len(affected)}; "
            f"top-{max(KS)} results still naming a forgotten turn: {leaked}"
        )
        print(f"GetTurn on a forgotten turn: {get_result}")
        print(f"other conversations' results unchanged: {unchanged}")
        print(f"forgotten plaintext found in data dir: {plain_data}, in backup: {plain_backup}")

        # Restore the pre-forget backup beside the live keystore.
        api.close()
        server.stop()
        restore = ["restore", "--backup", str(backup_dir), "--data", str(data_dir)]
        rc = _lethe([*restore, *_kek_args(args.kek_file)]).returncode
        # The backup was taken after the token was created: it still admits.
        server = _Served(data_dir, args.kek_file)
        api = Client(f"127.0.0.1:{server.port}", token)
        restored, _ = _run_queries(api, affected, names, "re-query after restore")
        leaked_restored = sum(1 for got in restored if set(got) & gone)
        try:
            api.get_turn(probe)
            get_restored = "READABLE"
        except LetheError as err:
            get_restored = f"{err.code().name}/{err.reason_name}"
        intact = 0
        for n in first.sessions:
            if n == session:
                continue
            resp = api.list_turns(f"owners/{first.owner}/threads/session-{n}", page_size=1000)
            intact += len(resp.turns)
        expected_intact = sum(len(t) for n, t in first.sessions.items() if n != session)
        print(
            f"after restoring the pre-forget backup: forgotten turn {get_restored}; "
            f"results naming a forgotten turn: {leaked_restored}; other sessions of "
            f"{first.owner}: {intact}/{expected_intact} turns readable"
        )
        report["forget"] = {
            "thread": thread_name,
            "turns_forgotten": receipt.deleted,
            "affected_queries": len(affected),
            "leaked_after_forget": leaked,
            "get_forgotten_turn": get_result,
            "other_conversations_unchanged": unchanged,
            "plaintext_hits_data_dir": plain_data,
            "plaintext_hits_backup": plain_backup,
            "restore_exit": rc,
            "leaked_after_restore": leaked_restored,
            "get_forgotten_turn_after_restore": get_restored,
            "other_sessions_readable_after_restore": f"{intact}/{expected_intact}",
        }
        if leaked or leaked_restored or plain_data or plain_backup:
            failures.append("forgotten material was still reachable")
        if get_result != "NOT_FOUND/RECORD_DELETED" or get_restored != "NOT_FOUND/RECORD_DELETED":
            failures.append("GetTurn on a forgotten turn did not answer RECORD_DELETED")
        if intact != expected_intact or not unchanged or rc != 0:
            failures.append("the rest of the store was not intact")
        shutil.rmtree(backup_dir.parent, ignore_errors=True)
        repair = _repair_pass(api, convs[-1], names[convs[-1].owner])
        report["repair"] = repair
        if repair["failures"]:
            failures.extend(repair["failures"])
    finally:
        api.close()
        server.stop()
        revoked = _revoke(data_dir, args.kek_file, token_id)
    report["token"] = {"id": token_id, "revoked": revoked, "expires_in": DEMO_TOKEN_LIFETIME}
    print(
        f"the demo's admin token {token_id} "
        + (
            "is revoked"
            if revoked
            else f"could not be revoked; it expires within {DEMO_TOKEN_LIFETIME}"
        )
    )
    if not revoked:
        failures.append("the demo's token was not revoked")
    report["failures"] = failures
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nfigures written to {args.out}")
    if report.get("kek", "").startswith("/"):
        print(
            f"The store's KEK is {report['kek']}: to start afresh, remove it together with "
            f"{data_dir}; removing the data directory alone leaves it behind."
        )
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    print("all forgetting checks passed")
    return 0


def _repair_pass(api: Client, conv: Conversation, names: dict[str, str]) -> dict[str, Any]:
    """Seal half a session after the fact, reopen, pause, conclude; check what stays reachable.

    The second half of one session is sealed into a repair, reopened, given a
    turn, paused, reopened, and concluded with DESTROY.
    """
    session = next(iter(conv.sessions))
    thread = f"owners/{conv.owner}/threads/session-{session}"
    turns = conv.sessions[session]
    # Seqs number on across re-runs (ids of forgotten threads continue), so the
    # session's seqs come from the names the server gave its turns.
    seqs = sorted(int(n.rsplit("/", 1)[-1]) for n in names if n.startswith(thread + "/"))
    half = max(1, len(turns) // 2)
    from_seq = seqs[half]
    sealed_texts = [text for _, _, text in turns[half:]]
    kept_texts = [text for _, _, text in turns[:half]]
    failures: list[str] = []

    sealed_names = {f"{thread}/turns/{seq}" for seq in seqs[half:]}
    kept_names = {f"{thread}/turns/{seq}" for seq in seqs[:half]}

    def found(text: str) -> bool:
        resp = api.search(f"owners/{conv.owner}", query_text=text, top_k=10)
        return any(
            h.turn.name in sealed_names | kept_names and h.turn.text == text for h in resp.hits
        )

    repair = api.seal_repair(thread, from_seq=from_seq)
    sealed_found = sum(found(t) for t in sealed_texts)
    kept_found = sum(found(t) for t in kept_texts)
    opened = api.reopen_repair(repair.name)
    note = "(repair note) let's leave this part of the conversation here"
    api.append_turns(repair.name, [{"role": "USER", "text": note}])
    api.pause_repair(repair.name)
    again = api.reopen_repair(repair.name)
    done = api.conclude_repair(repair.name, outcome="DESTROY")
    probe = f"{thread}/turns/{from_seq}"
    try:
        api.get_turn(probe)
        after = "READABLE"
    except LetheError as err:
        after = f"{err.code().name}/{err.reason_name}"
    print(
        f"\nrepair: sealed {thread} from turn {from_seq} ({len(sealed_texts)} turns) into "
        f"{repair.name}; search finds {sealed_found} sealed and {kept_found}/{len(kept_texts)} "
        f"kept turns; reopen returned {len(opened.turns)} turns, after one more turn and a "
        f"pause {len(again.turns)}; DESTROY receipt {done.receipt.name} deleted "
        f"{done.receipt.deleted}; GetTurn on a sealed turn now {after}"
    )
    if sealed_found:
        failures.append("sealed turns were found by search")
    if kept_found < len(kept_texts) * 0.8:  # a short text ("Bye!") may rank below its twins
        failures.append("turns before the seal were mostly not found")
    if len(opened.turns) != len(sealed_texts) or len(again.turns) != len(sealed_texts) + 1:
        failures.append("reopen did not return the sealed stretch")
    if after != "NOT_FOUND/RECORD_DELETED" or done.receipt.deleted != len(sealed_texts) + 1:
        failures.append("DESTROY left sealed material readable")
    return {
        "thread": thread,
        "from_seq": from_seq,
        "sealed": len(sealed_texts),
        "sealed_found_by_search": sealed_found,
        "kept_found": kept_found,
        "reopened_turns": len(again.turns),
        "destroyed": done.receipt.deleted,
        "get_after_destroy": after,
        "failures": failures,
    }


def _print_scores(
    per_mode: dict[str, Any], latency: dict[str, Any], dropped: int, empty: int
) -> None:
    print(
        f"\nrecall of evidence dialog ids (Search over gRPC, top-{max(KS)}); "
        f"{dropped} malformed evidence references dropped, {empty} items without evidence"
    )
    print("\nHYBRID (the default mode), by category, all conversations:")
    header = f"{'category':<16}{'items':>6}" + "".join(f"{'R@' + str(k):>8}" for k in KS)
    header += "".join(f"{'hit@' + str(k):>8}" for k in (1, 10))
    print(header)
    for group, e in per_mode["HYBRID"]["all"].items():
        row = f"{group:<16}{e['items']:>6}" + "".join(f"{e[f'recall@{k}']:>8.3f}" for k in KS)
        row += "".join(f"{e[f'hit@{k}']:>8.3f}" for k in (1, 10))
        print(row)
    print("\nevery mode, categories 1-4, by split:")
    print(f"{'mode':<9}{'split':<22}{'items':>6}" + "".join(f"{'R@' + str(k):>8}" for k in KS))
    for mode, splits in per_mode.items():
        for split, groups in splits.items():
            e = groups.get("overall (1-4)")
            if e is None:
                continue
            print(
                f"{mode:<9}{split:<22}{e['items']:>6}"
                + "".join(f"{e[f'recall@{k}']:>8.3f}" for k in KS)
            )
    print("\nlatency (ms): " + ", ".join(f"{k}={v}" for k, v in latency.items()))
