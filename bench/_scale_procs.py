"""Processes of the scale benchmark: the Lethe server, the minimal server, the load clients.

The client processes drive concurrent load.

- :class:`LetheProcess`: ``lethe serve`` in its own process on a throwaway
  data directory with a fixed KEK (``LETHE_KEK``), so it can be stopped and
  started again on the same data; its output goes to a log file (a pipe that
  nobody reads would block a chatty server).
- :class:`MinimalProcess`: ``bench/minimal_server.py`` in its own process.
- :class:`ClientPool`: long-lived client processes (``spawn``, so no gRPC state
  is forked) that each run a closed loop of unary calls for a fixed time and
  report every latency. The same pool drives every gRPC system, so the client
  cost is the same for all of them.
- :func:`memory_of`: peak and current resident set of a process, from
  ``/proc/PID/status`` (Linux).

Threads: none of these objects may be shared between threads.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import grpc
from _server import free_port

from lethe.v1 import retrieval_pb2, retrieval_pb2_grpc, threads_pb2, threads_pb2_grpc
from shredder import KekRing

__all__ = [
    "CallBatch",
    "ClientPool",
    "LetheProcess",
    "MinimalProcess",
    "RunResult",
    "machine_cpu",
    "memory_of",
    "process_age",
    "wait_quiet",
]

BENCH = Path(__file__).resolve().parent
_START_TIMEOUT_S = 300.0


def _stat(path: str) -> tuple[str, float] | None:
    """``(name, CPU seconds)`` from a ``stat`` file of ``/proc``, or None if unreadable.

    The name is field 2 (``comm``); the CPU time fields 14 and 15, ``utime``
    and ``stime``, in clock ticks (proc(5)).
    """
    try:
        stat = Path(path).read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])
    return stat[stat.index("(") + 1 : stat.rindex(")")], ticks / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time a running process has used so far (user + system), in seconds; 0.0 if unreadable."""
    found = _stat(f"/proc/{pid}/stat")
    return 0.0 if found is None else found[1]


def cpu_by_thread(pid: int) -> dict[str, float]:
    """CPU time each group of a running process's threads has used so far, in seconds.

    Threads are grouped by their operating-system name (``/proc/{pid}/task/
    {tid}/comm``; Lethe names its own: ``server._thread_names``) with a
    trailing ``-N`` folded (``lethe-rpc-3`` counts as ``lethe-rpc``). Threads
    that end between two calls drop out of the later one. Empty if unreadable.
    """
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        found = _stat(f"/proc/{pid}/task/{tid}/stat")
        if found is not None:
            name = found[0].rstrip("0123456789").rstrip("-")
            out[name] = out.get(name, 0.0) + found[1]
    return out


