"""Assembling and running one Lethe server.

:class:`LetheServer` opens the store, finishes interrupted deletions, forgets
records whose keys are gone, loads the embedder, and serves the gRPC services
plus ``grpc.health.v1.Health`` and server reflection, with the sweeper and the
metrics endpoint beside them.

The gRPC server is grpc's asyncio server, on an event loop in a thread of its
own (``lethe-loop``); every ``lethe.v1`` call goes through the pipeline of
:mod:`server.edge._edge` (drain, token, bounds, decode, worker, status), blocking
work runs on a :class:`~server.edge._admission.FairExecutor` of ``max_workers``
threads, and writes on the store's one writer thread as before. Health and
reflection are served on the loop without a token.

Transport: plaintext, TLS (``tls_cert`` / ``tls_key``) or mutual TLS (plus
``client_ca``: clients must present a certificate it signed); the bearer
token is required either way. Receive and send limits default to 16 MiB
(API.md, "Views and sizes"). Client keepalive pings are accepted every
``keepalive_min_interval`` seconds or more (also without calls in flight);
faster ones are answered with ``GOAWAY too_many_pings`` after two strikes
(grpc's ``max_ping_strikes``). The server pings an idle connection every
``keepalive_time`` seconds and drops it when no answer comes within
``keepalive_timeout``, so a vanished client does not hold its streams.

With ``http_listen`` the same services are served over the Connect protocol
(HTTP/1.1 and HTTP/2, JSON or binary; :mod:`server.edge._connect`) on a
listener of their own, by Hypercorn on the same event loop: the same edge
(drain, token, route, bounds, workers, the one error boundary), the same
servicer objects, the same message limits, and TLS from the same files
(ALPN ``h2`` and ``http/1.1``; with ``client_ca`` a client certificate is
required there too). Plaintext HTTP/2 is served with prior knowledge (h2c).

Stopping (:meth:`LetheServer.stop`, SIGTERM from the CLI) drains: health turns
``NOT_SERVING`` at once, new calls are refused with ``UNAVAILABLE`` /
``DRAINING`` on both listeners, open ``Watch`` streams end with that error
(clients resume with ``after``), calls in flight finish within the grace
period, then both listeners stop, the index snapshots of loaded owners that
changed are written (so the next start is warm) and the store closes once
every worker has returned.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from index import load_embedder
from lethe.v1 import (
    events_pb2,
    lifecycle_pb2,
    memories_pb2,
    repairs_pb2,
    retrieval_pb2,
    threads_pb2,
)
from server import _steps
from server._metrics import CallMeter, MeasuredServer, Metrics
from server._thread_names import name_os_threads
from server._tracing import TracingInterceptor, tracer_provider
from server.edge import (
    Admission,
    Authenticator,
    ConnectApp,
    Edge,
    EventHub,
    FairExecutor,
    Limits,
    Method,
    Router,
)
from server.errors import LetheError
from server.lifecycle import Lifecycle, Sweeper
from server.retrieval import Retriever, check_embedder
from server.services import (
    EventsService,
    LifecycleService,
    MemoriesService,
    RepairsService,
    RetrievalService,
    ThreadsService,
)
from server.store import DEFAULT_DISK_RESERVE, DEFAULT_MAX_STORE_SIZE, Store

_log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_PENDING_TTL = 72 * 3600.0
DEFAULT_INDEX_CACHE_SIZE = 4 << 30
STOP_SLACK_SECONDS = 5.0
"""How long past its grace the gRPC server's own shutdown may take before the
drain goes on without it (grpc.aio's stop waits for every handler to end, and a
stuck handler once held a test's teardown for over ten minutes)."""
"""Bytes of in-memory indexes kept by default (4 GiB: about 2.5 million 256-d turns)."""


_GRPC_AIO_HELD = threading.Lock()
_grpc_aio_held = False


def _hold_grpc_aio() -> None:
    """Initialise grpc's asyncio stack once per process, from the calling thread, for good.

    grpc asks for ``init_grpc_aio`` before any asyncio object is made ("otherwise,
    the application might deadlock": grpc's AsyncIO API docs) and counts references:
    when the last asyncio object goes, it shuts its completion queue down and joins
    its poller thread with the interpreter lock held, while the poller needs that
    lock to finish (grpc/grpc#22365). A server stopped in a process that goes on —
    the test suite, a restart in place — hung in ``Server.stop`` forever that way,
    and no timeout could fire. Holding one reference for the life of the process
    keeps that shutdown from ever running; the process's exit releases everything.
    """
    global _grpc_aio_held
    with _GRPC_AIO_HELD:
        if not _grpc_aio_held:
            grpc.aio.init_grpc_aio()  # type: ignore[attr-defined]  # not in grpc-stubs
            _grpc_aio_held = True


@dataclass
class ServerConfig:
    """Settings of ``lethe serve`` (API.md, "Command line").

    Attributes:
        listen: ``HOST:PORT``; port 0 picks a free port.
        http_listen: ``HOST:PORT`` of the Connect protocol's listener (HTTP),
            or None for none; port 0 picks a free port.
        http_allow_origins: origins whose browsers may call the HTTP listener
            cross-origin (CORS), ``*`` for any; none by default.
        metrics_listen: ``HOST:PORT`` of ``/metrics``, or None for no listener.
        embedder: ``wordllama``, ``none`` or ``onnx:DIR`` (:func:`index.load_embedder`);
            checked against the one the store recorded at start, and each
            owner's vectors are re-embedded on its first use after a change
            (:mod:`server.retrieval._reembed`).
        pending_ttl: default pending lifetime, seconds.
        echo_guard_window: seconds a forget's echo guard stands when the
            request does not say (None: ``pending_ttl``; 0: no guard).
        sweep_interval: seconds between expiry sweeps; 0 disables the sweeper.
        rotation_interval: seconds between rotations that complete shreds
            cryptographically (0: never; an in-memory ``LETHE_KEK`` is never rotated).
        tagger: ``rules`` (write-time rules propose candidates for untagged
            turns) or ``none``.
        expiry_warning: seconds ahead of a pending record's expiry at which the
            sweeper emits ``PENDING_EXPIRING``.
        audit_interval: seconds between the periodic audits behind the
            ``lethe_orphan_derivatives`` and ``lethe_stale_summaries`` gauges
            (longer on a store whose audit is slow: ``server.lifecycle.AUDIT_DUTY``).
        max_workers: worker threads for the blocking work of unary calls.
        max_running: of the calls on those threads, how many run at once
            (:class:`server.edge._admission.Limits`).
        max_inflight, max_inflight_per_principal: unary calls admitted at
            once, in all and per token (see :mod:`server.edge._admission`).
        max_running_per_principal: calls of one token running at once.
        max_streams, max_streams_per_principal: open ``Watch`` streams, in
            all and per token.
        tls_cert, tls_key: PEM files of the server's certificate chain and
            private key; both or neither (plaintext).
        client_ca: PEM file of the CAs that sign client certificates; when
            set, a client without such a certificate cannot connect (mTLS).
        max_receive_message_bytes, max_send_message_bytes: gRPC message limits.
        keepalive_min_interval: seconds; client pings at least this far apart
            are accepted.
        keepalive_time, keepalive_timeout: seconds between the server's pings
            on an idle connection, and how long it waits for the answer.
        max_store_size: bytes of data the store may hold; past it a write that
            adds data is refused whole (``STORE_FULL``) while deletions go on
            (:mod:`server.store._reserve`).
        disk_reserve: bytes of the ballast file a deletion may free on a full
            filesystem; 0 for none.
        index_cache_size: bytes of in-memory indexes kept (estimates); past it
            the least recently used owners' indexes are dropped and rebuilt from
            the store when next searched.
        require_owner_header: refuse calls without ``x-lethe-owner`` metadata
            (``OWNER_HEADER_MISSING``): set it on shards behind a proxy that
            routes on the header (:mod:`server.edge._routing`).
        tracing: ``off`` or ``otlp``: an OpenTelemetry span per RPC, without
            content, sent to the OTLP collector of the standard variables
            (:mod:`server._tracing`).
        tracer_provider: an OpenTelemetry ``TracerProvider`` to send the spans
            to instead of ``tracing``'s (tests collect them in memory).
        member: serve as one process of a ``lethe serve --processes N`` group
            (:mod:`server.cli._supervise`): the store opened shared (its
            change log followed, the one-process duties only in the primary),
            ``SO_REUSEPORT`` on for the gRPC and HTTP listeners so the group's
            processes share each port.
        standby: with ``member``, never take the primary role (a member the
            supervisor starts beside running ones on SIGTTIN).
    """

    data_dir: Path = Path("./lethe-data")
    listen: str = "127.0.0.1:50051"
    http_listen: str | None = None
    http_allow_origins: tuple[str, ...] = ()
    metrics_listen: str | None = "127.0.0.1:9464"
    kek_file: Path | None = None
    embedder: str = "wordllama"
    pending_ttl: float = DEFAULT_PENDING_TTL
    echo_guard_window: float | None = None
    sweep_interval: float = 5.0
    audit_interval: float = 60.0
    expiry_warning: float = 3600.0
    tagger: str = "rules"
    rotation_interval: float = 3600.0
    max_workers: int = 16
    max_running: int = 2
    max_store_size: int = DEFAULT_MAX_STORE_SIZE
    disk_reserve: int = DEFAULT_DISK_RESERVE
    index_cache_size: int = DEFAULT_INDEX_CACHE_SIZE
    max_inflight: int = 1024
    max_inflight_per_principal: int = 256
    max_running_per_principal: int = 4
    max_streams: int = 1024
    max_streams_per_principal: int = 128
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    max_receive_message_bytes: int = MAX_MESSAGE_BYTES
    max_send_message_bytes: int = MAX_MESSAGE_BYTES
    keepalive_min_interval: float = 10.0
    keepalive_time: float = 60.0
    keepalive_timeout: float = 20.0
    require_owner_header: bool = False
    tracing: str = "off"
    tracer_provider: Any = None
    member: bool = False
    standby: bool = False

    def limits(self) -> Limits:
        """The admission bounds and worker count.

        Raises:
            ValueError: as :class:`server.edge._admission.Limits`.
        """
        return Limits(
            workers=self.max_workers,
            max_running=self.max_running,
            max_inflight=self.max_inflight,
            max_inflight_per_principal=self.max_inflight_per_principal,
            max_running_per_principal=self.max_running_per_principal,
            max_streams=self.max_streams,
            max_streams_per_principal=self.max_streams_per_principal,
        )

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """TLS credentials from the PEM files, or None for plaintext.

        Raises:
            ValueError: only one of ``tls_cert`` / ``tls_key``, or ``client_ca``
                without them.
            OSError: a file cannot be read.
        """
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_cert is None or self.tls_key is None:
            if self.client_ca is not None:
                raise ValueError("--client-ca needs --tls-cert and --tls-key")
            return None
        chain = self.tls_cert.read_bytes()
        key = self.tls_key.read_bytes()
        ca = self.client_ca.read_bytes() if self.client_ca is not None else None
        for name, pem in (("--tls-cert", chain), ("--tls-key", key), ("--client-ca", ca)):
            if pem is not None and b"-----BEGIN " not in pem:
                raise ValueError(f"{name} is not a PEM file")
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=ca, require_client_auth=ca is not None
        )

    def grpc_options(self) -> list[tuple[str, int]]:
        """The channel arguments of the server (message limits, keepalive policy)."""
        return [
            ("grpc.max_receive_message_length", self.max_receive_message_bytes),
            ("grpc.max_send_message_length", self.max_send_message_bytes),
            ("grpc.so_reuseport", 1 if self.member else 0),
            # How often a client may ping (GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS).
            (
                "grpc.http2.min_ping_interval_without_data_ms",
                int(self.keepalive_min_interval * 1000),
            ),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_ping_strikes", 2),
            ("grpc.keepalive_time_ms", int(self.keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout * 1000)),
        ]


