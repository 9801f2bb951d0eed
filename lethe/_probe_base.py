"""What every case of ``lethe probe`` shares: the client, the findings, the errors.

:mod:`lethe.probe` runs the cycle (plant, forget, rebuild, cleanup) and
:mod:`lethe._probe_echo` its echo case; both speak to the server through
:class:`_Client` and report through :class:`_Findings`. Like the probe, this
module imports no ``server``, ``shredder`` or ``index`` module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from lethe.client import Client, LetheError

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "RPC_TIMEOUT_SECONDS",
    "SEARCH_TOP_K",
    "WATCH_TIMEOUT_SECONDS",
    "ProbeUnreachableError",
]

_T = TypeVar("_T")

RPC_TIMEOUT_SECONDS = 30.0
"""Deadline of every unary call (seconds)."""
CONNECT_TIMEOUT_SECONDS = 5.0
"""How long to wait for the channel to become ready (seconds)."""
WATCH_TIMEOUT_SECONDS = 5.0
"""How long to wait on ``Events.Watch`` for the summary's rebuild event (seconds)."""
SEARCH_TOP_K = 100

_MODES = ("HYBRID", "DENSE", "LEXICAL")
_FATAL_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
)


class ProbeUnreachableError(Exception):
    """The server could not be reached, or refused the token or the owner (exit 2)."""


class _StageAborted(Exception):
    """An RPC of the stage failed unexpectedly; the cycle cannot go on."""


def _reason(err: grpc.RpcError) -> str:
    return err.reason_name if isinstance(err, LetheError) else ""


def _describe(err: grpc.RpcError) -> str:
    reason = _reason(err)
    return f"{err.code().name}/{reason}" if reason else err.code().name


def _need(value: _T | None) -> _T:
    """``value``, which an earlier stage of the cycle set.

    Raises:
        _StageAborted: the earlier stage did not get that far.
    """
    if value is None:
        raise _StageAborted("an earlier stage of the cycle did not complete")
    return value


@dataclass
class _Findings:
    """What one stage found: ``LEAK`` (the value reachable) or ``FAIL`` (a check broke)."""

    items: list[str] = field(default_factory=list)

    def leak(self, what: str) -> None:
        self.items.append(f"LEAK: {what}")

    def fail(self, what: str) -> None:
        self.items.append(f"FAIL: {what}")

    @property
    def ok(self) -> bool:
        return not self.items

    def line(self) -> str:
        return "ok" if self.ok else "; ".join(self.items)


class _Client:
    """The typed client of one channel, bound to one bearer token and one owner.

    The probe speaks plaintext to ``--target`` (as ``lethe serve`` listens),
    the token as call metadata.
    """

    def __init__(self, target: str, token: str, owner: str) -> None:
        self.api = Client(target, token, tls=False, timeout=RPC_TIMEOUT_SECONDS)
        self.channel = self.api.stubs.channel
        self.target = target
        self.parent = f"owners/{owner}"

    def close(self) -> None:
        self.api.close()

    def connect(self) -> None:
        """Wait until the channel is ready; fail at its first failed connection attempt.

        Raises:
            ProbeUnreachableError: the first connection attempt failed, or the
                channel was not ready within ``CONNECT_TIMEOUT_SECONDS``.
        """
        settled = threading.Event()
        seen: list[grpc.ChannelConnectivity] = []

        def on_change(state: grpc.ChannelConnectivity) -> None:
            if state in (
                grpc.ChannelConnectivity.READY,
                grpc.ChannelConnectivity.TRANSIENT_FAILURE,
            ):
                seen.append(state)
                settled.set()

        self.channel.subscribe(on_change, try_to_connect=True)
        try:
            if not settled.wait(CONNECT_TIMEOUT_SECONDS):
                raise ProbeUnreachableError(
                    f"cannot connect to {self.target} within {CONNECT_TIMEOUT_SECONDS:g} s"
                )
            if seen[0] is not grpc.ChannelConnectivity.READY:
                raise ProbeUnreachableError(f"cannot connect to {self.target}")
        finally:
            self.channel.unsubscribe(on_change)

    def call(self, method: Callable[..., _T], *args: Any, **fields: Any) -> _T:
        """One call of a :class:`lethe.client.Client` method (deadline ``RPC_TIMEOUT_SECONDS``).

        Raises:
            ProbeUnreachableError: ``UNAVAILABLE``, ``UNAUTHENTICATED`` or
                ``PERMISSION_DENIED``.
            lethe.client.LetheError: any other failure, for the caller to judge.
        """
        try:
            return method(*args, **fields)
        except grpc.RpcError as err:
            if err.code() in _FATAL_CODES:
                raise ProbeUnreachableError(
                    f"{self.target} answered {_describe(err)} for {self.parent}"
                ) from None
            raise

    def must(self, what: str, method: Callable[..., _T], *args: Any, **fields: Any) -> _T:
        """Like :meth:`call`; any other failure aborts the stage.

        Raises:
            ProbeUnreachableError: as :meth:`call`.
            _StageAborted: the call failed otherwise; ``what`` names it.
        """
        try:
            return self.call(method, *args, **fields)
        except grpc.RpcError as err:
            raise _StageAborted(f"{what} answered {_describe(err)}") from None
