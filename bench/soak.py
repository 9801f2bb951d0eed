"""A bounded soak of one ``lethe serve`` on loopback; it stops by itself.

Several client processes (``--clients``), each with its own token and owners,
run mixed traffic for ``--duration`` seconds: appends (committed and
pending), commits, searches, context assembly, reads, listings, forgets, and
``Watch`` streams (``--watchers`` per client) that stay open throughout. Half
way through, a hot ``lethe backup`` runs while the load goes on. At the end
the server gets SIGTERM under load and must drain and exit 0. Then:

1. the server is started again and every acknowledged append that was not
   forgotten reads back with its text, every acknowledged forget answers
   ``RECORD_DELETED`` ("no acknowledged write lost"), and ``lethe audit`` is
   clean;
2. the backup is restored into a copy of the data directory (beside the same
   keystore): turns acknowledged before the backup began read back, turns
   forgotten before it began stay gone, and turns forgotten after it began
   are gone too (their keys were destroyed: the backup cannot bring them
   back);
3. stability: no 5-second window without a successful call (no deadlock),
   p99 per method under ``--p99-bound`` seconds, the server's RSS in the last
   third of the run within ``--rss-growth`` of the middle third, and the LMDB
   reader slots in use (``lethe_lmdb_readers``) never above the worker count
   plus the stream count plus a margin.

Prints a table and writes everything to ``--out`` (JSON); exits 1 if a check
fails. Short form (CI, ``tests/soak/``): ``--duration 15 --clients 2``. Full
form (a few minutes)::

    .venv/bin/python bench/soak.py --duration 300 --clients 4 --watchers 8
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import grpc
from _server import free_port

from lethe._rpc import Stubs, reason_of
from lethe.v1 import (
    common_pb2,
    events_pb2,
    lifecycle_pb2,
    retrieval_pb2,
    threads_pb2,
)
from shredder import KekRing

LETHE = [sys.executable, "-m", "server.cli"]
WORDS = [
    *("puppy", "garden", "violin", "marathon", "recipe", "tokyo", "chess", "lantern"),
    *("harbor", "cedar", "saffron", "glacier", "kayak", "pottery", "comet", "orchard"),
]
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


# ---------------------------------------------------------------------- a client process


class Client:
    """One client process: its threads, latencies and acknowledgement log."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stubs = Stubs.insecure(args.target, args.token)
        self.owners = args.owners.split(",")
        self.stop = Path(args.stop)
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.ok_times: list[float] = []
        self.acked: dict[str, str] = {}  # turn name -> text, appended and acknowledged
        self.acks = open(args.acks, "a", buffering=1)  # noqa: SIM115 (closed in run)
        self.events = 0
        self.threads: dict[str, list[str]] = {}

    def stopped(self) -> bool:
        """Whether the harness has asked the clients to stop (the ``--stop`` file exists)."""
        return self.stop.exists()

    def call(self, method: str, fn: Any, request: Any, **kw: Any) -> Any:
        """One call: latency recorded on success, errors counted; None on failure."""
        start = time.perf_counter()
        try:
            response = fn(request, metadata=self.stubs.md, timeout=30, **kw)
        except grpc.RpcError as err:
            code = err.code()
            reason = reason_of(err) if code != grpc.StatusCode.UNAVAILABLE else ""
            key = f"{method}:{code.name}:{reason}"
            with self.lock:
                self.errors[key] += 1
            if code in RETRYABLE:
                time.sleep(0.05 if code == grpc.StatusCode.RESOURCE_EXHAUSTED else 0.2)
            return None
        elapsed = time.perf_counter() - start
        with self.lock:
            self.latency[method].append(elapsed)
            self.ok_times.append(time.time())
        return response

    def log(self, **entry: Any) -> None:
        """Append ``entry`` and the time ``t`` (seconds since the epoch) to ``--acks``."""
        self.acks.write(json.dumps({**entry, "t": time.time()}) + "\n")

    def setup(self) -> None:
        """Create two threads per owner, retrying each until it succeeds or the run stops."""
        for owner in self.owners:
            names = []
            for _ in range(2):
                t = None
                while t is None and not self.stopped():
                    t = self.call(
                        "CreateThread",
                        self.stubs.threads.CreateThread,
                        threads_pb2.CreateThreadRequest(parent=f"owners/{owner}"),
                    )
                if t is not None:
                    names.append(t.name)
            self.threads[owner] = names

    def writer(self, rng: random.Random) -> None:
        """Append one turn at a time until stopped, logging every acknowledged append.

        A turn is committed on append with probability 0.7; each of the others is then
        committed with ``Commit`` with probability 0.5.
        """
        while not self.stopped():
            owner = rng.choice(self.owners)
            thread = rng.choice(self.threads[owner])
            text = " ".join(rng.choice(WORDS) for _ in range(8)) + f" {rng.getrandbits(48):x}"
            commit = rng.random() < 0.7
            resp = self.call(
                "AppendTurns",
                self.stubs.threads.AppendTurns,
                threads_pb2.AppendTurnsRequest(
                    parent=thread,
                    turns=[threads_pb2.TurnInput(role=common_pb2.USER, text=text, commit=commit)],
                ),
            )
            if resp is not None:
                turn = resp.turns[0]
                self.log(op="append", name=turn.name, text=text)
                with self.lock:
                    self.acked[turn.name] = text
                if not commit and rng.random() < 0.5:
                    self.call(
                        "Commit",
                        self.stubs.lifecycle.Commit,
                        lifecycle_pb2.CommitRequest(names=[turn.name]),
                    )

    def reader(self, rng: random.Random) -> None:
        """Read until stopped: Search, AssembleContext, GetTurn or ListTurns at random.

        Their shares are 40 %, 15 %, 25 % (of an acknowledged turn, when the thread has
        one) and 20 %.
        """
        while not self.stopped():
            owner = rng.choice(self.owners)
            thread = rng.choice(self.threads[owner])
            pick = rng.random()
            if pick < 0.4:
                self.call(
                    "Search",
                    self.stubs.retrieval.Search,
                    retrieval_pb2.SearchRequest(
                        parent=f"owners/{owner}", query_text=rng.choice(WORDS), top_k=10
                    ),
                )
            elif pick < 0.55:
                self.call(
                    "AssembleContext",
                    self.stubs.retrieval.AssembleContext,
                    retrieval_pb2.AssembleContextRequest(
                        thread=thread, query_text=rng.choice(WORDS), max_chars=2000
                    ),
                )
            elif pick < 0.8:
                with self.lock:
                    names = [n for n in self.acked if n.startswith(thread + "/")]
                if names:
                    self.call(
                        "GetTurn",
                        self.stubs.threads.GetTurn,
                        threads_pb2.GetTurnRequest(name=rng.choice(names)),
                    )
            else:
                self.call(
                    "ListTurns",
                    self.stubs.threads.ListTurns,
                    threads_pb2.ListTurnsRequest(parent=thread, page_size=50),
                )

    def forgetter(self, rng: random.Random) -> None:
        """Every 0.25 s, forget a random acknowledged turn once there are 10, until stopped.

        The attempt is logged before the call and the forget after its acknowledgement.
        """
        while not self.stopped():
            time.sleep(0.25)
            with self.lock:
                names = list(self.acked)
            if len(names) < 10:
                continue
            name = rng.choice(names)
            self.log(op="forget_attempt", name=name)
            if (
                self.call(
                    "Forget",
                    self.stubs.lifecycle.Forget,
                    lifecycle_pb2.ForgetRequest(names=[name]),
                )
                is not None
            ):
                self.log(op="forget", name=name)
                with self.lock:
                    self.acked.pop(name, None)

    def watcher(self, owner: str) -> None:
        """Hold a ``Watch`` stream of ``owner`` until stopped, counting its events.

        A stream that fails is counted as an error and reopened after the last event seen.
        """
        after = ""
        while not self.stopped():
            stream: Any = self.stubs.events.Watch(
                events_pb2.WatchRequest(parent=f"owners/{owner}", after=after),
                metadata=self.stubs.md,
                timeout=max(1.0, self.args.duration + 60),
            )
            try:
                for event in stream:
                    after = event.id
                    with self.lock:
                        self.events += 1
            except grpc.RpcError as err:
                with self.lock:
                    self.errors[f"Watch:{err.code().name}:{reason_of(err)}"] += 1
                time.sleep(0.2)

    def run(self) -> int:
        """Run this client until the stop file appears, then write ``--result`` (JSON).

        Two writers, two readers, one forgetter and ``--watchers`` watchers run as
        threads; the result holds latencies, errors, success times and the event count.

        Returns:
            The exit status, 0.
        """
        self.setup()
        workers = []
        for i in range(2):
            workers.append(threading.Thread(target=self.writer, args=(random.Random(i),)))
            workers.append(threading.Thread(target=self.reader, args=(random.Random(100 + i),)))
        workers.append(threading.Thread(target=self.forgetter, args=(random.Random(7),)))
        for i in range(self.args.watchers):
            owner = self.owners[i % len(self.owners)]
            workers.append(threading.Thread(target=self.watcher, args=(owner,), daemon=True))
        for w in workers:
            w.start()
        for w in workers:
            if not w.daemon:
                w.join()
        self.acks.close()
        with self.lock:
            out = {
                "latency": self.latency,
                "errors": self.errors,
                "ok_times": self.ok_times,
                "events": self.events,
            }
        Path(self.args.result).write_text(json.dumps(out))
        self.stubs.close()
        return 0


