# Generated from lethe/client/_async.py by scripts/gen_sync_client.py: do not edit.
# Edit the source and run `.venv/bin/python scripts/gen_sync_client.py`.
"""The client :class:`Client`: one method per RPC of ``lethe.v1``.

:class:`Client` composes one method group per service, each in its own
module over :class:`lethe.client._base_sync.ClientBase` (which opens
the channel and sends a unary call): Threads, Memories, Retrieval,
Lifecycle, Repairs and Events. It adds the channel's lifecycle: :meth:`close`,
the context manager and :meth:`wait_ready`. Which threads or event loop may
use it: :mod:`lethe.client._transport_sync`.
"""

from __future__ import annotations

from types import TracebackType

from lethe.client._errors import Unavailable
from lethe.client._events_sync import EventsMethods
from lethe.client._lifecycle_sync import LifecycleMethods
from lethe.client._memories_sync import MemoriesMethods
from lethe.client._repairs_sync import RepairsMethods
from lethe.client._retrieval_sync import RetrievalMethods
from lethe.client._threads_sync import ThreadsMethods
from lethe.client._transport_sync import channel_ready, close_channel

__all__ = ["Client"]


class Client(
    ThreadsMethods,
    MemoriesMethods,
    RetrievalMethods,
    LifecycleMethods,
    RepairsMethods,
    EventsMethods,
):
    """A client of one Lethe server, bound to one bearer token.

    Each method sends one RPC: it takes the request's fields as keyword
    arguments (the request's first field, a resource name or parent, may be
    positional; nested messages may be given as dicts, enums by name, times as
    aware ``datetime`` or epoch seconds, durations as ``timedelta`` or
    seconds) and returns the generated response message. ``iter_*`` methods
    walk every page of a List method; :meth:`watch` follows ``Events.Watch``.
    Close it with ``client.close()`` or ``with``.

    Errors are :class:`lethe.client.LetheError` subclasses by code and reason
    (``except lethe.client.RecordDeleted``). Besides those each method lists,
    any call may raise :class:`~lethe.client.Unauthenticated`
    (``MissingToken``, ``InvalidToken``), :class:`~lethe.client.OwnerNotAllowed`,
    :class:`~lethe.client.BadField` (a malformed name or field; its
    ``field_violations`` name it), :class:`~lethe.client.Unavailable`,
    :class:`~lethe.client.ResourceExhausted` and
    :class:`~lethe.client.DeadlineExceeded`.

    Deadlines: every unary call has ``timeout`` seconds (the client's default,
    30 s, unless the call passes its own), retries included. Retries: gRPC
    retries the idempotent reads and ``AppendTurns`` on ``UNAVAILABLE`` and
    ``RESOURCE_EXHAUSTED`` with jittered exponential backoff
    (:class:`~lethe.client.RetryPolicy`); ``append_turns`` always sends a
    ``request_id`` (a fresh one when the caller gives none), so a retried
    append is stored once. Nothing else is retried.

    Attributes:
        target: the server address, as given.
        stubs: the raw generated stubs on this client's channel
            (:class:`lethe._rpc.Stubs`), for what the methods do not cover;
            pass ``metadata=client.metadata``.
        metadata: what each call sends beside the request: the bearer token on a
            plaintext channel, nothing over TLS (the token is a call credential).
    """

    def close(self) -> None:
        """Close the channel; calls and streams in flight are cancelled. Idempotent."""
        close_channel(self.stubs)

    def __enter__(self) -> Client:
        """The client itself; leaving the block closes it."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the client."""
        self.close()

    def wait_ready(self, timeout: float = 5.0) -> None:
        """Wait until the channel is connected.

        Args:
            timeout: seconds to wait.

        Raises:
            Unavailable: not connected within ``timeout``.
        """
        if not channel_ready(self.stubs, timeout):
            raise Unavailable(f"cannot connect to {self.target} within {timeout:g} s")
