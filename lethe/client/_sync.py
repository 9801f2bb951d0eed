"""The blocking client: :class:`Client`, one method per RPC of ``lethe.v1``.

Thread rules: a :class:`Client` may be used from any number of threads at
once (as its ``grpc.Channel``); an :class:`EventStream` belongs to the thread
that iterates it, though any thread may :meth:`EventStream.close` it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
from google.protobuf import field_mask_pb2

from lethe._rpc import Stubs
from lethe.client._build import build, new_request_id
from lethe.client._config import (
    DEFAULT_TIMEOUT,
    WATCH_RECONNECT_CODES,
    RetryPolicy,
    TLSConfig,
    backoff,
    plan_channel,
)
from lethe.client._errors import DeadlineExceeded, LetheError, Unavailable, error_from_rpc
from lethe.client._routing import routed
from lethe.client._types import DurationLike, EnumOr, MessageOr, Metadata
from lethe.v1 import (
    common_pb2,
    events_pb2,
    lifecycle_pb2,
    memories_pb2,
    repairs_pb2,
    retrieval_pb2,
    threads_pb2,
)

__all__ = ["Client", "EventStream"]

_R = TypeVar("_R")


class EventStream(Iterator[events_pb2.Event]):
    """The events of ``Events.Watch``, resumed with ``after`` on reconnect.

    Iterating yields :class:`lethe.v1.events_pb2.Event` messages in id order.
    When the stream breaks (``UNAVAILABLE``, ``RESOURCE_EXHAUSTED``, or the
    server ending it, as it does when it shuts down), the stream is opened
    again with ``after`` set to the last event id seen, after a jittered
    backoff; events are never repeated or skipped while the server keeps them
    (API.md: kept for a bounded window). :attr:`last_id` is the resume point.

    It ends (``StopIteration``) after :meth:`close`; with a ``timeout``, it
    raises :class:`lethe.client.DeadlineExceeded` once that many seconds have
    passed since it was opened.
    """

    def __init__(
        self,
        open_call: Callable[[str, float | None], Any],
        *,
        after: str,
        timeout: float | None,
        max_reconnects: int | None,
        policy: RetryPolicy,
    ) -> None:
        self._open = open_call
        self.last_id = after
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._max_reconnects = max_reconnects
        self._policy = policy
        self._failures = 0
        self._call: Any = None
        self._closed = threading.Event()
        self._lock = threading.Lock()

    def _remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(self._deadline - time.monotonic(), 0.0)

    def _reconnect_or_raise(self, err: LetheError | None) -> None:
        """Back off before reopening, or raise when reconnecting is over."""
        self._call = None
        if self._max_reconnects is not None and self._failures >= self._max_reconnects:
            raise err or Unavailable("the event stream ended and reconnects are exhausted")
        delay = backoff(self._policy, self._failures)
        self._failures += 1
        remaining = self._remaining()
        if remaining is not None and remaining <= delay:
            delay = remaining
        if self._closed.wait(delay):
            raise StopIteration

    def __next__(self) -> events_pb2.Event:
        while True:
            if self._closed.is_set():
                raise StopIteration
            remaining = self._remaining()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded("the watch deadline passed")
            with self._lock:
                if self._call is None:
                    self._call = self._open(self.last_id, remaining)
                call = self._call
            try:
                event: events_pb2.Event = next(call)
            except StopIteration:
                self._reconnect_or_raise(None)
                continue
            except grpc.RpcError as raw:
                err = error_from_rpc(raw)
                if self._closed.is_set():
                    raise StopIteration from None
                if err.code() in WATCH_RECONNECT_CODES:
                    self._reconnect_or_raise(err)
                    continue
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and self._deadline is None:
                    self._reconnect_or_raise(err)
                    continue
                raise err from None
            self._failures = 0
            self.last_id = event.id
            return event

    def close(self) -> None:
        """Stop the stream: iteration ends, the call in flight is cancelled. Idempotent."""
        self._closed.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Client:
    """A blocking client of one Lethe server, bound to one bearer token.

    Each method sends one RPC: it takes the request's fields as keyword
    arguments (the request's first field, a resource name or parent, may be
    positional; nested messages may be given as dicts, enums by name, times as
    aware ``datetime`` or epoch seconds, durations as ``timedelta`` or
    seconds) and returns the generated response message. ``iter_*`` methods
    walk every page of a List method; :meth:`watch` follows ``Events.Watch``.

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
        channel = (
            grpc.insecure_channel(target, plan.options)
            if plan.credentials is None
            else grpc.secure_channel(target, plan.credentials, plan.options)
        )
        self.target = target
        self.stubs = Stubs(channel, token)
        self.metadata: Metadata = plan.metadata
        self.timeout = timeout
        self._retry = retry or RetryPolicy()

    # -- plumbing ----------------------------------------------------------------------

    def _call(self, rpc: Callable[..., _R], request: Any, timeout: float | None) -> _R:
        try:
            return rpc(
                request,
                metadata=routed(self.metadata, request),
                timeout=self.timeout if timeout is None else timeout,
            )
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None

    def close(self) -> None:
        """Close the channel; calls and streams in flight are cancelled. Idempotent."""
        self.stubs.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def wait_ready(self, timeout: float = 5.0) -> None:
        """Block until the channel is connected.

        Args:
            timeout: seconds to wait.

        Raises:
            Unavailable: not connected within ``timeout``.
        """
        try:
            grpc.channel_ready_future(self.stubs.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise Unavailable(f"cannot connect to {self.target} within {timeout:g} s") from None

    # -- lethe.v1.Threads --------------------------------------------------------------

    def create_thread(
        self, parent: str, *, thread_id: str = "", title: str = "", timeout: float | None = None
    ) -> threads_pb2.Thread:
        """``Threads.CreateThread``: a new conversation thread of an owner.

        Args:
            parent: ``owners/{owner}``.
            thread_id: the id (``[a-z0-9][a-z0-9-]{0,62}``); "" lets the server choose.
            title: optional title (content: encrypted).
            timeout: deadline in seconds (default: the client's).

        Returns:
            The thread.

        Raises:
            AlreadyExists: ``thread_id`` is taken.
        """
        request = build(
            threads_pb2.CreateThreadRequest,
            {"parent": parent, "thread_id": thread_id, "title": title},
        )
        return self._call(self.stubs.threads.CreateThread, request, timeout)

    def get_thread(self, name: str, *, timeout: float | None = None) -> threads_pb2.Thread:
        """``Threads.GetThread``.

        Args:
            name: ``owners/{owner}/threads/{thread}``.
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound: never existed. RecordDeleted: forgotten.
        """
        request = threads_pb2.GetThreadRequest(name=name)
        return self._call(self.stubs.threads.GetThread, request, timeout)

    def list_threads(
        self,
        parent: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        include_repairs: bool = False,
        timeout: float | None = None,
    ) -> threads_pb2.ListThreadsResponse:
        """``Threads.ListThreads``: one page (see :meth:`iter_threads` for all).

        Args:
            parent: ``owners/{owner}``.
            page_size: threads per page (0: 100; at most 1000).
            page_token: ``next_page_token`` of the previous page.
            include_repairs: also list repair threads.
            timeout: deadline in seconds (default: the client's).
        """
        request = build(
            threads_pb2.ListThreadsRequest,
            {
                "parent": parent,
                "page_size": page_size,
                "page_token": page_token,
                "include_repairs": include_repairs,
            },
        )
        return self._call(self.stubs.threads.ListThreads, request, timeout)

    def iter_threads(
        self,
        parent: str,
        *,
        page_size: int = 0,
        include_repairs: bool = False,
        timeout: float | None = None,
    ) -> Iterator[threads_pb2.Thread]:
        """Every thread of an owner, page after page (``ListThreads``).

        Args:
            parent: ``owners/{owner}``.
            page_size: threads per request (0: the server's default).
            include_repairs: also list repair threads.
            timeout: deadline of each page's call, seconds.
        """
        token = ""
        while True:
            page = self.list_threads(
                parent,
                page_size=page_size,
                page_token=token,
                include_repairs=include_repairs,
                timeout=timeout,
            )
            yield from page.threads
            token = page.next_page_token
            if not token:
                return

    def append_turns(
        self,
        parent: str,
        turns: Iterable[MessageOr[threads_pb2.TurnInput]],
        *,
        request_id: str = "",
        echo_text: bool = False,
        timeout: float | None = None,
    ) -> threads_pb2.AppendTurnsResponse:
        """``Threads.AppendTurns``: append turns at the end of a thread, in one transaction.

        Args:
            parent: the thread, ``owners/{owner}/threads/{thread}``.
            turns: 1..1000 ``TurnInput`` (or dicts: ``{"role": "USER", "text": …,
                "commit": True, "pending_ttl": 3600}``).
            request_id: idempotency key (``[A-Za-z0-9._:-]{1,128}``); "" sends a
                fresh one (:func:`new_request_id`), which makes the call safe to retry.
            echo_text: return the turns' text in the reply (default: the turns come
                back without it, so the reply stays small whatever was appended).
            timeout: deadline in seconds (default: the client's).

        Returns:
            The stored turns and the candidates the write-time tagger proposed.

        Raises:
            NotFound / RecordDeleted: the thread. RepairNotContinued: a repair
            thread that is not ``CONTINUED``. DimensionMismatch: an embedding of
            the wrong dimension.
        """
        request = build(
            threads_pb2.AppendTurnsRequest,
            {
                "parent": parent,
                "turns": turns,
                "request_id": request_id or new_request_id(),
                "echo_text": echo_text,
            },
        )
        return self._call(self.stubs.threads.AppendTurns, request, timeout)

    def list_turns(
        self,
        parent: str,
        *,
        states: Iterable[EnumOr[common_pb2.State.ValueType]] = (),
        include_tainted: bool = False,
        page_size: int = 0,
        page_token: str = "",
        view: EnumOr[common_pb2.View.ValueType] | None = None,
        timeout: float | None = None,
    ) -> threads_pb2.ListTurnsResponse:
        """``Threads.ListTurns``: one page of a thread's turns, in seq order.

        Args:
            parent: the thread.
            states: states to list (default ``PENDING`` and ``COMMITTED``).
            include_tainted: also list tainted responses.
            page_size: turns per page (0: 100; at most 1000).
            page_token: ``next_page_token`` of the previous page.
            view: ``FULL`` adds embeddings.
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound / RecordDeleted: the thread.
        """
        request = build(
            threads_pb2.ListTurnsRequest,
            {
                "parent": parent,
                "states": states,
                "include_tainted": include_tainted,
                "page_size": page_size,
                "page_token": page_token,
                "view": view,
            },
        )
        return self._call(self.stubs.threads.ListTurns, request, timeout)

    def iter_turns(
        self,
        parent: str,
        *,
        states: Iterable[EnumOr[common_pb2.State.ValueType]] = (),
        include_tainted: bool = False,
        page_size: int = 0,
        view: EnumOr[common_pb2.View.ValueType] | None = None,
        timeout: float | None = None,
    ) -> Iterator[threads_pb2.Turn]:
        """Every turn of a thread, page after page (``ListTurns``; arguments as there).

        Raises:
            NotFound / RecordDeleted: the thread.
        """
        states = list(states)
        token = ""
        while True:
            page = self.list_turns(
                parent,
                states=states,
                include_tainted=include_tainted,
                page_size=page_size,
                page_token=token,
                view=view,
                timeout=timeout,
            )
            yield from page.turns
            token = page.next_page_token
            if not token:
                return

    def get_turn(
        self,
        name: str,
        *,
        view: EnumOr[common_pb2.View.ValueType] | None = None,
        timeout: float | None = None,
    ) -> threads_pb2.Turn:
        """``Threads.GetTurn``.

        Args:
            name: ``owners/{owner}/threads/{thread}/turns/{seq}``.
            view: ``FULL`` adds the embedding.
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound: never existed. RecordDeleted: deleted or expired.
            Sealed: sealed in a repair (no content is returned).
        """
        request = build(threads_pb2.GetTurnRequest, {"name": name, "view": view})
        return self._call(self.stubs.threads.GetTurn, request, timeout)

    # -- lethe.v1.Memories -------------------------------------------------------------

    def create_memory(
        self,
        parent: str,
        memory: MessageOr[memories_pb2.Memory],
        *,
        memory_id: str = "",
        timeout: float | None = None,
    ) -> memories_pb2.Memory:
        """``Memories.CreateMemory``: publish a memory with its lineage.

        Args:
            parent: ``owners/{owner}``.
            memory: the memory (``kind`` and ``text`` at least; ``state``
                ``COMMITTED`` commits it when its sources are committed).
            memory_id: the id; "" lets the server choose.
            timeout: deadline in seconds (default: the client's).

        Returns:
            The stored memory (version 1, or the next version of a forgotten id).

        Raises:
            AlreadyExists: the id is taken. SlotConflict: a second active fact
            on the slot and scope (``subject`` names the holder). SourceDeleted,
            SourceStale, SourceSealed: a source is gone, at another version, or
            sealed. DimensionMismatch: the embedding's dimension.
        """
        request = build(
            memories_pb2.CreateMemoryRequest,
            {"parent": parent, "memory_id": memory_id, "memory": memory},
        )
        return self._call(self.stubs.memories.CreateMemory, request, timeout)

    def get_memory(
        self, name: str, *, version: int = 0, timeout: float | None = None
    ) -> memories_pb2.Memory:
        """``Memories.GetMemory``.

        Args:
            name: ``owners/{owner}/memories/{memory}``.
            version: an explicit version, 0 for the current one.
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound: never existed, or no such version. RecordDeleted: deleted
            or expired. Sealed: sealed in a repair.
        """
        request = memories_pb2.GetMemoryRequest(name=name, version=version)
        return self._call(self.stubs.memories.GetMemory, request, timeout)

    def list_memories(
        self,
        parent: str,
        *,
        kinds: Iterable[EnumOr[memories_pb2.Memory.Kind.ValueType]] = (),
        states: Iterable[EnumOr[common_pb2.State.ValueType]] = (),
        statuses: Iterable[EnumOr[memories_pb2.Memory.Status.ValueType]] = (),
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> memories_pb2.ListMemoriesResponse:
        """``Memories.ListMemories``: one page of an owner's memories, by id.

        Args:
            parent: ``owners/{owner}``.
            kinds: kinds to list (default all).
            states: states to list (default ``PENDING`` and ``COMMITTED``).
            statuses: statuses to list (default all).
            page_size: memories per page (0: 100; at most 1000).
            page_token: ``next_page_token`` of the previous page.
            timeout: deadline in seconds (default: the client's).
        """
        request = build(
            memories_pb2.ListMemoriesRequest,
            {
                "parent": parent,
                "kinds": kinds,
                "states": states,
                "statuses": statuses,
                "page_size": page_size,
                "page_token": page_token,
            },
        )
        return self._call(self.stubs.memories.ListMemories, request, timeout)

    def iter_memories(
        self,
        parent: str,
        *,
        kinds: Iterable[EnumOr[memories_pb2.Memory.Kind.ValueType]] = (),
        states: Iterable[EnumOr[common_pb2.State.ValueType]] = (),
        statuses: Iterable[EnumOr[memories_pb2.Memory.Status.ValueType]] = (),
        page_size: int = 0,
        timeout: float | None = None,
    ) -> Iterator[memories_pb2.Memory]:
        """Every memory of an owner, page after page (``ListMemories``; arguments as there)."""
        kinds, states, statuses = list(kinds), list(states), list(statuses)
        token = ""
        while True:
            page = self.list_memories(
                parent,
                kinds=kinds,
                states=states,
                statuses=statuses,
                page_size=page_size,
                page_token=token,
                timeout=timeout,
            )
            yield from page.memories
            token = page.next_page_token
            if not token:
                return

    def update_memory(
        self,
        memory: MessageOr[memories_pb2.Memory],
        *,
        update_mask: field_mask_pb2.FieldMask | Sequence[str] | None = None,
        expected_version: int = 0,
        timeout: float | None = None,
    ) -> memories_pb2.Memory:
        """``Memories.UpdateMemory``: a new version (a correction, for facts and preferences).

        Args:
            memory: the memory with its ``name`` and the new field values.
            update_mask: the fields to change (``["text"]``); None changes the
                mutable fields the server takes by default.
            expected_version: the etag: refuse unless this is the current
                version (0: no check).
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound / RecordDeleted: the memory. VersionMismatch:
            ``expected_version`` is not current. SlotConflict, SourceDeleted,
            SourceStale, SourceSealed: as :meth:`create_memory`. Sealed: sealed
            in a repair.
        """
        request = build(
            memories_pb2.UpdateMemoryRequest,
            {"memory": memory, "update_mask": update_mask, "expected_version": expected_version},
        )
        return self._call(self.stubs.memories.UpdateMemory, request, timeout)

    def transition_memory(
        self,
        name: str,
        *,
        status: EnumOr[memories_pb2.Memory.Status.ValueType],
        expected_version: int = 0,
        evidence: MessageOr[common_pb2.SourceRef] | None = None,
        note: str = "",
        timeout: float | None = None,
    ) -> memories_pb2.Memory:
        """``Memories.TransitionMemory``: move a memory along its kind's state machine.

        Args:
            name: the memory.
            status: the target status (``"FULFILLED"``, ``"ANSWERED"``, …).
            expected_version: the etag (0: no check).
            evidence: the record that closes it, at its exact version.
            note: a note kept with the new version (content: encrypted).
            timeout: deadline in seconds (default: the client's).

        Raises:
            IllegalTransition: the kind's state machine forbids it.
            VersionMismatch: ``expected_version`` is not current. NotFound /
            RecordDeleted: the memory. SourceDeleted, SourceStale, SourceSealed:
            the evidence.
        """
        request = build(
            memories_pb2.TransitionMemoryRequest,
            {
                "name": name,
                "expected_version": expected_version,
                "status": status,
                "evidence": evidence,
                "note": note,
            },
        )
        return self._call(self.stubs.memories.TransitionMemory, request, timeout)

    def resolve_preference(
        self, parent: str, *, slot: str, scope: str = "", timeout: float | None = None
    ) -> memories_pb2.ResolvePreferenceResponse:
        """``Memories.ResolvePreference``: the applicable preference and the candidates.

        Args:
            parent: ``owners/{owner}``.
            slot: the preference's slot (``"reply.language"``).
            scope: the scope asked about; the narrowest applicable one wins.
            timeout: deadline in seconds (default: the client's).
        """
        request = build(
            memories_pb2.ResolvePreferenceRequest, {"parent": parent, "slot": slot, "scope": scope}
        )
        return self._call(self.stubs.memories.ResolvePreference, request, timeout)

    # -- lethe.v1.Retrieval ------------------------------------------------------------

    def search(
        self,
        parent: str,
        *,
        query_text: str = "",
        query_embedding: Iterable[float] = (),
        top_k: int = 0,
        thread: str = "",
        include_pending: bool = False,
        kinds: Iterable[EnumOr[memories_pb2.Memory.Kind.ValueType]] = (),
        include_turns: bool = False,
        mode: EnumOr[retrieval_pb2.SearchRequest.Mode.ValueType] | None = None,
        timeout: float | None = None,
    ) -> retrieval_pb2.SearchResponse:
        """``Retrieval.Search``: the owner's committed, live, untainted records, best first.

        Args:
            parent: ``owners/{owner}``.
            query_text: the query (``LEXICAL`` needs it).
            query_embedding: a query vector of the owner's dimension.
            top_k: 1..1000 hits (0: 10).
            thread: with ``include_pending``, also that thread's pending turns.
            include_pending: see ``thread``.
            kinds: search memories of these kinds (default: turns and every kind).
            include_turns: with ``kinds``, also search turns.
            mode: ``HYBRID`` (default), ``DENSE`` or ``LEXICAL``.
            timeout: deadline in seconds (default: the client's).

        Returns:
            ``hits``: each a ``turn`` or a ``memory`` with its ``score``.

        Raises:
            DimensionMismatch: ``query_embedding`` has the wrong dimension.
        """
        request = build(
            retrieval_pb2.SearchRequest,
            {
                "parent": parent,
                "query_text": query_text,
                "query_embedding": query_embedding,
                "top_k": top_k,
                "thread": thread,
                "include_pending": include_pending,
                "kinds": kinds,
                "include_turns": include_turns,
                "mode": mode,
            },
        )
        return self._call(self.stubs.retrieval.Search, request, timeout)

    def assemble_context(
        self,
        thread: str,
        *,
        query_text: str = "",
        query_embedding: Iterable[float] = (),
        max_chars: int = 0,
        recent_turns: int = 0,
        top_k: int = 0,
        scope: str = "",
        timeout: float | None = None,
    ) -> retrieval_pb2.ContextBundle:
        """``Retrieval.AssembleContext``: what a model should see for its next response.

        Not retried: the server stores the manifest of what it returned.

        Args:
            thread: the thread the response belongs to.
            query_text: what to find relevant memories for.
            query_embedding: a query vector instead of, or with, the text.
            max_chars: budget of the whole bundle (0: the server's default).
            recent_turns: how many recent turns (0: the server's default).
            top_k: how many relevant memories (0: the server's default).
            scope: the scope preferences are resolved at.
            timeout: deadline in seconds (default: the client's).

        Returns:
            The bundle, with the stored ``manifest`` naming every record in it.

        Raises:
            NotFound / RecordDeleted: the thread.
        """
        request = build(
            retrieval_pb2.AssembleContextRequest,
            {
                "thread": thread,
                "query_text": query_text,
                "query_embedding": query_embedding,
                "max_chars": max_chars,
                "recent_turns": recent_turns,
                "top_k": top_k,
                "scope": scope,
            },
        )
        return self._call(self.stubs.retrieval.AssembleContext, request, timeout)

    def get_context_manifest(
        self, name: str, *, timeout: float | None = None
    ) -> retrieval_pb2.ContextManifest:
        """``Retrieval.GetContextManifest``.

        Args:
            name: ``owners/{owner}/manifests/{manifest}``.
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound: no such manifest.
        """
        request = retrieval_pb2.GetContextManifestRequest(name=name)
        return self._call(self.stubs.retrieval.GetContextManifest, request, timeout)

    # -- lethe.v1.Lifecycle ------------------------------------------------------------

    def commit(
        self,
        names: Iterable[str],
        *,
        include_sources: bool = False,
        timeout: float | None = None,
    ) -> lifecycle_pb2.CommitResponse:
        """``Lifecycle.Commit``: make pending turns and memories memory.

        Args:
            names: turn or memory names of one owner.
            include_sources: also commit the pending sources of the named memories.
            timeout: deadline in seconds (default: the client's).

        Returns:
            ``committed``: every record committed, at its version.

        Raises:
            SourcePending: a memory's source is pending (pass ``include_sources``).
            NotFound / RecordDeleted: a named record. Sealed: a sealed record.
        """
        request = build(
            lifecycle_pb2.CommitRequest, {"names": names, "include_sources": include_sources}
        )
        return self._call(self.stubs.lifecycle.Commit, request, timeout)

    def extend_pending(
        self,
        names: Iterable[str],
        *,
        ttl: DurationLike | None = None,
        timeout: float | None = None,
    ) -> lifecycle_pb2.ExtendPendingResponse:
        """``Lifecycle.ExtendPending``: push back the expiry of pending records.

        Args:
            names: pending turn or memory names of one owner.
            ttl: the new lifetime from now (seconds, ``timedelta`` or ``Duration``).
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound / RecordDeleted: a named record.
        """
        request = build(lifecycle_pb2.ExtendPendingRequest, {"names": names, "ttl": ttl})
        return self._call(self.stubs.lifecycle.ExtendPending, request, timeout)

    def forget(
        self,
        names: Iterable[str] = (),
        *,
        range: MessageOr[lifecycle_pb2.TurnRange] | None = None,
        responses: EnumOr[lifecycle_pb2.ForgetRequest.Responses.ValueType] | None = None,
        reason: str = "",
        timeout: float | None = None,
    ) -> common_pb2.DeletionReceipt:
        """``Lifecycle.Forget``: delete records, every descendant, and their keys.

        Returns when the deletion is effective for every reader. Not retried.

        Args:
            names: turn, memory, thread or owner names (one owner).
            range: a ``TurnRange`` (``{"thread": …, "from_seq": 3, "to_seq": 7}``).
            responses: ``TAINT`` (default) or ``DELETE`` responses built on
                what is forgotten.
            reason: kept on the receipt; must not carry content (≤ 256 bytes).
            timeout: deadline in seconds (default: the client's).

        Returns:
            The receipt: identifiers and counts, never content.

        Raises:
            NotFound / RecordDeleted: a named record.
        """
        request = build(
            lifecycle_pb2.ForgetRequest,
            {"names": names, "range": range, "responses": responses, "reason": reason},
        )
        return self._call(self.stubs.lifecycle.Forget, request, timeout)

    def get_lineage(
        self,
        name: str,
        *,
        direction: EnumOr[lifecycle_pb2.GetLineageRequest.Direction.ValueType] | None = None,
        max_depth: int = 0,
        timeout: float | None = None,
    ) -> lifecycle_pb2.GetLineageResponse:
        """``Lifecycle.GetLineage``: the lineage edges around a record (names only).

        Args:
            name: a turn or memory.
            direction: ``ANCESTORS`` or ``DESCENDANTS``.
            max_depth: how far (0: the server's default).
            timeout: deadline in seconds (default: the client's).
        """
        request = build(
            lifecycle_pb2.GetLineageRequest,
            {"name": name, "direction": direction, "max_depth": max_depth},
        )
        return self._call(self.stubs.lifecycle.GetLineage, request, timeout)

    def list_deletions(
        self,
        parent: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> lifecycle_pb2.ListDeletionsResponse:
        """``Lifecycle.ListDeletions``: one page of an owner's deletion receipts.

        Args:
            parent: ``owners/{owner}``.
            page_size: receipts per page (0: 100; at most 1000).
            page_token: ``next_page_token`` of the previous page.
            timeout: deadline in seconds (default: the client's).
        """
        request = build(
            lifecycle_pb2.ListDeletionsRequest,
            {"parent": parent, "page_size": page_size, "page_token": page_token},
        )
        return self._call(self.stubs.lifecycle.ListDeletions, request, timeout)

    def iter_deletions(
        self, parent: str, *, page_size: int = 0, timeout: float | None = None
    ) -> Iterator[common_pb2.DeletionReceipt]:
        """Every deletion receipt of an owner, page after page (``ListDeletions``)."""
        token = ""
        while True:
            page = self.list_deletions(
                parent, page_size=page_size, page_token=token, timeout=timeout
            )
            yield from page.receipts
            token = page.next_page_token
            if not token:
                return

    def audit(self, parent: str, *, timeout: float | None = None) -> lifecycle_pb2.AuditReport:
        """``Lifecycle.Audit``: orphans, stale summaries, key and index drift (all 0 when healthy).

        Args:
            parent: ``owners/{owner}``.
            timeout: deadline in seconds (default: the client's).
        """
        request = lifecycle_pb2.AuditRequest(parent=parent)
        return self._call(self.stubs.lifecycle.Audit, request, timeout)

    # -- lethe.v1.Repairs --------------------------------------------------------------

    def seal_repair(
        self, thread: str, *, from_seq: int, timeout: float | None = None
    ) -> threads_pb2.Thread:
        """``Repairs.SealRepair``: seal ``from_seq`` and every later turn into a repair thread.

        Args:
            thread: the conversation thread.
            from_seq: the first sealed turn's seq.
            timeout: deadline in seconds (default: the client's).

        Returns:
            The new repair thread (``PAUSED``).

        Raises:
            NotFound / RecordDeleted: the thread or the turn.
        """
        request = repairs_pb2.SealRepairRequest(thread=thread, from_seq=from_seq)
        return self._call(self.stubs.repairs.SealRepair, request, timeout)

    def reopen_repair(
        self, name: str, *, acknowledge_restricted: bool = False, timeout: float | None = None
    ) -> repairs_pb2.ReopenRepairResponse:
        """``Repairs.ReopenRepair``: continue a repair with its sealed context.

        Args:
            name: the repair thread.
            acknowledge_restricted: needed for a ``PRESERVE_RESTRICTED`` repair.
            timeout: deadline in seconds (default: the client's).

        Raises:
            Restricted: a restricted repair without the acknowledgement.
            NotFound / RecordDeleted: the repair.
        """
        request = repairs_pb2.ReopenRepairRequest(
            name=name, acknowledge_restricted=acknowledge_restricted
        )
        return self._call(self.stubs.repairs.ReopenRepair, request, timeout)

    def pause_repair(self, name: str, *, timeout: float | None = None) -> threads_pb2.Thread:
        """``Repairs.PauseRepair``: step away from a repair; nothing is committed or destroyed.

        Raises:
            NotFound / RecordDeleted: the repair. IllegalTransition: it is concluded.
        """
        request = repairs_pb2.PauseRepairRequest(name=name)
        return self._call(self.stubs.repairs.PauseRepair, request, timeout)

    def conclude_repair(
        self,
        name: str,
        *,
        outcome: EnumOr[threads_pb2.RepairInfo.Outcome.ValueType],
        lesson_text: str = "",
        timeout: float | None = None,
    ) -> repairs_pb2.ConcludeRepairResponse:
        """``Repairs.ConcludeRepair``: ``DESTROY``, ``PRESERVE_RESTRICTED`` or ``DISTILL``.

        Args:
            name: the repair thread.
            outcome: how it ends.
            lesson_text: the agreed lesson, for ``DISTILL``.
            timeout: deadline in seconds (default: the client's).

        Raises:
            NotFound / RecordDeleted: the repair. IllegalTransition: already concluded.
        """
        request = build(
            repairs_pb2.ConcludeRepairRequest,
            {"name": name, "outcome": outcome, "lesson_text": lesson_text},
        )
        return self._call(self.stubs.repairs.ConcludeRepair, request, timeout)

    # -- lethe.v1.Events ---------------------------------------------------------------

    def watch(
        self,
        parent: str,
        *,
        types: Iterable[EnumOr[events_pb2.EventType.ValueType]] = (),
        after: str = "",
        timeout: float | None = None,
        max_reconnects: int | None = None,
    ) -> EventStream:
        """``Events.Watch``: follow an owner's events, resuming after reconnects.

        Args:
            parent: ``owners/{owner}``.
            types: event types to receive (default all).
            after: start after this event id ("" from the oldest kept).
            timeout: seconds after which the stream raises
                :class:`~lethe.client.DeadlineExceeded`; None (default) follows forever.
            max_reconnects: consecutive reconnect attempts before the stream
                gives up with :class:`~lethe.client.Unavailable`; None: forever.

        Returns:
            An :class:`EventStream` (an iterator; close it, or use ``with``).

        Raises:
            BadField: a malformed ``after`` (raised when iterating), as the
            other errors of the call.
        """
        types = list(types)

        def open_call(resume: str, remaining: float | None) -> Any:
            request = build(
                events_pb2.WatchRequest, {"parent": parent, "types": types, "after": resume}
            )
            return self.stubs.events.Watch(
                request, metadata=routed(self.metadata, request), timeout=remaining
            )

        return EventStream(
            open_call,
            after=after,
            timeout=timeout,
            max_reconnects=max_reconnects,
            policy=self._retry,
        )