# ---------------------------------------------------------------------- the harness


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) if match else 0


class Harness:
    """The soak: one server, the client processes, and the checks of the module docstring.

    Args:
        args: The parsed command line (:func:`main`).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="lethe-soak-"))
        self.data = self.work / "data"
        self.env = {**os.environ, "LETHE_KEK": KekRing.generate_env_value()}
        self.failures: list[str] = []
        self.report: dict[str, Any] = {"args": vars(args)}

    def lethe(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the ``lethe`` command line with ``argv`` and the soak's KEK; output as text.

        Raises:
            subprocess.CalledProcessError: it exited non-zero and ``check`` is true.
            subprocess.TimeoutExpired: it ran for more than 300 s.
        """
        return subprocess.run(
            [*LETHE, *argv], env=self.env, capture_output=True, text=True, check=check, timeout=300
        )

    def serve(self, data: Path, log: str) -> tuple[subprocess.Popen[bytes], int, int]:
        """Start ``lethe serve`` on ``data``, its output in ``log``, and wait until it serves.

        Returns:
            ``(process, gRPC port, metrics port)``.

        Raises:
            RuntimeError: the server exited, or did not report serving within 120 s
                (the message is its log).
        """
        port, mport = free_port(), free_port()
        log_file = open(self.work / log, "wb")  # noqa: SIM115 (the process owns it)
        proc = subprocess.Popen(
            [
                *LETHE,
                "serve",
                "--data",
                str(data),
                "--listen",
                f"127.0.0.1:{port}",
                "--metrics-listen",
                f"127.0.0.1:{mport}",
                "--sweep-interval",
                "1s",
                "--max-streams-per-principal",
                str(max(128, self.args.watchers * 2)),
            ],
            env=self.env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while b"serving" not in (self.work / log).read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((self.work / log).read_text())
            time.sleep(0.1)
        return proc, port, mport

    def check(self, ok: bool, what: str) -> None:
        """Record the failed check ``what`` unless ``ok``."""
        if not ok:
            self.failures.append(what)

    def run(self) -> int:
        """Run the soak, check it, print the report and write it to ``--out`` (JSON).

        Returns:
            The exit status: 1 if a check failed, else 0.
        """
        a = self.args
        server, port, mport = self.serve(self.data, "server.log")
        clients = []
        stop = self.work / "stop"
        for i in range(a.clients):
            owners = [f"soak{i}-{j}" for j in range(2)]
            token = self.lethe(
                "token", "create", "--data", str(self.data), *[f"--owner={o}" for o in owners]
            ).stdout.strip()
            cmd = [
                sys.executable,
                __file__,
                "client",
                "--target",
                f"127.0.0.1:{port}",
                "--token",
                token,
                "--owners",
                ",".join(owners),
                "--watchers",
                str(a.watchers),
                "--duration",
                str(a.duration),
                "--stop",
                str(stop),
                "--acks",
                str(self.work / f"acks{i}.jsonl"),
                "--result",
                str(self.work / f"result{i}.json"),
            ]
            clients.append(subprocess.Popen(cmd, env=self.env))
        start = time.time()
        samples: list[dict[str, float]] = []
        backup_at = start + a.duration / 2
        backup_start: float | None = None
        backup = self.work / "backup"
        while time.time() - start < a.duration:
            try:
                m = _metrics(mport)
            except OSError:
                m = {}
            samples.append(
                {
                    "t": time.time() - start,
                    "rss_kib": _rss_kib(server.pid),
                    "readers": m.get("lethe_lmdb_readers", -1),
                    "streams": m.get("lethe_open_streams", -1),
                    "inflight": m.get("lethe_inflight_calls", -1),
                }
            )
            if backup_start is None and time.time() >= backup_at:
                backup_start = time.time()
                out = self.lethe("backup", "--data", str(self.data), "--out", str(backup))
                self.report["backup"] = {
                    "seconds": round(time.time() - backup_start, 2),
                    "output": out.stdout.strip(),
                }
            time.sleep(1.0)
        final = _metrics(mport)
        self.report["refused"] = {
            k: v for k, v in final.items() if k.startswith("lethe_refused_calls_total")
        }
        # SIGTERM under load: the clients are still sending.
        term_at = time.time()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=120)
        self.report["sigterm"] = {"exit": code, "seconds": round(time.time() - term_at, 2)}
        self.check(code == 0, f"server exited {code} on SIGTERM")
        stop.touch()
        for c in clients:
            self.check(c.wait(timeout=120) == 0, "a client failed")
        self.report["samples"] = samples
        self.summarise(start, samples)
        self.verify(backup_start)
        self.print_report()
        Path(a.out).write_text(json.dumps(self.report, indent=1, default=str))
        return 1 if self.failures else 0

    def results(self) -> list[dict[str, Any]]:
        """Every client's ``--result`` file, parsed, in client order."""
        return [
            json.loads((self.work / f"result{i}.json").read_text())
            for i in range(self.args.clients)
        ]

    def summarise(self, start: float, samples: list[dict[str, float]]) -> None:
        """Merge the clients' results into the report and run the stability checks.

        The checks: p99 per method, Watch events, 5-second windows, unexpected errors,
        RSS growth and LMDB reader slots (module docstring, step 3).

        Args:
            start: When the load began, seconds since the epoch.
            samples: About one per second of load: ``t`` (seconds since ``start``),
                ``rss_kib`` and the ``readers``, ``streams`` and ``inflight`` gauges
                (-1 when the metrics could not be read).
        """
        a = self.args
        latency: dict[str, list[float]] = defaultdict(list)
        errors: dict[str, int] = defaultdict(int)
        ok_times: list[float] = []
        events = 0
        for r in self.results():
            for method, values in r["latency"].items():
                latency[method].extend(values)
            for key, n in r["errors"].items():
                errors[key] += n
            ok_times.extend(r["ok_times"])
            events += r["events"]
        table = {}
        for method, values in sorted(latency.items()):
            p99 = _percentile(values, 0.99)
            table[method] = {
                "calls": len(values),
                "p50_ms": round(_percentile(values, 0.5) * 1e3, 2),
                "p99_ms": round(p99 * 1e3, 2),
                "max_ms": round(max(values) * 1e3, 2),
            }
            self.check(p99 <= a.p99_bound, f"{method} p99 {p99:.3f} s > {a.p99_bound} s")
        self.report["methods"] = table
        self.report["errors"] = dict(errors)
        self.report["events_received"] = events
        self.check(events > 0, "no Watch event arrived")
        # No deadlock: a successful call in every 5-second window of the run.
        windows: dict[int, int] = defaultdict(int)
        for t in ok_times:
            if t - start < a.duration:
                windows[int((t - start) // 5)] += 1
        empty = [w for w in range(int(a.duration // 5)) if windows[w] == 0]
        self.report["empty_windows"] = empty
        self.check(not empty, f"no successful call in 5-s windows {empty}")
        unexpected = {
            k: v
            for k, v in errors.items()
            if not any(s in k for s in ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "CANCELLED"))
            and not k.startswith(("GetTurn:NOT_FOUND", "Commit:NOT_FOUND", "Forget:NOT_FOUND"))
            and "SOURCE_" not in k
        }
        self.check(not unexpected, f"unexpected errors {unexpected}")
        third = max(1, len(samples) // 3)
        middle = [s["rss_kib"] for s in samples[third : 2 * third]]
        last = [s["rss_kib"] for s in samples[2 * third :]]
        rss_mid = _percentile(middle, 0.5) if middle else 0
        rss_end = _percentile(last, 0.5) if last else 0
        readers = [s["readers"] for s in samples if s["readers"] >= 0]
        self.report["rss_kib"] = {
            "first": samples[0]["rss_kib"] if samples else 0,
            "middle_median": rss_mid,
            "last_median": rss_end,
            "max": max((s["rss_kib"] for s in samples), default=0),
        }
        self.report["lmdb_readers"] = {
            "max": max(readers, default=-1),
            "last": readers[-1] if readers else -1,
        }
        if rss_mid:
            growth = rss_end / rss_mid - 1.0
            self.check(growth <= a.rss_growth, f"RSS grew {growth:.0%} from middle to last third")
        bound = 16 + a.clients * a.watchers + 8
        self.check(max(readers, default=0) <= bound, f"LMDB readers up to {max(readers)} > {bound}")

    def _acks(self) -> tuple[dict[str, tuple[str, float]], dict[str, float], set[str]]:
        appended: dict[str, tuple[str, float]] = {}
        forgotten: dict[str, float] = {}
        attempted: set[str] = set()
        for i in range(self.args.clients):
            for line in (self.work / f"acks{i}.jsonl").read_text().splitlines():
                e = json.loads(line)
                if e["op"] == "append":
                    appended[e["name"]] = (e["text"], e["t"])
                elif e["op"] == "forget":
                    forgotten[e["name"]] = e["t"]
                else:
                    attempted.add(e["name"])
        return appended, forgotten, attempted - set(forgotten)

    def _read_all(self, data: Path, names: list[str], log: str) -> dict[str, tuple[str, str]]:
        """Start a server on ``data`` and read every name: name -> (outcome, text)."""
        proc, port, _ = self.serve(data, log)
        token = self.lethe("token", "create", "--data", str(data), "--admin").stdout.strip()
        out: dict[str, tuple[str, str]] = {}
        with Stubs.insecure(f"127.0.0.1:{port}", token) as c:
            for name in names:
                try:
                    turn = c.threads.GetTurn(
                        threads_pb2.GetTurnRequest(name=name), metadata=c.md, timeout=30
                    )
                    out[name] = ("ok", turn.text)
                except grpc.RpcError as err:
                    out[name] = (reason_of(err) or err.code().name, "")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        return out

    def verify(self, backup_start: float | None) -> None:
        """Check acknowledged writes after a restart, then in the restored backup.

        Module docstring, steps 1 and 2.

        Args:
            backup_start: When the backup began, seconds since the epoch; None when no
                backup was taken (itself a failed check).
        """
        appended, forgotten, uncertain = self._acks()
        kept = [n for n in appended if n not in forgotten and n not in uncertain]
        got = self._read_all(self.data, [*kept, *forgotten], "restart.log")
        lost = [n for n in kept if got[n] != ("ok", appended[n][0])]
        revived = [n for n in forgotten if got[n][0] == "ok"]
        self.report["writes"] = {
            "appends_acknowledged": len(appended),
            "forgets_acknowledged": len(forgotten),
            "uncertain_forgets": len(uncertain),
            "lost": len(lost),
            "forgotten_but_readable": len(revived),
        }
        self.check(not lost, f"{len(lost)} acknowledged appends lost, e.g. {lost[:3]}")
        self.check(not revived, f"{len(revived)} forgotten turns readable, e.g. {revived[:3]}")
        audit = self.lethe("audit", "--data", str(self.data), check=False)
        self.report["audit"] = audit.stdout.strip().splitlines()
        self.check(audit.returncode == 0, f"audit: {audit.stdout}")
        if backup_start is None:
            self.check(False, "no backup was taken")
            return
        copy = self.work / "restored"
        shutil.copytree(self.data, copy)
        restored = self.lethe("restore", "--backup", str(self.work / "backup"), "--data", str(copy))
        before = [
            n
            for n, (_, t) in appended.items()
            if t < backup_start and n not in forgotten and n not in uncertain
        ]
        gone_before = [n for n, t in forgotten.items() if t < backup_start]
        gone_after = [
            n
            for n, t in forgotten.items()
            if t >= backup_start and appended.get(n, ("", 1e18))[1] < backup_start
        ]
        got = self._read_all(copy, [*before, *gone_before, *gone_after], "restored.log")
        missing = [n for n in before if got[n] != ("ok", appended[n][0])]
        back = [n for n in [*gone_before, *gone_after] if got[n][0] == "ok"]
        self.report["restore"] = {
            "output": restored.stdout.strip(),
            "acknowledged_before_backup": len(before),
            "missing": len(missing),
            "forgotten_before_backup": len(gone_before),
            "forgotten_after_backup": len(gone_after),
            "forgotten_but_readable": len(back),
        }
        self.check(not missing, f"{len(missing)} turns missing from the restored backup")
        self.check(not back, f"{len(back)} forgotten turns readable after restore")

    def print_report(self) -> None:
        """Print the per-method table, the other figures and the checks' outcome."""
        r = self.report
        print(
            f"soak: {self.args.clients} clients x ({self.args.watchers} Watch streams, "
            f"2 writers, 2 readers, 1 forgetter) for {self.args.duration:.0f} s"
        )
        print(f"{'method':<18}{'calls':>8}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
        for method, row in r["methods"].items():
            print(
                f"{method:<18}{row['calls']:>8}{row['p50_ms']:>10.2f}{row['p99_ms']:>10.2f}"
                f"{row['max_ms']:>10.2f}"
            )
        print(f"Watch events received: {r['events_received']}")
        print(f"refused: {r['refused']}")
        print(f"errors: {r['errors']}")
        print(f"RSS KiB: {r['rss_kib']}; LMDB readers: {r['lmdb_readers']}")
        print(f"backup: {r.get('backup')}")
        print(f"SIGTERM under load: {r['sigterm']}")
        print(f"writes: {r['writes']}")
        print(f"restore: {r.get('restore')}")
        print("checks: " + ("all passed" if not self.failures else "; ".join(self.failures)))


def main(argv: list[str] | None = None) -> int:
    """Run the soak, or one client process (role ``client``).

    Args:
        argv: The command line without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status: 1 if a check failed, else 0.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role")
    client = sub.add_parser("client")
    for flag in ("--target", "--token", "--owners", "--stop", "--acks", "--result"):
        client.add_argument(flag, required=True)
    client.add_argument("--watchers", type=int, default=4)
    client.add_argument("--duration", type=float, default=60)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of load (180)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (4)")
    parser.add_argument("--watchers", type=int, default=4, help="Watch streams per client (4)")
    parser.add_argument("--p99-bound", type=float, default=2.0, help="seconds (2.0)")
    parser.add_argument("--rss-growth", type=float, default=0.25, help="fraction (0.25)")
    parser.add_argument("--out", default="soak-results.json")
    args = parser.parse_args(argv)
    if args.role == "client":
        return Client(args).run()
    return Harness(args).run()


if __name__ == "__main__":
    sys.exit(main())