class LetheServer:
    """One serving process for one data directory.

    Call :meth:`start`, then :meth:`stop` (also on SIGTERM, from the CLI).

    Raises:
        server.store.StoreLockedError, shredder.EnvironmentConfigError: from
            opening the store (see :class:`server.store.Store`).
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._limits = config.limits()
        self._credentials = config.server_credentials()
        self.metrics = Metrics()
        self.store = Store(
            config.data_dir,
            kek_file=config.kek_file,
            max_size=config.max_store_size,
            disk_reserve=config.disk_reserve,
            shared=config.member,
            standby=config.standby,
        )
        # A call waiting for its group commit lends its running slot meanwhile.
        self.store.writer.waiting = _steps.blocking
        self.retriever = Retriever(
            self.store, load_embedder(config.embedder), max_bytes=config.index_cache_size
        )
        self.lifecycle = Lifecycle(
            self.store,
            self.retriever,
            self.metrics,
            config.rotation_interval,
            echo_guard_window=(
                config.pending_ttl if config.echo_guard_window is None else config.echo_guard_window
            ),
        )
        self.port = 0
        self.http_port = 0
        self.edge: Edge | None = None
        self.hub: EventHub | None = None
        self._grpc: grpc.aio.Server | None = None
        self._http: asyncio.Task[None] | None = None
        self._http_stop: asyncio.Event | None = None
        self._health: HealthServicer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._sweeper: Sweeper | None = None
        self._metrics_server: Any = None
        self._stopped = threading.Event()
        self.executor: FairExecutor | None = None

    def start(self) -> int:
        """Recover, then serve. Returns the bound gRPC port.

        A member of a ``--processes`` group that is not the primary neither
        recovers nor sweeps (the primary did and does; the supervisor starts it
        first); it follows the store's change log instead
        (:mod:`server.retrieval._follow`), as the primary does too.

        Raises:
            OSError: the gRPC or the metrics address cannot be bound (the
                message names it), or the TLS files are unusable.
        """
        if self.store.primary:
            recovery = self.lifecycle.recover()
            if recovery.changed():
                _log.info("recovered: %s", recovery.summary())
            try:
                check_embedder(self.store, self.retriever.embedder)
            except LetheError as exc:  # e.g. a full disk: owners are still re-embedded on use
                _log.error("recording the embedder failed (%s): continuing", type(exc).__name__)
        self.executor = FairExecutor(
            self._limits.workers,
            "lethe-rpc",
            per_key=self._limits.max_running_per_principal,
            on_depth=self.metrics.queued_calls.set,
            slots=self._limits.max_running,
            on_stall=self.metrics.pool_stalls.inc,
        )
        self.metrics.lmdb_readers.set_function(self.store.reader_slots)
        _hold_grpc_aio()
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._loop_thread = threading.Thread(
            target=loop.run_forever, name="lethe-loop", daemon=True
        )
        self._loop_thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._serve(), loop).result()
        if self.store.shared and self.hub is not None:
            self.retriever.follow(on_change=self.hub.notify_threadsafe)
        if self.config.sweep_interval > 0 and self.store.primary:
            assert self.edge is not None
            admission = self.edge.admission
            self._sweeper = Sweeper(
                self.lifecycle,
                self.config.sweep_interval,
                self.config.audit_interval,
                self.config.expiry_warning,
                busy=lambda: admission.inflight > 0,  # its audit yields to calls
            )
            self._sweeper.start()
        if self.config.metrics_listen:
            self._start_metrics(self.config.metrics_listen)
        name_os_threads()  # for top -H and ps -L: every lethe- thread has started
        return self.port

    async def _serve(self) -> int:
        """Build and start the gRPC server on the loop; returns its port."""
        assert self.executor is not None
        hub = EventHub(asyncio.get_running_loop())
        self.store.on_events(hub.notify_threadsafe)
        edge = Edge(
            Authenticator(self.store.get_token),
            Admission(self._limits, self.metrics),
            self.executor,
            self.metrics,
            Router(
                self.store.placement,
                require_header=self.config.require_owner_header,
                on_change=self.lifecycle.drop_owner,
            ),
        )
        self.hub, self.edge = hub, edge
        limits = self._limits
        provider = self.config.tracer_provider or tracer_provider(self.config.tracing)
        interceptors: list[Any] = []  # the metrics wrap each handler (MeasuredServer)
        if provider is not None:
            interceptors.append(TracingInterceptor(provider))
        self._tracer_provider = provider
        server = grpc.aio.server(
            interceptors=interceptors or None,
            options=self.config.grpc_options(),
            # A backstop over everything, health and reflection included: the
            # edge's own bounds (with reasons) refuse authenticated calls first.
            maximum_concurrent_rpcs=limits.max_inflight + limits.max_streams + 256,
        )
        memories = MemoriesService(
            self.store,
            self.retriever,
            self.config.pending_ttl,
            rules=self.config.tagger == "rules",
        )
        servicers = [
            (
                threads_pb2,
                "Threads",
                ThreadsService(
                    self.store,
                    self.retriever,
                    self.config.pending_ttl,
                    proposer=memories.candidates,
                ),
            ),
            (retrieval_pb2, "Retrieval", RetrievalService(self.retriever)),
            (
                lifecycle_pb2,
                "Lifecycle",
                LifecycleService(self.store, self.retriever, self.lifecycle),
            ),
            (memories_pb2, "Memories", memories),
            (events_pb2, "Events", EventsService(self.store, hub)),
            (
                repairs_pb2,
                "Repairs",
                RepairsService(self.store, self.retriever, self.lifecycle),
            ),
        ]
        names = []
        methods: list[Method] = []
        measured = MeasuredServer(server, self.metrics)
        for module, service, servicer in servicers:
            desc = module.DESCRIPTOR.services_by_name[service]
            served = edge.methods(desc, servicer)
            measured.add_generic_rpc_handlers([edge.grpc_handler(desc.full_name, served)])
            names.append(desc.full_name)
            methods += served
        health_servicer = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, measured)
        self._health = health_servicer
        # reflection.enable_server_reflection(names, server) with the asyncio
        # servicer it picks for a grpc.aio server, registered measured.
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            reflection.aio.ReflectionServicer(  # type: ignore[attr-defined]  # in its __all__
                [*names, health.SERVICE_NAME, reflection.SERVICE_NAME]
            ),
            measured,
        )
        try:
            if self._credentials is not None:
                port = server.add_secure_port(self.config.listen, self._credentials)
            else:
                port = server.add_insecure_port(self.config.listen)
        except RuntimeError:
            port = 0
        if port == 0:
            raise OSError(
                f"cannot listen on {self.config.listen} (in use, or not an address here; --listen)"
            )
        await server.start()
        self._grpc = server
        if self.config.http_listen is not None:
            self.http_port = self._serve_http(
                ConnectApp(
                    edge,
                    methods,
                    meter=CallMeter(self.metrics),
                    max_receive_bytes=self.config.max_receive_message_bytes,
                    max_send_bytes=self.config.max_send_message_bytes,
                    allow_origins=self.config.http_allow_origins,
                ),
                self.config.http_listen,
            )
        for name in names:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        self._watchdog = asyncio.get_running_loop().create_task(edge.watch_tokens())
        return port

    def _serve_http(self, app: ConnectApp, listen: str) -> int:
        """Serve ``app`` with Hypercorn on ``listen``, on this loop; returns the bound port.

        The socket is bound and listening before this returns, so a call
        made at once waits in the backlog rather than being refused.

        Raises:
            OSError: ``listen`` cannot be bound (the message names it).
        """
        from hypercorn.asyncio import serve
        from hypercorn.config import Config as HypercornConfig

        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self.config.member:  # the group's processes share the port
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind(address)
                sock.listen(1024)
            except BaseException:
                sock.close()
                raise
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise OSError(f"cannot listen on {listen} ({reason}; --http-listen)") from None
        bound = int(sock.getsockname()[1])
        config = HypercornConfig()
        config.bind = [f"fd://{sock.detach()}"]
        config.accesslog = None
        config.errorlog = logging.getLogger("server.http")
        config.include_server_header = False
        config.keep_alive_timeout = self.config.keepalive_time
        config.graceful_timeout = STOP_SLACK_SECONDS / 2
        if self._credentials is not None:
            # The gRPC listener's files; ALPN offers h2 and http/1.1 (Hypercorn's default).
            config.certfile = str(self.config.tls_cert)
            config.keyfile = str(self.config.tls_key)
            if self.config.client_ca is not None:
                config.ca_certs = str(self.config.client_ca)
                config.verify_mode = ssl.CERT_REQUIRED
            config.create_ssl_context()  # a file it cannot use fails the start, not a call
        stop = asyncio.Event()
        self._http_stop = stop
        self._http = asyncio.get_running_loop().create_task(
            serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
        )
        self._http.add_done_callback(_log_http_end)
        return bound

    def _start_metrics(self, listen: str) -> None:
        from prometheus_client import start_http_server

        host, _, port = listen.rpartition(":")
        try:
            self._metrics_server, _ = start_http_server(
                int(port), addr=host or "127.0.0.1", registry=self.metrics.registry
            )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            message = f"cannot serve /metrics on {listen} ({reason}; --metrics-listen)"
            raise OSError(message) from None

    @property
    def metrics_listen(self) -> str | None:
        """``HOST:PORT`` the ``/metrics`` listener is bound to (port 0 resolved), or None."""
        if self._metrics_server is None:
            return None
        host, port = self._metrics_server.server_address[:2]
        return f"{host}:{port}"

    def wait(self) -> None:
        """Block until :meth:`stop` has finished."""
        self._stopped.wait()

    def stop(self, grace: float = 5.0) -> None:
        """Drain the server, then stop the sweeper and close the store; idempotent.

        Draining (see the module docstring): health ``NOT_SERVING``, new calls
        refused, streams ended, running calls given ``grace`` seconds.
        """
        loop = self._loop
        if loop is not None:
            # Bounded from this thread too: grpc.aio's shutdown has blocked the
            # loop's own thread, where no timeout on the loop can fire.
            bound = grace + 2 * STOP_SLACK_SECONDS
            blocked = False
            try:
                drain = asyncio.run_coroutine_threadsafe(self._drain(grace), loop)
                try:
                    drain.result(timeout=bound)
                except concurrent.futures.TimeoutError:
                    blocked = True
                    _log.error(
                        "the event loop did not finish the drain within %.1f s (grpc's "
                        "shutdown blocks it); closing the store anyway",
                        bound,
                    )
            finally:
                loop.call_soon_threadsafe(loop.stop)
                if self._loop_thread is not None:
                    self._loop_thread.join(None if not blocked else STOP_SLACK_SECONDS)
                if self._loop_thread is None or not self._loop_thread.is_alive():
                    loop.close()  # else left to the daemon thread, blocked in grpc
                self._loop = None
                self._loop_thread = None
        if self.executor is not None:
            # Calls cancelled by the grace period may still be running: the
            # store stays open until every one of them has returned.
            self.executor.shutdown(wait=True)
            self.executor = None
        if self._sweeper is not None:
            self._sweeper.stop()
            self._sweeper = None
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None
        self.retriever.stop_following()
        if self.store.primary:  # one writer of the snapshot files
            self.lifecycle.save_snapshots_at_stop()  # the next start is warm
        provider = getattr(self, "_tracer_provider", None)
        if provider is not None and self.config.tracer_provider is None:
            provider.shutdown()  # sends the spans still batched
            self._tracer_provider = None
        self.store.close()
        self._stopped.set()

    async def _drain(self, grace: float) -> None:
        start = time.monotonic()
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self.edge is not None:
            self.edge.drain()
            await self.edge.wait_idle(grace)
        if self._grpc is not None:
            left = max(0.0, grace - (time.monotonic() - start))
            try:
                await asyncio.wait_for(self._grpc.stop(left), left + STOP_SLACK_SECONDS)
            except TimeoutError:
                _log.error(
                    "the gRPC server did not stop within %.1f s of its grace; closing anyway",
                    STOP_SLACK_SECONDS,
                )
            self._grpc = None
        if self._http is not None and self._http_stop is not None:
            self._http_stop.set()
            try:
                await asyncio.wait_for(self._http, STOP_SLACK_SECONDS)
            except TimeoutError:
                _log.error("the HTTP listener did not stop within %.1f s", STOP_SLACK_SECONDS)
            self._http = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None


def _log_http_end(task: asyncio.Task[None]) -> None:
    """Log the HTTP listener's failure, if it ended with one."""
    if not task.cancelled() and task.exception() is not None:
        error = task.exception()
        _log.error("the HTTP listener stopped: %s: %s", type(error).__name__, error)
