"""Assembling and running one Lethe server.

:class:`LetheServer` opens the store, finishes interrupted deletions, forgets
records whose keys are gone, loads the embedder, and serves the gRPC services
plus ``grpc.health.v1.Health`` and server reflection, with the sweeper and the
metrics endpoint beside them. gRPC receive and send limits are set explicitly
to 16 MiB (API.md, "Views and sizes").
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from index import load_embedder
from lethe.v1 import (
    events_pb2,
    events_pb2_grpc,
    lifecycle_pb2,
    lifecycle_pb2_grpc,
    memories_pb2,
    memories_pb2_grpc,
    repairs_pb2,
    repairs_pb2_grpc,
    retrieval_pb2,
    retrieval_pb2_grpc,
    threads_pb2,
    threads_pb2_grpc,
)
from server._auth import AuthInterceptor
from server._lifecycle import Lifecycle, Recovery, Sweeper
from server._metrics import Metrics, RpcMetricsInterceptor
from server._reembed import check_embedder
from server._search import Retriever
from server.errors import LetheError
from server.services import (
    EventsService,
    LifecycleService,
    MemoriesService,
    RepairsService,
    RetrievalService,
    ThreadsService,
    abort,
)
from server.store import DEFAULT_MAX_STORE_SIZE, Store

_log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_PENDING_TTL = 72 * 3600.0


@dataclass
class ServerConfig:
    """Settings of ``lethe serve`` (API.md, "Command line").

    Attributes:
        listen: ``HOST:PORT``; port 0 picks a free port.
        metrics_listen: ``HOST:PORT`` of ``/metrics``, or None for no listener.
        embedder: ``wordllama``, ``none`` or ``onnx:DIR`` (:func:`index.load_embedder`);
            checked against the one the store recorded at start, and each
            owner's vectors are re-embedded on its first use after a change
            (:mod:`server._reembed`).
        pending_ttl: default pending lifetime, seconds.
        sweep_interval: seconds between expiry sweeps; 0 disables the sweeper.
        rotation_interval: seconds between rotations that complete shreds
            cryptographically (0: never; an in-memory ``LETHE_KEK`` is never rotated).
        tagger: ``rules`` (write-time rules propose candidates for untagged
            turns) or ``none``.
        expiry_warning: seconds ahead of a pending record's expiry at which the
            sweeper emits ``PENDING_EXPIRING``.
        audit_interval: seconds between the periodic audits behind the
            ``lethe_orphan_derivatives`` and ``lethe_stale_summaries`` gauges.
        max_store_size: bytes the data environment may grow to; a write that
            does not fit is refused whole (``STORE_FULL``).
    """

    data_dir: Path = Path("./lethe-data")
    listen: str = "127.0.0.1:50051"
    metrics_listen: str | None = "127.0.0.1:9464"
    kek_file: Path | None = None
    embedder: str = "wordllama"
    pending_ttl: float = DEFAULT_PENDING_TTL
    sweep_interval: float = 5.0
    audit_interval: float = 60.0
    expiry_warning: float = 3600.0
    tagger: str = "rules"
    rotation_interval: float = 3600.0
    max_workers: int = 16
    max_store_size: int = DEFAULT_MAX_STORE_SIZE


def _abort(context: grpc.ServicerContext, error: LetheError) -> None:
    abort(context, error)


class LetheServer:
    """One serving process for one data directory.

    Call :meth:`start`, then :meth:`stop` (also on SIGTERM, from the CLI).

    Raises:
        server.store.StoreLockedError, shredder.EnvironmentConfigError: from
            opening the store (see :class:`server.store.Store`).
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.store = Store(
            config.data_dir, kek_file=config.kek_file, max_size=config.max_store_size
        )
        self.retriever = Retriever(self.store, load_embedder(config.embedder))
        self.lifecycle = Lifecycle(
            self.store, self.retriever, self.metrics, config.rotation_interval
        )
        self.port = 0
        self._grpc: grpc.Server | None = None
        self._sweeper: Sweeper | None = None
        self._metrics_server: Any = None
        self._stopping = threading.Event()
        self._executor: futures.ThreadPoolExecutor | None = None

    def start(self) -> int:
        """Recover, then serve. Returns the bound gRPC port."""
        recovery = self.lifecycle.recover()
        if recovery != Recovery([], 0, 0, 0, [], 0, []):
            _log.info("recovered: %s", recovery.summary())
        try:
            check_embedder(self.store, self.retriever.embedder)
        except LetheError as exc:  # e.g. a full disk: owners are still re-embedded on use
            _log.error("recording the embedder failed (%s): continuing", type(exc).__name__)
        self._executor = futures.ThreadPoolExecutor(
            max_workers=self.config.max_workers, thread_name_prefix="lethe-rpc"
        )
        server = grpc.server(
            self._executor,
            interceptors=[
                RpcMetricsInterceptor(self.metrics),
                AuthInterceptor(self.store.get_principal, _abort),
            ],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        memories = MemoriesService(
            self.store,
            self.retriever,
            self.config.pending_ttl,
            rules=self.config.tagger == "rules",
        )
        threads_pb2_grpc.add_ThreadsServicer_to_server(
            ThreadsService(
                self.store,
                self.retriever,
                self.config.pending_ttl,
                proposer=memories.candidates,
            ),
            server,
        )
        retrieval_pb2_grpc.add_RetrievalServicer_to_server(RetrievalService(self.retriever), server)
        lifecycle_pb2_grpc.add_LifecycleServicer_to_server(
            LifecycleService(self.store, self.retriever, self.lifecycle), server
        )
        memories_pb2_grpc.add_MemoriesServicer_to_server(memories, server)
        events_pb2_grpc.add_EventsServicer_to_server(
            EventsService(self.store, self._stopping), server
        )
        repairs_pb2_grpc.add_RepairsServicer_to_server(
            RepairsService(self.store, self.retriever, self.lifecycle), server
        )
        health_servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        names = [
            threads_pb2.DESCRIPTOR.services_by_name["Threads"].full_name,
            retrieval_pb2.DESCRIPTOR.services_by_name["Retrieval"].full_name,
            lifecycle_pb2.DESCRIPTOR.services_by_name["Lifecycle"].full_name,
            memories_pb2.DESCRIPTOR.services_by_name["Memories"].full_name,
            events_pb2.DESCRIPTOR.services_by_name["Events"].full_name,
            repairs_pb2.DESCRIPTOR.services_by_name["Repairs"].full_name,
            health.SERVICE_NAME,
            reflection.SERVICE_NAME,
        ]
        reflection.enable_server_reflection(names, server)
        try:
            self.port = server.add_insecure_port(self.config.listen)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot listen on {self.config.listen} (in use, or not an address here)")
        server.start()
        for name in names[:6]:
            health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        self._grpc = server
        if self.config.sweep_interval > 0:
            self._sweeper = Sweeper(
                self.lifecycle,
                self.config.sweep_interval,
                self.config.audit_interval,
                self.config.expiry_warning,
            )
            self._sweeper.start()
        if self.config.metrics_listen:
            self._start_metrics(self.config.metrics_listen)
        return self.port

    def _start_metrics(self, listen: str) -> None:
        from prometheus_client import start_http_server

        host, _, port = listen.rpartition(":")
        self._metrics_server, _ = start_http_server(
            int(port), addr=host or "127.0.0.1", registry=self.metrics.registry
        )

    def wait(self) -> None:
        if self._grpc is not None:
            self._grpc.wait_for_termination()

    def stop(self, grace: float = 5.0) -> None:
        """Stop accepting calls, let running ones finish (``grace`` seconds),
        stop the sweeper and close the store."""
        self._stopping.set()  # ends Watch streams
        if self._grpc is not None:
            self._grpc.stop(grace).wait()
            self._grpc = None
        if self._executor is not None:
            # Handlers cancelled by the grace period may still be running: the
            # store stays open until every one of them has returned.
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._sweeper is not None:
            self._sweeper.stop()
            self._sweeper = None
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None
        self.store.close()
