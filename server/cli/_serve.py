"""``lethe serve``: its flags and the process that serves the gRPC API.

The server itself (:class:`server.LetheServer`, FAISS, the embedder) is
imported when the command runs, never when the parser is built.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from lethe._units import parse_duration, parse_message_size, parse_size
from lethe.names import OWNER_HEADER
from server.cli._common import (
    EXIT_OK,
    EXIT_USAGE,
    Subcommands,
    address,
    command,
    emit,
    positive_int,
)

GC_THRESHOLDS = (20_000, 50, 100)
"""``gc.set_threshold`` of a serving process (CPython's default is 700, 10, 10).
An index build or a 1,000-turn append allocates millions of short-lived,
acyclic objects (freed by reference counting) beside millions of long-lived
ones in the indexes; at the default thresholds the collector ran ~600 times
and took 12% of a 20k-turn build's CPU (0.65 of 5.2 s), at these 17 times and
0.1 s. Cyclic garbage waits longer to be found; nothing else changes."""


SWITCH_INTERVAL_MS = 1.0
"""``sys.setswitchinterval`` of a serving process, in ms (CPython's default is 5).

A thread that wants the interpreter lock while another runs Python waits up
to one interval before the holder is asked to let go, and a call takes the
lock several times (the event loop, a worker, FAISS's return, the reply).
With another owner's four 4 MiB appends running (``bench/bench_overload.py
--phases flood,appends``, two or three runs each, interleaved), B's
``Search`` p99 was 21-34 ms at 1 ms, 35-38 ms at 2 ms and 56-67 ms at 5 ms;
the flood's ratio to the floor and the flooding principal's throughput did
not move beyond the runs' noise, and 16 clients' searches of one 5k owner
(``bench/bench_processes.py --processes 1 --records 5000``, four runs
interleaved) got 454-488 a second at 1 ms against 441-468 at 5 ms.
``--gil-switch-interval`` sets it."""


def _switch_interval(text: str) -> float:
    """A switch interval in ms, in ``[0.1, 100]``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of ms: {text!r}") from None
    if not 0.1 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"must be between 0.1 and 100 ms, got {text}")
    return value


def freeze_heap() -> int:
    """Move every object alive now into the collector's permanent generation.

    Called once a serving process has started (modules, the embedder, the
    store's and the server's objects): the cyclic collector's full passes,
    which hold the interpreter lock and so pause every call, then walk only
    what was allocated since (``gc.freeze``, as CPython's docs advise for
    long-lived processes). On ``bench/bench_overload.py --phases appends`` a
    full pass during four 4 MiB appends took 48 ms without it and 10 ms with
    it. Frozen objects are never collected, so a cycle among them that dies
    later stays: nothing of the start-up is dropped while serving.

    Returns:
        The number of objects frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _address_or_off(value: str) -> str:
    return value if value == "off" else address(value)


def _reserve_size(value: str) -> int:
    """``0`` (no disk reserve) or a size of at least 1 MiB (``16MiB``)."""
    return 0 if value.strip() == "0" else parse_size(value)


def _origins(value: list[str] | str) -> tuple[str, ...]:
    """The ``--http-allow-origin`` values (comma-separated from the environment or a file)."""
    values = value.split(",") if isinstance(value, str) else value
    return tuple(v.strip() for v in values if v.strip())


def _embedder(value: str) -> str:
    """``wordllama``, ``none`` or ``onnx:DIR`` with DIR an existing directory."""
    if value in ("wordllama", "none"):
        return value
    directory = value[len("onnx:") :] if value.startswith("onnx:") else ""
    if not directory:
        raise argparse.ArgumentTypeError(f"expected wordllama, none or onnx:DIR, got {value!r}")
    if not Path(directory).is_dir():
        raise argparse.ArgumentTypeError(f"onnx:{directory}: no such directory")
    return value


def add(sub: Subcommands) -> None:
    """Add ``lethe serve`` and its flags to ``sub``."""
    serve = command(
        sub,
        "serve",
        "serve the gRPC API",
        json_help="where it serves, once listening "
        "({listen, port, http_listen, metrics_listen, data, kek})",
    )
    serve.set_defaults(run=run)
    serve.add_argument(
        "--listen", type=address, default="127.0.0.1:50051", help="HOST:PORT for gRPC"
    )
    serve.add_argument(
        "--http-listen",
        type=_address_or_off,
        default="off",
        help="HOST:PORT for the same API over the Connect protocol (HTTP/1.1 and HTTP/2, "
        "JSON or binary: curl, browsers, the TypeScript client), or 'off'; TLS as --tls-*",
    )
    serve.add_argument(
        "--http-allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="an origin (https://app.example) whose browser pages may call the Connect listener "
        "(CORS; repeat, or comma-separated in LETHE_HTTP_ALLOW_ORIGIN; '*' for any; default: "
        "none, same-origin only)",
    )
    serve.add_argument(
        "--metrics-listen",
        type=_address_or_off,
        default="127.0.0.1:9464",
        help="HOST:PORT for /metrics, or 'off' (with --processes, process i serves PORT+i)",
    )
    serve.add_argument(
        "--embedder",
        type=_embedder,
        default="wordllama",
        help="wordllama (in its wheel), none (clients send vectors; otherwise lexical search "
        "only) or onnx:DIR (a sentence encoder's model.onnx and tokenizer.json in DIR; the "
        "onnx extra). A change re-embeds each owner's vectors on its first use",
    )
    serve.add_argument(
        "--pending-ttl",
        type=parse_duration,
        default="72h",
        help="a PENDING turn or memory expires this long after it was written",
    )
    serve.add_argument(
        "--echo-guard-window",
        type=_window,
        default=None,
        help="after a forget, refuse or taint for this long a write that echoes what it "
        "forgot (a forget's echo_guard overrides it; 0: no guard); default: --pending-ttl",
    )
    serve.add_argument(
        "--sweep-interval",
        type=parse_duration,
        default="5s",
        help="run the sweeper (expiry, audits, rotation when due) this often",
    )
    serve.add_argument(
        "--rotation-interval",
        type=parse_duration,
        default="1h",
        help="complete shreds cryptographically this often",
    )
    serve.add_argument(
        "--index-cache-size",
        type=parse_size,
        default="4GiB",
        help="bytes of in-memory search indexes kept (estimated); past it the least recently "
        "searched owners' indexes are dropped and rebuilt from the store on their next search",
    )
    serve.add_argument(
        "--max-store-size",
        type=parse_size,
        default="64GiB",
        help="the data the store may hold; past it a write that adds data is refused whole "
        "with STORE_FULL while forgetting goes on, on a reserve (units B, KiB, MiB, GiB, TiB)",
    )
    serve.add_argument(
        "--disk-reserve",
        type=_reserve_size,
        default="16MiB",
        help="a ballast file of this size in the data directory that a forget may free when "
        "the filesystem is full, allocated again when there is room (0: none)",
    )
    serve.add_argument(
        "--tracing",
        choices=["off", "otlp"],
        default="off",
        help="an OpenTelemetry span per RPC (no content, no token, no name but the owner), "
        "sent to the OTLP collector of OTEL_EXPORTER_OTLP_ENDPOINT; needs "
        "lethe-store[tracing]",
    )
    serve.add_argument(
        "--tagger",
        choices=["rules", "none"],
        default="rules",
        help="propose candidate memories for untagged turns",
    )
    bounds = serve.add_argument_group(
        "concurrency", "past a bound a call is refused at once with RESOURCE_EXHAUSTED"
    )
    bounds.add_argument(
        "--workers", type=positive_int, default=16, help="threads for blocking work"
    )
    bounds.add_argument(
        "--max-running",
        type=positive_int,
        default=2,
        help="of the calls on those threads, how many run at once, all tokens (a call waiting "
        "for a commit or an index build lends its place): more threads running Python at "
        "once share one interpreter lock and only add switching",
    )
    bounds.add_argument(
        "--max-inflight", type=positive_int, default=1024, help="unary calls at once, in all"
    )
    bounds.add_argument(
        "--max-inflight-per-principal",
        type=positive_int,
        default=256,
        help="unary calls at once per token",
    )
    bounds.add_argument(
        "--max-running-per-principal",
        type=positive_int,
        default=4,
        help="of those, calls of one token running at once while it is the only token with "
        "work (while several have work, each runs one at a time)",
    )
    bounds.add_argument(
        "--gil-switch-interval",
        type=_switch_interval,
        default=SWITCH_INTERVAL_MS,
        metavar="MS",
        help="how long a thread may hold the interpreter lock while another waits for it "
        f"(default {SWITCH_INTERVAL_MS:g} ms; CPython's is 5): shorter lets other owners' "
        "calls through sooner beside long ones",
    )
    bounds.add_argument(
        "--max-streams", type=positive_int, default=1024, help="open Watch streams, in all"
    )
    bounds.add_argument(
        "--max-streams-per-principal",
        type=positive_int,
        default=128,
        help="open Watch streams per token",
    )
    transport = serve.add_argument_group("transport")
    transport.add_argument(
        "--tls-cert", type=Path, default=None, help="PEM certificate chain (default: plaintext)"
    )
    transport.add_argument(
        "--tls-key", type=Path, default=None, help="PEM private key (default: plaintext)"
    )
    transport.add_argument(
        "--client-ca",
        type=Path,
        default=None,
        help="PEM CAs of client certificates: clients must present one (mutual TLS; "
        "default: no client certificates asked)",
    )
    transport.add_argument(
        "--max-receive-message-size",
        type=parse_message_size,
        default="16MiB",
        help="largest request message accepted",
    )
    transport.add_argument(
        "--max-send-message-size",
        type=parse_message_size,
        default="16MiB",
        help="largest response message sent",
    )
    transport.add_argument(
        "--keepalive-min-interval",
        type=parse_duration,
        default="10s",
        help="accept client keepalive pings this far apart or more",
    )
    transport.add_argument(
        "--keepalive-time",
        type=parse_duration,
        default="60s",
        help="ping an idle connection this often",
    )
    transport.add_argument(
        "--keepalive-timeout",
        type=parse_duration,
        default="20s",
        help="drop a connection whose ping is unanswered this long",
    )
    transport.add_argument(
        "--drain-grace",
        type=parse_duration,
        default="30s",
        help="on SIGTERM, time given to calls in flight",
    )
    serve.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        help="serving processes over the one data directory and port (a supervisor "
        "starts them, restarts the group when one ends, forwards SIGTERM); --workers "
        "and the --max-* bounds apply per process",
    )
    serve.add_argument("--member", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument("--standby", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument(
        "--require-owner-header",
        action="store_true",
        help=f"refuse calls without {OWNER_HEADER} metadata (OWNER_HEADER_MISSING): "
        "for shards behind a proxy that routes on it",
    )


def kek_line(path: Path | None, data: Path) -> str:
    """The second line ``lethe serve`` prints: where the store's KEK is."""
    if path is None:
        return "lethe KEK in memory (LETHE_KEK): never rotated, never written anywhere"
    return (
        f"lethe KEK {path} (outside {data}: removing the data directory leaves it behind; "
        "never back it up with the keystore)"
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT, then drain for ``--drain-grace``.

    Prints ``lethe serving DIR on HOST:PORT``, the KEK line and, with
    ``--http-listen``, ``lethe serving Connect (HTTP) on HOST:PORT`` (or, with
    ``--json``, one document) once listening.

    Returns:
        :data:`EXIT_OK` after a graceful stop; :data:`EXIT_USAGE` for a bad
        TLS or bounds setting.
    """
    if args.processes > 1 and not args.member:
        from server.cli._supervise import supervise

        return supervise(args, kek_line)

    from index import fix_mmap_threshold
    from server._app import LetheServer, ServerConfig

    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(args.gil_switch_interval / 1000.0)
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # the operator's own glibc setting wins
        fix_mmap_threshold()  # large arrays freed go back to the OS (index.fix_mmap_threshold)

    config = ServerConfig(
        data_dir=args.data,
        listen=args.listen,
        http_listen=None if args.http_listen == "off" else args.http_listen,
        http_allow_origins=_origins(args.http_allow_origin),
        metrics_listen=None if args.metrics_listen == "off" else args.metrics_listen,
        kek_file=args.kek_file,
        embedder=args.embedder,
        pending_ttl=args.pending_ttl,
        echo_guard_window=args.echo_guard_window,
        sweep_interval=args.sweep_interval,
        tagger=args.tagger,
        rotation_interval=args.rotation_interval,
        max_workers=args.workers,
        max_running=args.max_running,
        max_inflight=args.max_inflight,
        max_inflight_per_principal=args.max_inflight_per_principal,
        max_running_per_principal=args.max_running_per_principal,
        max_streams=args.max_streams,
        max_streams_per_principal=args.max_streams_per_principal,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        client_ca=args.client_ca,
        max_receive_message_bytes=args.max_receive_message_size,
        max_send_message_bytes=args.max_send_message_size,
        keepalive_min_interval=args.keepalive_min_interval,
        keepalive_time=args.keepalive_time,
        keepalive_timeout=args.keepalive_timeout,
        max_store_size=args.max_store_size,
        disk_reserve=args.disk_reserve,
        index_cache_size=args.index_cache_size,
        require_owner_header=args.require_owner_header,
        tracing=args.tracing,
        member=args.member,
        standby=args.standby,
    )
    try:
        config.limits()
        config.server_credentials()
    except ValueError as exc:
        print(f"lethe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    server = LetheServer(config)
    try:
        port = server.start()
    except BaseException:
        server.stop(grace=0)
        raise
    # Before the ready line: a supervisor may send SIGTERM the moment it reads it.
    stopped = threading.Event()
    freeze_heap()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        print(f"lethe: signal {signum}, shutting down", file=sys.stderr, flush=True)
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Only a supervisor adds or stops processes. Their default action would
    # suspend this one; ignored (not handled: a handler that wrote a line would
    # raise SIGTTOU again on a terminal with ``tostop``), a write proceeds.
    signal.signal(signal.SIGTTIN, signal.SIG_IGN)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    host = args.listen.rpartition(":")[0]
    http = None
    if config.http_listen is not None:
        http = f"{config.http_listen.rpartition(':')[0]}:{server.http_port}"
    kek = server.store.kek.path
    if args.member:  # the supervisor's ready line (server.cli._supervise)
        ready: dict[str, object] = {"port": port, "http_port": server.http_port}
        ready |= {"primary": server.store.primary, "pid": os.getpid()}
        ready["metrics_listen"] = server.metrics_listen
        ready["kek"] = str(kek) if kek is not None else None
        print(json.dumps(ready), flush=True)
    elif args.json:
        emit(
            {
                "listen": f"{host}:{port}",
                "port": port,
                "http_listen": http,
                "metrics_listen": server.metrics_listen,
                "data": str(args.data.resolve()),
                "kek": str(kek) if kek is not None else None,
            }
        )
    else:
        print(f"lethe serving {args.data.resolve()} on {host}:{port}", flush=True)
        print(kek_line(kek, args.data), flush=True)
        if http is not None:
            print(f"lethe serving Connect (HTTP) on {http}", flush=True)
    stopped.wait()
    # A shutdown that outlives the drain by SHUTDOWN_SLACK seconds is hung (grpc aio's
    # Server.stop has been seen to wait forever holding the interpreter lock):
    # faulthandler's own thread prints every stack and exits, so a supervisor's
    # SIGTERM still ends the process. Nothing is lost: every write is committed.
    faulthandler.dump_traceback_later(args.drain_grace + SHUTDOWN_SLACK, exit=True)
    server.stop(grace=args.drain_grace)
    faulthandler.cancel_dump_traceback_later()
    return EXIT_OK


SHUTDOWN_SLACK = 30.0
"""Seconds past ``--drain-grace`` after which ``lethe serve``'s shutdown is taken as hung."""


def _window(text: str) -> float:
    """``--echo-guard-window``: a duration (``72h``, ``30m``), or ``0`` for no guard.

    Raises:
        argparse.ArgumentTypeError: malformed.
    """
    return 0.0 if text.strip() == "0" else parse_duration(text)
