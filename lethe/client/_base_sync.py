# Generated from lethe/client/_base_async.py by scripts/gen_sync_client.py: do not edit.
# Edit the source and run `.venv/bin/python scripts/gen_sync_client.py`.
"""The declared base of every method group of :class:`lethe.client.Client`.

:class:`ClientBase` opens the channel and sends a unary call; the
method group of each service (``lethe.v1.Threads`` … ``lethe.v1.Events``, a
module each) derives from it and uses nothing else of the client: its
:attr:`~ClientBase.stubs`, :attr:`~ClientBase.metadata`, the retry
policy and :meth:`~ClientBase._call`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from lethe.client._config import DEFAULT_TIMEOUT, RetryPolicy, TLSConfig, plan_channel
from lethe.client._routing import routed
from lethe.client._transport_sync import open_stubs, unary
from lethe.client._types import Metadata

__all__ = ["ClientBase"]

_R = TypeVar("_R")


class ClientBase:
    """The channel of a client and its one way to send a unary call.

    Attributes:
        target: the server address, as given.
        stubs: the raw generated stubs on this client's channel
            (:class:`lethe._rpc.Stubs`), for what the methods do not cover;
            pass ``metadata=client.metadata``.
        metadata: what each call sends beside the request: the bearer token on a
            plaintext channel, nothing over TLS (the token is a call credential).
        timeout: the default deadline of each unary call, seconds (None: none).
    """

    def __init__(
        self,
        target: str,
        token: str,
        *,
        tls: TLSConfig | bool | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = RetryPolicy(),  # noqa: B008 (frozen, immutable)
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        """Open a channel to ``target`` (lazily: the first call connects).

        Args:
            target: ``HOST:PORT`` of a serving ``lethe`` (or any gRPC target).
            token: the bearer token (``lethe token create`` prints one).
            tls: None (default) uses TLS unless ``target`` is a loopback
                address (127.0.0.0/8, ``::1``, ``localhost``, a Unix socket),
                where the token goes as plain metadata; True uses TLS with
                gRPC's default roots; a :class:`~lethe.client.TLSConfig` sets
                roots, a client certificate or the expected server name; False
                forces plaintext (only on a network you trust: the token then
                travels unencrypted).
            timeout: default deadline of each unary call in seconds; None for none.
            retry: the retry policy, or None to never retry.
            options: extra gRPC channel options (``(name, value)`` pairs).

        Raises:
            ValueError: an empty token or an invalid retry policy.
        """
        plan = plan_channel(target, token, tls, retry, options)
        self.target = target
        self.stubs = open_stubs(target, token, plan)
        self.metadata: Metadata = plan.metadata
        self.timeout = timeout
        self._retry = retry or RetryPolicy()

    def _call(self, rpc: Callable[..., _R], request: Any, timeout: float | None) -> _R:
        """Send ``request`` on ``rpc`` with the routing header and the deadline.

        Args:
            rpc: a method of :attr:`stubs`.
            request: its request message.
            timeout: the call's deadline in seconds; None: the client's default.

        Returns:
            The response message.

        Raises:
            LetheError: the call failed (the subclass for its code and reason).
        """
        return unary(
            rpc,
            request,
            routed(self.metadata, request),
            self.timeout if timeout is None else timeout,
        )
