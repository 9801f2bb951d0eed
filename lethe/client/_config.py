"""What a client is constructed with: TLS, retries, message sizes, deadlines, reconnects.

Shared by :class:`lethe.client.Client` and
:class:`lethe.client.AsyncClient`: TLS settings, the retry policy (as a gRPC
service config, so gRPC itself retries within the call's deadline), message
size limits, the default deadline, which methods may be retried, and when and
after how long an event stream reconnects (:data:`WATCH_RECONNECT_CODES`,
:func:`backoff`: ``Watch`` is resumed by the client, never retried by gRPC).

Imports only grpc and the standard library.
"""

from __future__ import annotations

import ipaddress
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

DEFAULT_TIMEOUT = 30.0
"""Default deadline of every unary call, seconds (retries included)."""

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Send and receive limit per message, bytes: the server's own (API.md, "Views and sizes")."""

RETRIED_METHODS: tuple[tuple[str, str], ...] = (
    ("lethe.v1.Threads", "GetThread"),
    ("lethe.v1.Threads", "ListThreads"),
    ("lethe.v1.Threads", "ListTurns"),
    ("lethe.v1.Threads", "GetTurn"),
    # A write, made idempotent by its request_id (the client always sends one).
    ("lethe.v1.Threads", "AppendTurns"),
    ("lethe.v1.Memories", "GetMemory"),
    ("lethe.v1.Memories", "ListMemories"),
    ("lethe.v1.Memories", "ResolvePreference"),
    ("lethe.v1.Retrieval", "Search"),
    ("lethe.v1.Retrieval", "GetContextManifest"),
    ("lethe.v1.Lifecycle", "GetLineage"),
    ("lethe.v1.Lifecycle", "ListDeletions"),
    ("lethe.v1.Lifecycle", "Audit"),
    ("lethe.v1.Lifecycle", "GetServerInfo"),
    ("grpc.health.v1.Health", "Check"),
)
"""The methods retried on a retryable code: idempotent reads, and ``AppendTurns``
(which carries a ``request_id``). Never retried: ``CreateThread``,
``CreateMemory``, ``UpdateMemory``, ``TransitionMemory``, ``AssembleContext``
(it stores a manifest), ``Commit``, ``ExtendPending``, ``Forget`` and the
repair methods; ``Watch`` resumes with ``after`` instead."""

