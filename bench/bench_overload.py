"""Streams and calls held at once, and overload, against ``lethe serve`` in its own process.

The server has its default bounds: 16 workers, 1024 calls in flight, 256 per token.
All figures of one run are measured against a floor from the same run: another
owner's calls on an idle server.

1. floor: owner B alone — ``GetThread`` and ``Search`` one at a time;
2. ``--streams`` idle ``Watch`` streams of owner A's one token (far more than
   workers), then B's calls again, the health check, and the time from one
   ``Forget`` of A to the event on every stream;
3. the same streams plus ``--hot`` concurrent call loops of A's token
   (``Search``, from another process), then B's calls again; A's refusals
   counted;
4. a burst: ``--burst`` concurrent loops spread over 8 tokens (another
   process) while B's calls are measured, then 8 loops (one per token) for
   comparison: calls answered, refused (``TOO_MANY_REQUESTS``), p50/p99 of
   the admitted and of the refusals, throughput;
5. a flood: ``--flood`` closed ``Search`` loops of A's one token (another
   process, no streams) while B's calls are measured; the fairness goal is
   B's ``Search`` p99 at most 5x its floor;
6. large writes: ``--appends`` concurrent loops of ``AppendTurns`` of A, each
   request ``--append-mib`` MiB (turns of 16 KiB), while B's calls are
   measured; the goal is B's ``Search`` p99 at most 50 ms.

Usage::

    .venv/bin/python bench/bench_overload.py [--streams 1000] [--hot 64] [--burst 128]

Prints a table and writes ``--out`` (JSON). The machine is shared and noisy:
compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from _server import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lethe._rpc import reason_of
from lethe.v1 import (
    common_pb2,
    events_pb2,
    events_pb2_grpc,
    lifecycle_pb2,
    lifecycle_pb2_grpc,
    retrieval_pb2,
    retrieval_pb2_grpc,
    threads_pb2,
    threads_pb2_grpc,
)
from shredder import KekRing

LETHE = [sys.executable, "-m", "server.cli"]
WORDS = ["puppy", "garden", "violin", "marathon", "recipe", "tokyo", "chess", "lantern"]


PHASES = ("streams", "burst", "flood", "appends")
"""The phases after the floor (the module docstring's 2-3, 4, 5 and 6); ``--phases``."""


def _phases(text: str) -> list[str]:
    """``--phases``: names from :data:`PHASES`, comma-separated."""
    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(PHASES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown phases {unknown}; choose from {PHASES}")
    return names


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(_pct(values, 0.5) * 1e3, 2),
        "p99_ms": round(_pct(values, 0.99) * 1e3, 2),
    }


class Bench:
    """One overload run against ``lethe serve``, or the ``load`` role's loops.

    Args:
        args: The parsed command line (:func:`main`).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data = Path(tempfile.mkdtemp(prefix="lethe-overload-")) / "data"
        self.env = {**os.environ, "LETHE_KEK": KekRing.generate_env_value()}
        self.port = free_port()
        self.report: dict[str, Any] = {"args": vars(args)}

    def token(self) -> str:
        """A new admin token of this run's data directory (``lethe token create``).

        Raises:
            subprocess.CalledProcessError: the command failed.
        """
        out = subprocess.run(
            [*LETHE, "token", "create", "--data", str(self.data), "--admin"],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    def md(self, token: str) -> tuple[tuple[str, str], ...]:
        """The call metadata that sends ``token`` as a bearer token."""
        return (("authorization", f"Bearer {token}"),)

    async def other_owner(self, ch: grpc.aio.Channel, token: str, thread: str) -> dict[str, Any]:
        """B's calls one at a time: GetThread and Search, ``--calls`` of each."""
        threads = threads_pb2_grpc.ThreadsStub(ch)
        retrieval = retrieval_pb2_grpc.RetrievalStub(ch)
        get: list[float] = []
        search: list[float] = []
        for i in range(self.args.calls):
            t0 = time.perf_counter()
            await threads.GetThread(
                threads_pb2.GetThreadRequest(name=thread), metadata=self.md(token), timeout=30
            )
            get.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await retrieval.Search(
                retrieval_pb2.SearchRequest(parent="owners/bob", query_text=WORDS[i % len(WORDS)]),
                metadata=self.md(token),
                timeout=30,
            )
            search.append(time.perf_counter() - t0)
        return {"GetThread": _ms(get), "Search": _ms(search)}

    async def health(self, ch: grpc.aio.Channel) -> dict[str, float]:
        """``--calls`` health checks one at a time: their count and p50/p99 in ms."""
        stub = health_pb2_grpc.HealthStub(ch)
        lat = []
        for _ in range(self.args.calls):
            t0 = time.perf_counter()
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
            lat.append(time.perf_counter() - t0)
        return _ms(lat)

    async def seed(self, ch: grpc.aio.Channel, token: str, owner: str) -> str:
        """Create a thread of ``owner`` with 200 committed turns; returns its name."""
        threads = threads_pb2_grpc.ThreadsStub(ch)
        t = await threads.CreateThread(
            threads_pb2.CreateThreadRequest(parent=f"owners/{owner}"), metadata=self.md(token)
        )
        for b in range(4):
            turns = [
                threads_pb2.TurnInput(
                    role=common_pb2.USER,
                    text=f"{WORDS[i % len(WORDS)]} {WORDS[(i * 3) % len(WORDS)]} note {b}-{i}",
                    commit=True,
                )
                for i in range(50)
            ]
            await threads.AppendTurns(
                threads_pb2.AppendTurnsRequest(parent=t.name, turns=turns), metadata=self.md(token)
            )
        return str(t.name)

    async def loop(
        self,
        ch: grpc.aio.Channel,
        token: str,
        owner: str,
        stop: asyncio.Event,
        out: dict[str, list[Any]],
    ) -> None:
        """Call ``Search`` of ``owner`` back to back until ``stop`` is set.

        Each call's latency in seconds goes to ``out["ok"]``, or for a failed call to
        ``out[reason]`` (its ``ErrorInfo`` reason, else its status code's name); a
        ``RESOURCE_EXHAUSTED`` refusal is followed by a 10 ms pause.
        """
        retrieval = retrieval_pb2_grpc.RetrievalStub(ch)
        i = 0
        while not stop.is_set():
            i += 1
            t0 = time.perf_counter()
            try:
                await retrieval.Search(
                    retrieval_pb2.SearchRequest(
                        parent=f"owners/{owner}", query_text=WORDS[i % len(WORDS)]
                    ),
                    metadata=self.md(token),
                    timeout=30,
                )
                out["ok"].append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError as err:
                reason = reason_of(err) or err.code().name
                out.setdefault(reason, []).append(time.perf_counter() - t0)
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    await asyncio.sleep(0.01)

    async def append_loop(
        self,
        ch: grpc.aio.Channel,
        token: str,
        thread: str,
        stop: asyncio.Event,
        out: dict[str, list[Any]],
    ) -> None:
        """Append ``--append-mib`` MiB of committed 16 KiB turns to ``thread`` back to back.

        Latencies (seconds) go to ``out`` as in :meth:`loop`.
        """
        threads = threads_pb2_grpc.ThreadsStub(ch)
        n = max(1, int(self.args.append_mib * (1 << 20)) // (16 << 10))
        body = "a large write " * ((16 << 10) // 14)
        while not stop.is_set():
            turns = [
                threads_pb2.TurnInput(role=common_pb2.USER, text=f"{i} {body}", commit=True)
                for i in range(n)
            ]
            t0 = time.perf_counter()
            try:
                await threads.AppendTurns(
                    threads_pb2.AppendTurnsRequest(parent=thread, turns=turns),
                    metadata=self.md(token),
                    timeout=120,
                )
                out["ok"].append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError as err:
                reason = reason_of(err) or err.code().name
                out.setdefault(reason, []).append(time.perf_counter() - t0)
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    await asyncio.sleep(0.01)

    async def load(self) -> None:
        """The ``load`` role: ``--loops`` Search (or append) loops over ``--tokens``.

        The loops run until SIGTERM or ``--seconds``; counts and latencies go to ``--out``.
        """
        a = self.args
        tokens = a.tokens.split(",")
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        opts = [
            ("grpc.max_concurrent_streams", 1 << 20),
            ("grpc.max_send_message_length", 64 << 20),
        ]
        chans = [grpc.aio.insecure_channel(a.target, options=opts) for _ in tokens]
        out: dict[str, list[Any]] = {"ok": []}
        start = time.monotonic()
        if a.kind == "append":
            thread = await self.seed(chans[0], tokens[0], a.owner)
            loops = [
                asyncio.ensure_future(
                    self.append_loop(
                        chans[i % len(tokens)], tokens[i % len(tokens)], thread, stop, out
                    )
                )
                for i in range(a.loops)
            ]
        else:
            loops = [
                asyncio.ensure_future(
                    self.loop(chans[i % len(tokens)], tokens[i % len(tokens)], a.owner, stop, out)
                )
                for i in range(a.loops)
            ]
        try:
            await asyncio.wait_for(stop.wait(), timeout=a.seconds)
        except TimeoutError:
            stop.set()
        await asyncio.gather(*loops, return_exceptions=True)
        seconds = time.monotonic() - start
        for ch in chans:
            await ch.close(None)
        Path(a.out).write_text(
            json.dumps(
                {
                    "loops": a.loops,
                    "tokens": len(tokens),
                    "seconds": round(seconds, 2),
                    "ok": len(out["ok"]),
                    "refused": len(out.get("TOO_MANY_REQUESTS", [])),
                    "other_errors": {
                        k: len(v) for k, v in out.items() if k not in ("ok", "TOO_MANY_REQUESTS")
                    },
                    "ok_per_s": round(len(out["ok"]) / seconds, 1),
                    "ok_latency": _ms(out["ok"]),
                    "refusal_latency": _ms(out.get("TOO_MANY_REQUESTS", [])),
                }
            )
        )

    def start_load(
        self, tokens: list[str], owner: str, loops: int, tag: str, kind: str = "search"
    ) -> Any:
        """Start the ``load`` role in another process (for 600 s at most).

        Returns:
            ``(process, path of its JSON output)``, for :meth:`stop_load`.
        """
        out = self.data.parent / f"load-{tag}.json"
        cmd = [
            sys.executable,
            __file__,
            "load",
            "--target",
            f"127.0.0.1:{self.port}",
            "--tokens",
            ",".join(tokens),
            "--owner",
            owner,
            "--loops",
            str(loops),
            "--seconds",
            "600",
            "--out",
            str(out),
            "--kind",
            kind,
            "--append-mib",
            str(self.args.append_mib),
        ]
        return subprocess.Popen(cmd, env=self.env), out

    @staticmethod
    def stop_load(started: Any) -> dict[str, Any]:
        """Stop a load process of :meth:`start_load` (SIGTERM, 60 s wait); its JSON output."""
        proc, out = started
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        return dict(json.loads(Path(out).read_text()))

    async def run(self) -> None:
        """Start ``lethe serve`` with stream bounds for ``--streams``, :meth:`measure`, stop it.

        Raises:
            RuntimeError: the server exited, or did not report serving within 120 s
                (the message is its log).
        """
        a = self.args
        log = open(self.data.parent / "server.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                *LETHE,
                "serve",
                "--data",
                str(self.data),
                "--listen",
                f"127.0.0.1:{self.port}",
                "--metrics-listen",
                "off",
                "--max-streams",
                str(a.streams + 64),
                "--max-streams-per-principal",
                str(a.streams),
                *a.serve_args.split(),
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            while b"serving" not in (self.data.parent / "server.log").read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((self.data.parent / "server.log").read_text())
                await asyncio.sleep(0.1)
            await self.measure()
        finally:
            proc.terminate()
            proc.wait(timeout=60)

    async def measure(self) -> None:
        """Run the four phases of the module docstring, their figures into ``report``."""
        a = self.args
        tokens = [self.token() for _ in range(10)]
        alice, bob, burst_tokens = tokens[0], tokens[1], tokens[2:]
        target = f"127.0.0.1:{self.port}"
        opts = [("grpc.max_concurrent_streams", 1 << 20)]
        b_ch = grpc.aio.insecure_channel(target, options=opts)
        a_ch = grpc.aio.insecure_channel(target, options=opts)
        h_ch = grpc.aio.insecure_channel(target)
        a_thread = await self.seed(a_ch, alice, "alice")
        b_thread = await self.seed(b_ch, bob, "bob")
        r = self.report
        r["floor"] = {
            **await self.other_owner(b_ch, bob, b_thread),
            "Health": await self.health(h_ch),
        }

        if "streams" in a.phases:
            # 2. many idle streams of one token
            events = events_pb2_grpc.EventsStub(a_ch)
            streams = [
                events.Watch(
                    events_pb2.WatchRequest(
                        parent="owners/alice", types=[events_pb2.RECORD_DELETED]
                    ),
                    metadata=self.md(alice),
                )
                for _ in range(a.streams)
            ]
            first = [asyncio.ensure_future(s.read()) for s in streams]
            await asyncio.sleep(2.0)  # every stream open and waiting
            r["with_streams"] = {
                **await self.other_owner(b_ch, bob, b_thread),
                "Health": await self.health(h_ch),
            }
            threads = threads_pb2_grpc.ThreadsStub(a_ch)
            victim = await threads.AppendTurns(
                threads_pb2.AppendTurnsRequest(
                    parent=a_thread, turns=[threads_pb2.TurnInput(role=common_pb2.USER, text="bye")]
                ),
                metadata=self.md(alice),
            )
            t0 = time.perf_counter()
            await lifecycle_pb2_grpc.LifecycleStub(a_ch).Forget(
                lifecycle_pb2.ForgetRequest(names=[victim.turns[0].name]), metadata=self.md(alice)
            )
            acked = time.perf_counter() - t0
            got: list[Any] = await asyncio.gather(*first)
            fanout = time.perf_counter() - t0
            assert all(e.subject == victim.turns[0].name for e in got)
            r["fanout"] = {
                "streams": a.streams,
                "forget_ms": round(acked * 1e3, 2),
                "forget_to_last_stream_ms": round(fanout * 1e3, 2),
            }

            # 3. the streams, plus hot call loops of the same token (another process)
            hot = self.start_load([alice], "alice", a.hot, "hot")
            await asyncio.sleep(3.0)  # the loops are running
            r["with_streams_and_hot_token"] = await self.other_owner(b_ch, bob, b_thread)
            r["hot_token"] = self.stop_load(hot)
            for s in streams:
                s.cancel()

        if "burst" in a.phases:
            # 4. a burst past the bounds (another process), B measured meanwhile;
            # then a load within the bounds for comparison.
            for label, n in (("burst", a.burst), ("within_bounds", 8)):
                load = self.start_load(burst_tokens, "alice", n, label)
                await asyncio.sleep(3.0)
                r[f"other_owner_during_{label}"] = await self.other_owner(b_ch, bob, b_thread)
                r[label] = self.stop_load(load)
        if "flood" in a.phases:
            # 5. a flood of one token's closed Search loops (no streams)
            flood = self.start_load([alice], "alice", a.flood, "flood")
            await asyncio.sleep(3.0)
            r["other_owner_during_flood"] = await self.other_owner(b_ch, bob, b_thread)
            r["flood"] = self.stop_load(flood)

        # 6. large concurrent writes of A
        if a.appends and "appends" in a.phases:
            writes = self.start_load([alice], "alice", a.appends, "appends", kind="append")
            await asyncio.sleep(3.0)
            r["other_owner_during_appends"] = await self.other_owner(b_ch, bob, b_thread)
            r["appends"] = self.stop_load(writes)
        for ch in (a_ch, b_ch, h_ch):
            await ch.close(None)

    def print(self) -> None:
        """Print the report: B's latencies per phase, health, fan-out, the loads' counts."""
        r = self.report
        head = f"{'owner B alone / with load':<44}{'GetThread p50/p99 ms':>22}"
        print(f"{head}{'Search p50/p99 ms':>20}")
        for key, label in (
            ("floor", "idle server (floor)"),
            ("with_streams", f"+ {self.args.streams} Watch streams of A"),
            ("with_streams_and_hot_token", f"+ those and {self.args.hot} call loops of A"),
            ("other_owner_during_burst", f"during a burst of {self.args.burst} loops"),
            ("other_owner_during_within_bounds", "during 8 loops (within bounds)"),
            ("other_owner_during_flood", f"during {self.args.flood} Search loops of A"),
            (
                "other_owner_during_appends",
                f"during {self.args.appends} appends of {self.args.append_mib} MiB of A",
            ),
        ):
            if key not in r:
                continue
            g, s = r[key]["GetThread"], r[key]["Search"]
            row = f"{label:<44}{g['p50_ms']:>10.2f} / {g['p99_ms']:<9.2f}"
            print(f"{row}{s['p50_ms']:>9.2f} / {s['p99_ms']:<9.2f}")
        if "with_streams" in r:
            f, w = r["floor"], r["with_streams"]
            print(
                f"health p50/p99 ms: idle {f['Health']['p50_ms']} / {f['Health']['p99_ms']}, "
                f"with streams {w['Health']['p50_ms']} / {w['Health']['p99_ms']}"
            )
            print(f"fan-out: {r['fanout']}")
            print(f"A's hot token: {r['hot_token']}")
            ratio = r["with_streams_and_hot_token"]["GetThread"]["p99_ms"] / max(
                r["floor"]["GetThread"]["p99_ms"], 1e-9
            )
            print(f"B's GetThread p99 under load / floor: {ratio:.2f}x")
        for key in ("burst", "within_bounds"):
            if key not in r:
                continue
            b = r[key]
            print(
                f"{key}: {b['loops']} loops, {b['ok']} ok ({b['ok_per_s']}/s, p50 "
                f"{b['ok_latency']['p50_ms']} ms, p99 {b['ok_latency']['p99_ms']} ms), "
                f"{b['refused']} refused (p99 {b['refusal_latency']['p99_ms']} ms), "
                f"other {b['other_errors']}"
            )
        floor = max(r["floor"]["Search"]["p99_ms"], 1e-9)
        if "flood" in r:
            flood = r["other_owner_during_flood"]["Search"]["p99_ms"]
            print(
                f"fairness: B's Search p99 during A's {self.args.flood} loops {flood:.1f} ms = "
                f"{flood / floor:.2f}x its floor (goal <= 5x); A: {r['flood']['ok']} ok, "
                f"{r['flood']['refused']} refused"
            )
        if "appends" in r:
            during = r["other_owner_during_appends"]["Search"]["p99_ms"]
            print(
                f"large writes: B's Search p99 during A's {self.args.appends} appends of "
                f"{self.args.append_mib} MiB {during:.1f} ms (goal <= 50 ms); A: "
                f"{r['appends']['ok']} appends ({r['appends']['ok_latency']['p50_ms']} ms p50)"
            )


def main() -> int:
    """Run the benchmark and write its report to ``--out``, or run the ``load`` role.

    Returns:
        The exit status, 0.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role")
    load = sub.add_parser("load", help="(internal) a load generator process")
    for flag in ("--target", "--tokens", "--owner", "--out"):
        load.add_argument(flag, required=True)
    load.add_argument("--loops", type=int, required=True)
    load.add_argument("--seconds", type=float, required=True)
    load.add_argument("--kind", choices=["search", "append"], default="search")
    load.add_argument("--append-mib", type=float, default=4.0)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--hot", type=int, default=64)
    parser.add_argument("--burst", type=int, default=128)
    parser.add_argument("--flood", type=int, default=128, help="A's closed Search loops")
    parser.add_argument("--appends", type=int, default=4, help="A's concurrent large appends")
    parser.add_argument("--append-mib", type=float, default=4.0, help="MiB per append")
    parser.add_argument("--calls", type=int, default=200, help="B's calls per phase")
    parser.add_argument("--serve-args", default="", help="more `lethe serve` flags")
    parser.add_argument(
        "--phases",
        type=_phases,
        default=list(PHASES),
        help=f"which phases after the floor, comma-separated (default: all of {','.join(PHASES)})",
    )
    parser.add_argument("--out", default="bench-overload.json")
    args = parser.parse_args()
    bench = Bench(args)
    if args.role == "load":
        asyncio.run(bench.load())
        return 0
    asyncio.run(bench.run())
    bench.print()
    Path(args.out).write_text(json.dumps(bench.report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