def machine_cpu() -> tuple[float, float]:
    """``(busy, total)`` CPU seconds of the whole machine since boot, summed over every core.

    From the ``cpu`` line of ``/proc/stat`` (proc(5)): busy is user, nice,
    system, irq, softirq and steal; total adds idle and iowait (guest time is
    already counted in user). Two readings give the machine's busy fraction
    between them: ``(busy1 - busy0) / (total1 - total0)``. ``(0.0, 0.0)`` where
    ``/proc/stat`` is unreadable.
    """
    try:
        line = Path("/proc/stat").read_text().splitlines()[0]
    except OSError:
        return 0.0, 0.0
    ticks = [int(x) for x in line.split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks + [0] * (8 - len(ticks))
    busy = user + nice + system + irq + softirq + steal
    hz = os.sysconf("SC_CLK_TCK")
    return busy / hz, (busy + idle + iowait) / hz


def memory_of(pid: int) -> dict[str, int]:
    """Resident memory of a running process.

    Args:
        pid: Process id.

    Returns:
        ``vm_hwm``, ``vm_rss``, ``rss_anon`` and ``rss_file`` in bytes
        (``VmHWM`` is the peak resident set since the process started); an empty
        dict where ``/proc`` is not readable.
    """
    fields = {"VmHWM": "vm_hwm", "VmRSS": "vm_rss", "RssAnon": "rss_anon", "RssFile": "rss_file"}
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            out[fields[key]] = int(value.split()[0]) * 1024  # kB
    return out


QUIET_CPU_S = 0.02
"""Sweeper CPU seconds a second under which a process counts as past its start-up work."""
FIRST_PASS_S = 6.0
"""Process age by which its sweeper has begun its first pass (``lethe serve``'s default
``--sweep-interval`` is 5 s: the first pass, with the first audit, starts then)."""


def process_age(pid: int) -> float:
    """Seconds since process ``pid`` started (``/proc``: its ``starttime`` against the uptime)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    started = int(stat[stat.rindex(")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
    return float(Path("/proc/uptime").read_text().split()[0]) - started


def wait_quiet(pids: list[int], limit: float = 60.0) -> float:
    """Wait until no ``lethe-sweeper`` thread of ``pids`` used :data:`QUIET_CPU_S` in a second.

    A process audits its store (and may write index snapshots) in its first
    seconds, then every minute or more (``server.lifecycle._sweeper``): about
    half a second of CPU at 20k turns. A run that began right after a start
    would charge that to its searches, where a serving process spreads it over
    a minute; the runs measure after it.

    Returns:
        Seconds waited (at most ``limit``).
    """
    t0 = time.perf_counter()
    youngest = min(process_age(pid) for pid in pids)
    time.sleep(max(0.0, FIRST_PASS_S - youngest))

    def sweeper() -> float:
        return sum(cpu_by_thread(pid).get("lethe-sweeper", 0.0) for pid in pids)

    before = sweeper()
    while time.perf_counter() - t0 < limit:
        time.sleep(1.0)
        now = sweeper()
        if now - before < QUIET_CPU_S:
            break
        before = now
    return time.perf_counter() - t0


class _Child:
    """A child process whose first line containing ``ready`` says it serves."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def _spawn(self, argv: list[str], env: dict[str, str], ready: str) -> float:
        """Start ``argv`` and wait for ``ready`` in its output.

        Returns:
            Seconds from the spawn to the ready line.

        Raises:
            RuntimeError: The process exited, or did not become ready in 300 s.
        """
        with self.log.open("ab") as out:
            out.write(f"--- {' '.join(argv)}\n".encode())
            out.flush()
            start_at = out.tell()
            t0 = time.perf_counter()
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        while True:
            with self.log.open("rb") as f:
                f.seek(start_at)
                if ready.encode() in f.read():
                    return time.perf_counter() - t0
            if self.proc.poll() is not None or time.perf_counter() - t0 > _START_TIMEOUT_S:
                tail = self.log.read_bytes()[start_at:][-4000:].decode(errors="replace")
                self.stop()
                raise RuntimeError(f"{argv[2]} did not start:\n{tail}")
            time.sleep(0.005)

    @property
    def pid(self) -> int:
        """Process id of the running child."""
        assert self.proc is not None
        return self.proc.pid

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT`` of the running child."""
        return f"127.0.0.1:{self.port}"

    def memory(self) -> dict[str, int]:
        """:func:`memory_of` the running child."""
        return memory_of(self.pid)

    def reset_peak(self) -> None:
        """Reset the child's ``VmHWM`` to its current resident set (``clear_refs`` 5).

        Silently does nothing where the kernel refuses it.
        """
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def stop(self, timeout: float = 60.0) -> None:
        """Terminate the child (SIGTERM) and wait up to ``timeout`` seconds, then kill it."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class LetheProcess(_Child):
    """``lethe serve`` on a throwaway data directory, restartable on the same data.

    Args:
        serve_args: Extra ``lethe serve`` flags (``--embedder none`` is always given).
    """

    def __init__(self, serve_args: list[str]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lethe-bench-scale-"))
        super().__init__(self.root / "server.log")
        self.data = self.root / "data"
        self.serve_args = ["--embedder", "none", "--metrics-listen", "off", *serve_args]
        self.env = {**os.environ, "LETHE_KEK": KekRing.generate_env_value()}
        self.token = ""

    def settle(self, owner: str, limit: float = 600.0) -> float:
        """Wait for the steady state after writes: ``owner``'s snapshot written, the sweeper quiet.

        The sweeper writes an owner's index snapshot once its writes have
        settled (``server.lifecycle.SNAPSHOT_SETTLE``, 10 s), then an audit may
        follow; a benchmark of searches right after an ingest measured that
        catch-up too, which a serving process does once after writes, not
        per search. Needs the owner's index loaded (one search).

        Returns:
            Seconds waited.

        Raises:
            TimeoutError: no snapshot within ``limit`` seconds.
        """
        t0 = time.perf_counter()
        snapshot = self.data / "index" / f"{owner}.snapshot"
        while not snapshot.exists():
            if time.perf_counter() - t0 > limit:
                raise TimeoutError(f"no index snapshot of {owner} after {limit:.0f} s")
            time.sleep(0.2)
        wait_quiet([self.pid], limit)
        return time.perf_counter() - t0

    def start(self) -> float:
        """Start the server on a new free port; create the admin token the first time.

        Returns:
            Seconds from the spawn until the server printed that it serves.

        Raises:
            RuntimeError: The server did not start.
        """
        self.port = free_port()
        argv = [sys.executable, "-m", "server.cli", "serve", "--data", str(self.data)]
        argv += ["--listen", self.address, *self.serve_args]
        seconds = self._spawn(argv, self.env, "serving")
        if not self.token:
            self.token = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "server.cli",
                    "token",
                    "create",
                    "--data",
                    str(self.data),
                    "--admin",
                ],
                env=self.env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        return seconds

    def restart(self) -> float:
        """Stop and start again on the same data.

        Returns:
            Seconds from the new spawn until it serves (the stop is not counted).
        """
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and delete its data directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class MinimalProcess(_Child):
    """``bench/minimal_server.py`` serving the ``.npy`` files of ``vector_dir``.

    Args:
        vector_dir: Directory of ``{owner}.npy`` files.
        factory: FAISS ``index_factory`` string.
        params: FAISS ``ParameterSpace`` string, or ``""``.
    """

    def __init__(self, vector_dir: Path, factory: str, params: str) -> None:
        super().__init__(vector_dir / "minimal.log")
        self.vector_dir = vector_dir
        self.factory = factory
        self.params = params

    def start(self) -> float:
        """Start on a new free port.

        Returns:
            Seconds until it serves.
        """
        self.port = free_port()
        argv = [sys.executable, str(BENCH / "minimal_server.py"), "--vectors", str(self.vector_dir)]
        argv += ["--listen", self.address, "--factory", self.factory, "--params", self.params]
        return self._spawn(argv, dict(os.environ), "serving")


@dataclass
class CallBatch:
    """What one client process calls, in a closed loop, for ``seconds``.

    Attributes:
        address: ``HOST:PORT``.
        method: ``"search"`` (``lethe.v1.Retrieval/Search``, DENSE, top 10) or
            ``"list_threads"`` (``lethe.v1.Threads/ListThreads``, the empty call).
        parent: ``owners/{o}``.
        queries: Query vectors as lists of floats (cycled), or empty for ``list_threads``.
        token: Bearer token, or ``""`` to send no metadata.
        seconds: Length of the loop, in seconds.
    """

    address: str
    method: str
    parent: str
    queries: list[list[float]]
    token: str
    seconds: float


@dataclass
class RunResult:
    """Latencies and wall span of one client's loop.

    Attributes:
        latencies: Seconds per call.
        start: ``time.monotonic()`` when the loop began (comparable across processes).
        end: ``time.monotonic()`` when it ended.
    """

    latencies: list[float]
    start: float
    end: float


def _worker(tasks: Any, results: Any) -> None:  # pragma: no cover - runs in a child
    """Client process body: say it is ready, then run each ``(CallBatch, start_at)``."""
    channels: dict[str, grpc.Channel] = {}
    results.put("ready")
    while True:
        item = tasks.get()
        if item is None:
            break
        batch, start_at = item
        try:
            results.put(_run_batch(batch, start_at, channels))
        except Exception as e:
            results.put(RuntimeError(f"client failed: {e!r}"))
    for ch in channels.values():
        ch.close()


def _run_batch(batch: CallBatch, start_at: float, channels: dict[str, grpc.Channel]) -> RunResult:
    channel = channels.get(batch.address)
    if channel is None:
        channel = channels[batch.address] = grpc.insecure_channel(batch.address)
    md = (("authorization", f"Bearer {batch.token}"),) if batch.token else None
    call: Any
    if batch.method == "search":
        call = retrieval_pb2_grpc.RetrievalStub(channel).Search
        requests: list[Any] = [
            retrieval_pb2.SearchRequest(
                parent=batch.parent,
                query_embedding=q,
                top_k=10,
                mode=retrieval_pb2.SearchRequest.DENSE,
            )
            for q in batch.queries
        ]
    else:
        call = threads_pb2_grpc.ThreadsStub(channel).ListThreads
        requests = [threads_pb2.ListThreadsRequest(parent=batch.parent)]
    call(requests[0], metadata=md)  # connects the channel; not counted
    while time.monotonic() < start_at:
        time.sleep(0.001)
    latencies: list[float] = []
    start = time.monotonic()
    deadline = start + batch.seconds
    i = 0
    now = start
    while now < deadline:
        t0 = time.perf_counter()
        call(requests[i % len(requests)], metadata=md)
        latencies.append(time.perf_counter() - t0)
        i += 1
        now = time.monotonic()
    return RunResult(latencies, start, now)


class ClientPool:
    """``size`` client processes, started once and reused for every run.

    Args:
        size: Number of processes (the highest concurrency wanted).
    """

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self._results: Any = ctx.Queue()
        self._tasks: list[Any] = [ctx.Queue() for _ in range(size)]
        self._procs: list[BaseProcess] = []
        for q in self._tasks:
            p = ctx.Process(target=_worker, args=(q, self._results), daemon=True)
            p.start()
            self._procs.append(p)
        for _ in self._procs:  # imports done: the pool no longer competes for the CPU
            if self._results.get(timeout=120) != "ready":
                raise RuntimeError("a client process failed to start")

    @property
    def pids(self) -> list[int]:
        """The client processes' ids, in the order :meth:`run` uses them."""
        return [p.pid for p in self._procs if p.pid is not None]

    def run(self, batch: CallBatch, concurrency: int) -> list[RunResult]:
        """Run ``batch`` in ``concurrency`` processes at once (started together).

        Args:
            batch: What each process calls.
            concurrency: How many processes, ``<= size``.

        Returns:
            One result per process.

        Raises:
            RuntimeError: A client failed, or did not answer in time.
        """
        start_at = time.monotonic() + 0.1
        for q in self._tasks[:concurrency]:
            q.put((batch, start_at))
        out: list[RunResult] = []
        for _ in range(concurrency):
            try:
                r = self._results.get(timeout=batch.seconds + 120)
            except queue.Empty:
                raise RuntimeError("a client process did not answer") from None
            if isinstance(r, Exception):
                raise r
            out.append(r)
        return out

    def close(self) -> None:
        """Stop every client process."""
        for q in self._tasks:
            q.put(None)
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