WATCH_RECONNECT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
"""Codes on which an event stream reconnects (resuming ``after`` the last event)."""


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """TLS settings of a channel.

    Attributes:
        root_certificates: PEM CA bundle that signs the server's certificate;
            None uses gRPC's default roots.
        private_key: PEM client key, for mutual TLS (with ``certificate_chain``).
        certificate_chain: PEM client certificate chain, for mutual TLS.
        server_name: the name to check the server certificate against, when it
            differs from the target's host (``grpc.ssl_target_name_override``).
    """

    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    server_name: str | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How gRPC retries the methods in :data:`RETRIED_METHODS`.

    Attributes:
        max_attempts: attempts in all, the first included (2..5; gRPC caps it at 5).
        initial_backoff: seconds before the first retry (randomised by gRPC
            between 0 and the current backoff).
        max_backoff: cap of the backoff, seconds.
        backoff_multiplier: growth of the backoff per attempt.
        retryable_codes: status code names that are retried. ``UNAVAILABLE``
            (the server is unreachable or restarting) and ``RESOURCE_EXHAUSTED``
            (the server refuses past its bounds on calls in flight).
    """

    max_attempts: int = 4
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    backoff_multiplier: float = 2.0
    retryable_codes: tuple[str, ...] = field(default=("UNAVAILABLE", "RESOURCE_EXHAUSTED"))

    def service_config(self) -> str:
        """The gRPC service config (JSON) that applies this policy.

        Raises:
            ValueError: ``max_attempts`` outside 2..5, a non-positive backoff or
                multiplier, or an unknown code name.
        """
        if not 2 <= self.max_attempts <= 5:
            raise ValueError("max_attempts must be 2..5 (gRPC caps retries at 5 attempts)")
        if self.initial_backoff <= 0 or self.max_backoff <= 0 or self.backoff_multiplier <= 0:
            raise ValueError("backoffs and multiplier must be positive")
        for code in self.retryable_codes:
            if code not in grpc.StatusCode.__members__:
                raise ValueError(f"unknown status code {code!r}")
        return json.dumps(
            {
                "methodConfig": [
                    {
                        "name": [{"service": s, "method": m} for s, m in RETRIED_METHODS],
                        "retryPolicy": {
                            "maxAttempts": self.max_attempts,
                            "initialBackoff": f"{self.initial_backoff:.6f}s",
                            "maxBackoff": f"{self.max_backoff:.6f}s",
                            "backoffMultiplier": self.backoff_multiplier,
                            "retryableStatusCodes": list(self.retryable_codes),
                        },
                    }
                ]
            }
        )


def backoff(policy: RetryPolicy, failures: int) -> float:
    """Seconds an event stream waits before it reconnects (exponential, full jitter).

    Args:
        policy: the client's retry policy (its backoffs and multiplier).
        failures: consecutive failed attempts so far (0 before the first reconnect).

    Returns:
        A uniformly random delay between 0 and
        ``min(max_backoff, initial_backoff * backoff_multiplier ** failures)`` seconds.
    """
    cap = min(policy.max_backoff, policy.initial_backoff * policy.backoff_multiplier**failures)
    return random.uniform(0, cap)  # noqa: S311 (jitter, not a secret)


def is_loopback(target: str) -> bool:
    """Whether a gRPC target names this machine.

    It does when it is ``127.0.0.0/8``, ``::1``, ``localhost`` (with or
    without a port or a ``dns:``/``ipv4:``/``ipv6:`` scheme), or a Unix socket
    (``unix:``).
    """
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme) :]
            break
    host = target
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ChannelPlan:
    """How to open a channel: credentials, options, and the metadata each call carries.

    Credentials are None for plaintext; the metadata then holds the bearer token.
    """

    credentials: grpc.ChannelCredentials | None
    options: list[tuple[str, Any]]
    metadata: tuple[tuple[str, str], ...]


def plan_channel(
    target: str,
    token: str,
    tls: TLSConfig | bool | None,
    retry: RetryPolicy | None,
    options: Sequence[tuple[str, Any]],
) -> ChannelPlan:
    """Decide credentials, options and per-call metadata for a client.

    ``tls=None`` means TLS unless ``target`` is a loopback address; over TLS
    the token travels as call credentials (``authorization: Bearer <token>``),
    on plaintext as call metadata.

    Args:
        target: ``HOST:PORT`` (or any gRPC target).
        token: the bearer token.
        tls: True (default roots), a :class:`TLSConfig`, False (plaintext), or None.
        retry: the retry policy, or None for no retries.
        options: further channel options; they override these.

    Returns:
        The plan.

    Raises:
        ValueError: an empty token, or an invalid retry policy.
    """
    if not token:
        raise ValueError("a bearer token is required")
    opts: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if retry is not None:
        opts += [("grpc.enable_retries", 1), ("grpc.service_config", retry.service_config())]
    else:
        opts.append(("grpc.enable_retries", 0))
    use_tls = (not is_loopback(target)) if tls is None else tls is not False
    if not use_tls:
        return ChannelPlan(None, [*opts, *options], (("authorization", f"Bearer {token}"),))
    config = tls if isinstance(tls, TLSConfig) else TLSConfig()
    if config.server_name:
        opts.append(("grpc.ssl_target_name_override", config.server_name))
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(
            config.root_certificates, config.private_key, config.certificate_chain
        ),
        grpc.access_token_call_credentials(token),
    )
    return ChannelPlan(creds, [*opts, *options], ())
