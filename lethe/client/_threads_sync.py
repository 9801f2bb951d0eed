# Generated from lethe/client/_threads_async.py by scripts/gen_sync_client.py: do not edit.
# Edit the source and run `.venv/bin/python scripts/gen_sync_client.py`.
"""The ``lethe.v1.Threads`` methods of the client.

Threads and their turns: a method group of
:class:`lethe.client.Client`, which documents the errors, deadlines and
retries every method shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from lethe.client._base_sync import ClientBase
from lethe.client._build import build, new_request_id
from lethe.client._types import EnumOr, MessageOr
from lethe.v1 import common_pb2, threads_pb2

__all__ = ["ThreadsMethods"]


class ThreadsMethods(ClientBase):
    """The methods of ``lethe.v1.Threads``, one per RPC."""

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
