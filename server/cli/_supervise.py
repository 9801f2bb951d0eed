"""``lethe serve --processes N``: a supervisor and N serving processes over one data directory.

One Python process tops out at about 500-700 searches a second whatever the
core count (the interpreter lock); N processes answer on every core. The
``lethe serve`` process the operator started becomes the supervisor: it opens
no store and serves no call. It

1. reserves the ports: a socket bound to the gRPC address (and the HTTP one,
   with ``--http-listen``) with ``SO_REUSEPORT``, never listening, held for the
   group's life, so port 0 becomes one port shared by the group, and a plain
   ``lethe serve`` (``SO_REUSEPORT`` off) on it still fails loudly;
2. starts the first *member* (``lethe serve --member``, the same command line
   with the address fixed): it takes the data directory's lock shared and the
   primary role (:func:`server.store._store.acquire_primary`), runs start-up
   recovery and then serves; only once it is ready are the other N-1 members
   started (they take the lock shared and neither recover nor sweep). Each
   member binds the shared ports with ``SO_REUSEPORT``: the kernel spreads new
   connections over them; a connection stays with its member;
3. waits. When a member ends without being asked, every other member is
   stopped (SIGTERM, drained) and the group is started again from step 2: a
   new primary recovers what the dead one left half done (a deletion, keys
   made for a write that never committed) before any member serves, exactly as
   one process does after a crash. More than :data:`MAX_RESTARTS` restarts
   within :data:`RESTART_WINDOW` seconds end the supervisor;
4. on SIGTTIN starts one more member beside the running ones (as gunicorn
   does): it takes the lock shared, neither recovers nor sweeps, prints its
   ready line and takes its share of new connections, loading each owner it
   is asked for from the owner's index snapshot (a 100k-turn owner answered
   its first search there 2.3-3.5 s after the signal, ``bench_processes``'s
   join figure); on SIGTTOU stops the newest member but never the primary (it
   drains). A group restart starts as many members as were running;
5. on SIGTERM or SIGINT forwards SIGTERM to every member (each drains for
   ``--drain-grace``) and exits once they have.

Members get SIGTERM if the supervisor dies (``PR_SET_PDEATHSIG``). Each member
serves its own ``/metrics`` on the ``--metrics-listen`` port plus its index
(0 for the first; port 0 stays "any free port").

A member that ends without being asked still restarts the whole group, even
one that is not the primary: what it left half done (a deletion, keys made
for a write that never committed, keys a seal was moving) is finished or
undone only by start-up recovery, which must not run while another process
may be in the middle of the same kind of work.

Thread rules: the supervisor is one thread; signals only set a flag or count.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

from server.cli._common import EXIT_FAILED, EXIT_OK, emit

MAX_RESTARTS = 5
"""Group restarts allowed within :data:`RESTART_WINDOW` seconds before the supervisor gives up."""
RESTART_WINDOW = 60.0
READY_TIMEOUT = 600.0
"""Seconds a member may take from its start to its ready line (recovery included)."""
JOIN_TIMEOUT = 120.0
"""Seconds a member started beside running ones (SIGTTIN) may take to its ready line."""
_RESIZE = {signal.SIGTTIN, signal.SIGTTOU}
_PR_SET_PDEATHSIG = 1


def reserve_port(listen: str) -> tuple[socket.socket, str]:
    """Bind ``listen`` with ``SO_REUSEPORT`` without listening: the group's port.

    Returns:
        The socket (keep it open while the group runs) and ``HOST:PORT`` with
        the port it got (``listen``'s own unless that was 0).

    Raises:
        OSError: the address cannot be bound (the message names it).
    """
    host, _, port = listen.rpartition(":")
    bare = host.strip("[]")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            bare, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
        except BaseException:
            sock.close()
            raise
    except OSError as exc:
        raise OSError(f"cannot listen on {listen} ({exc.strerror or exc})") from None
    return sock, f"{host}:{sock.getsockname()[1]}"


def _child_setup() -> None:  # pragma: no cover - runs in the child before exec
    """SIGTERM when the supervisor dies; SIGTTIN, SIGTTOU unblocked (the supervisor blocks them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _RESIZE)


class Member:
    """One serving process of the group, started with ``lethe serve --member``."""

    def __init__(self, argv: Sequence[str], index: int) -> None:
        self.index = index
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server.cli", *argv],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=_child_setup,
        )
        self.ready: dict[str, Any] = {}

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        """The member's ready line (``{"port", "http_port", "primary", "pid"}``).

        Raises:
            RuntimeError: it ended, or printed no ready line in time.
        """
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise RuntimeError(f"member {self.index} printed no ready line in {timeout:.0f} s")
            line = out.readline()
            if not line:
                raise RuntimeError(f"member {self.index} ended before serving")
            try:
                self.ready = json.loads(line)
                return self.ready
            except json.JSONDecodeError:
                continue

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def stop(self) -> None:
        """Send SIGTERM (the drain) if it is running."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def reap(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the process to end; SIGKILL past it."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code


def _member_argv(
    words: Sequence[str],
    listen: str,
    http: str | None,
    metrics: str | None,
    index: int,
    *,
    standby: bool = False,
) -> list[str]:
    """The command line of member ``index``: the operator's, with the addresses fixed.

    ``standby``: a member joining a running group, which never takes the primary role.
    """
    argv = [*words, "--listen", listen, "--processes", "1", "--member"]
    if standby:
        argv.append("--standby")
    if http is not None:
        argv += ["--http-listen", http]
    if metrics is None:
        argv += ["--metrics-listen", "off"]
    else:
        host, _, port = metrics.rpartition(":")
        argv += ["--metrics-listen", f"{host}:{int(port) + index if int(port) else 0}"]
    return argv


def supervise(args: argparse.Namespace, kek_line: Callable[[Path | None, Path], str]) -> int:
    """Run the group until SIGTERM or SIGINT (module docstring); the exit status.

    Args:
        args: ``lethe serve``'s arguments (``argv``: its command line as given).
        kek_line: the KEK line ``lethe serve`` prints (from the KEK path and
            the data directory).

    Returns:
        :data:`EXIT_OK` after a graceful stop; :data:`EXIT_FAILED` when the
        group could not be started or kept running.
    """
    words = list(args.argv)
    stopping = False
    members: list[Member] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        del frame
        print(f"lethe: signal {signum}, stopping {len(members)} processes", file=sys.stderr)
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # SIGTTIN and SIGTTOU are blocked and taken one at a time by the loop
    # (sigtimedwait), never by a handler: blocked, SIGTTOU is not raised by the
    # supervisor's own writes to a terminal it runs in the background of
    # (``stty tostop``), which a handler would take for a request to stop a
    # member. Members unblock them (``_child_setup``).
    signal.pthread_sigmask(signal.SIG_BLOCK, _RESIZE)
    size = args.processes
    held, listen = reserve_port(args.listen)
    http_held = None
    http = None if args.http_listen == "off" else args.http_listen
    if http is not None:
        http_held, http = reserve_port(http)
    metrics = None if args.metrics_listen == "off" else args.metrics_listen
    restarts: list[float] = []
    grace = float(args.drain_grace) + 30.0

    def stop_all() -> None:
        for member in members:
            member.stop()
        for member in members:
            member.reap(grace)
        members.clear()

    def start_all() -> bool:
        for index in range(size):
            member = Member(_member_argv(words, listen, http, metrics, index), index)
            members.append(member)
            try:
                ready = member.wait_ready()
            except RuntimeError as exc:
                print(f"lethe: {exc}", file=sys.stderr)
                return False
            if index == 0 and not ready.get("primary"):
                print(
                    f"lethe: another process holds the primary role of {Path(args.data).resolve()}",
                    file=sys.stderr,
                )
                return False
            if stopping:
                return False
        return True

    try:
        if not start_all():
            stop_all()
            return EXIT_OK if stopping else EXIT_FAILED
        _announce(args, listen, http, members, kek_line)
        while not stopping:
            asked = signal.sigtimedwait(_RESIZE, 0.2)
            dead = [m for m in members if not m.alive()]
            if not dead and asked is not None and not stopping:  # a death comes first
                if asked.si_signo == signal.SIGTTIN:
                    size = _join(members, words, listen, http, metrics)
                else:
                    size, ended = _leave(members, grace)
                    dead = [ended] if ended is not None else []
            if not dead or stopping:
                continue
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < RESTART_WINDOW] + [now]
            codes = ", ".join(
                f"member {m.index} (pid {m.proc.pid}): {m.proc.returncode}" for m in dead
            )
            print(f"lethe: {codes} ended; restarting the group", file=sys.stderr, flush=True)
            stop_all()
            if len(restarts) > MAX_RESTARTS:
                print("lethe: too many restarts; giving up", file=sys.stderr)
                return EXIT_FAILED
            if not start_all():
                stop_all()
                return EXIT_OK if stopping else EXIT_FAILED
            print(f"lethe: the group serves again ({size} processes)", file=sys.stderr)
        stop_all()
        return EXIT_OK
    finally:
        stop_all()
        held.close()
        if http_held is not None:
            http_held.close()


def _join(
    members: list[Member], words: Sequence[str], listen: str, http: str | None, metrics: str | None
) -> int:
    """Start one more member beside the running ones (SIGTTIN); the group's size after.

    The member is started ``--standby``: it never takes the primary role, even
    if the primary died meanwhile (start-up recovery must not run beside
    serving processes; the loop restarts the group for that). Waits up to
    :data:`JOIN_TIMEOUT` for its ready line; one that fails to start, or
    reports the primary role, is stopped and left out (the others serve on).
    """
    index = len(members)
    member = Member(_member_argv(words, listen, http, metrics, index, standby=True), index)
    try:
        ready = member.wait_ready(JOIN_TIMEOUT)
        if ready.get("primary"):
            raise RuntimeError(f"member {index} took the primary role")
    except RuntimeError as exc:
        print(f"lethe: {exc}; the group serves on without it", file=sys.stderr, flush=True)
        member.stop()
        member.reap(30.0)
        return len(members)
    members.append(member)
    print(
        f"lethe: member {index} (pid {member.proc.pid}) joined; {len(members)} processes serve: "
        f"{', '.join(str(m.proc.pid) for m in members)}",
        file=sys.stderr,
        flush=True,
    )
    return len(members)


def _leave(members: list[Member], grace: float) -> tuple[int, Member | None]:
    """Stop the newest member (SIGTTOU), never the primary.

    Returns:
        The group's size after, and the member if it did not end cleanly (it
        was no longer running, failed its drain or had to be killed past
        ``grace``): what it left half done needs start-up recovery, so the
        caller restarts the group as for any member that ended unasked.
    """
    if len(members) < 2:
        print("lethe: SIGTTOU: the primary is not stopped alone", file=sys.stderr, flush=True)
        return len(members), None
    member = members[-1]
    if not member.alive():
        return len(members), member
    member.stop()
    code = member.reap(grace)
    members.pop()
    if code != EXIT_OK:
        return len(members), member
    print(
        f"lethe: member {member.index} (pid {member.proc.pid}) stopped; "
        f"{len(members)} processes serve",
        file=sys.stderr,
        flush=True,
    )
    return len(members), None


def _announce(
    args: argparse.Namespace,
    listen: str,
    http: str | None,
    members: Sequence[Member],
    kek_line: Callable[[Path | None, Path], str],
) -> None:
    """Print the ready line(s) ``lethe serve`` prints, once every member serves."""
    port = int(listen.rpartition(":")[2])
    kek = members[0].ready.get("kek")
    pids = [m.proc.pid for m in members]
    if args.json:
        emit(
            {
                "listen": listen,
                "port": port,
                "http_listen": http,
                "metrics_listen": members[0].ready.get("metrics_listen"),
                "metrics_listens": [m.ready.get("metrics_listen") for m in members],
                "data": str(Path(args.data).resolve()),
                "kek": kek,
                "processes": len(members),
                "pids": pids,
            }
        )
        return
    print(
        f"lethe serving {Path(args.data).resolve()} on {listen} ({len(members)} processes: "
        f"{', '.join(map(str, pids))})",
        flush=True,
    )
    print(kek_line(Path(kek) if kek else None, args.data), flush=True)
    if http is not None:
        print(f"lethe serving Connect (HTTP) on {http}", flush=True)
