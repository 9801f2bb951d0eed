"""AppendTurns idempotency (request_id) and pagination of ListTurns and ListThreads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import grpc
import pytest
from _helpers import append, create_thread, list_texts, turn_input
from conftest import Lethe

from lethe._rpc import Stubs
from lethe.v1 import common_pb2, repairs_pb2, repairs_pb2_grpc, threads_pb2


def _req(thread: str, texts: list[str], request_id: str) -> threads_pb2.AppendTurnsRequest:
    return threads_pb2.AppendTurnsRequest(
        parent=thread, turns=[turn_input(t) for t in texts], request_id=request_id
    )


def _names_seqs(resp: threads_pb2.AppendTurnsResponse) -> list[tuple[str, int, str]]:
    return [(t.name, t.seq, t.text) for t in resp.turns]


def test_retry_with_same_request_id_appends_once(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    first = c.threads.AppendTurns(_req(thread, ["one", "two"], "req-1"), metadata=tuple(c.md))
    again = c.threads.AppendTurns(_req(thread, ["one", "two"], "req-1"), metadata=tuple(c.md))
    assert _names_seqs(again) == _names_seqs(first)
    assert [t.seq for t in first.turns] == [1, 2]
    assert [t.create_time for t in again.turns] == [t.create_time for t in first.turns]
    assert list_texts(c, thread) == ["one", "two"]
    t = c.threads.GetThread(threads_pb2.GetThreadRequest(name=thread), metadata=tuple(c.md))
    assert t.last_seq == 2


def test_retry_with_same_request_id_and_other_content_returns_first_result(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    first = c.threads.AppendTurns(_req(thread, ["original"], "req-x"), metadata=tuple(c.md))
    again = c.threads.AppendTurns(_req(thread, ["changed", "more"], "req-x"), metadata=tuple(c.md))
    assert _names_seqs(again) == _names_seqs(first)
    assert list_texts(c, thread) == ["original"]


def test_different_request_id_appends_again(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    a = c.threads.AppendTurns(_req(thread, ["same"], "req-a"), metadata=tuple(c.md))
    b = c.threads.AppendTurns(_req(thread, ["same"], "req-b"), metadata=tuple(c.md))
    assert [t.seq for t in a.turns] == [1]
    assert [t.seq for t in b.turns] == [2]
    # No request_id: every call appends.
    append(c, thread, ["same"])
    append(c, thread, ["same"])
    assert list_texts(c, thread) == ["same"] * 4


def test_request_id_is_scoped_to_its_thread(lethe: Lethe) -> None:
    c = lethe.client("alice")
    t1, t2 = create_thread(c, "alice"), create_thread(c, "alice")
    r1 = c.threads.AppendTurns(_req(t1, ["in one"], "shared"), metadata=tuple(c.md))
    r2 = c.threads.AppendTurns(_req(t2, ["in two"], "shared"), metadata=tuple(c.md))
    assert r1.turns[0].name.startswith(t1 + "/")
    assert r2.turns[0].name.startswith(t2 + "/")
    assert list_texts(c, t2) == ["in two"]


def test_concurrent_retries_with_same_request_id_append_once(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    results: list[list[tuple[str, int, str]]] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            resp = c.threads.AppendTurns(
                _req(thread, ["racy", "pair"], "req-race"), metadata=tuple(c.md)
            )
            results.append(_names_seqs(resp))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    workers = [threading.Thread(target=call) for _ in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=10)
    assert errors == []
    assert len(results) == 6
    assert all(r == results[0] for r in results)
    assert list_texts(c, thread) == ["racy", "pair"]


def test_retry_survives_restart(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    first = c.threads.AppendTurns(_req(thread, ["durable"], "req-d"), metadata=tuple(c.md))
    lethe.restart()
    c = lethe.client("alice")
    again = c.threads.AppendTurns(_req(thread, ["durable"], "req-d"), metadata=tuple(c.md))
    assert _names_seqs(again) == _names_seqs(first)
    assert list_texts(c, thread) == ["durable"]


class _Page(Protocol):
    @property
    def next_page_token(self) -> str: ...


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp", bound=_Page)
_Item = TypeVar("_Item")


def _pages(
    fn: Callable[[_Req], _Resp],
    make_req: Callable[[str], _Req],
    items_of: Callable[[_Resp], list[_Item]],
) -> list[tuple[list[_Item], str]]:
    pages: list[tuple[list[_Item], str]] = []
    token = ""
    for _ in range(20):
        resp = fn(make_req(token))
        pages.append(([*items_of(resp)], resp.next_page_token))
        token = resp.next_page_token
        if not token:
            return pages
    raise AssertionError("pagination did not end")


def test_list_turns_pages_of_two_over_five(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    texts = [f"turn {i}" for i in range(1, 6)]
    append(c, thread, texts[:3], commit=True)
    append(c, thread, texts[3:])
    pages = _pages(
        lambda r: c.threads.ListTurns(r, metadata=tuple(c.md)),
        lambda tok: threads_pb2.ListTurnsRequest(parent=thread, page_size=2, page_token=tok),
        lambda resp: [(t.seq, t.text) for t in resp.turns],
    )
    assert [p[0] for p in pages] == [
        [(1, "turn 1"), (2, "turn 2")],
        [(3, "turn 3"), (4, "turn 4")],
        [(5, "turn 5")],
    ]
    assert all(tok for _, tok in pages[:-1])
    assert pages[-1][1] == ""


def test_list_turns_pages_skip_forgotten_turns(lethe: Lethe) -> None:
    from _helpers import forget

    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    turns = append(c, thread, [f"turn {i}" for i in range(1, 7)], commit=True)
    forget(c, turns[1].name, turns[2].name)
    pages = _pages(
        lambda r: c.threads.ListTurns(r, metadata=tuple(c.md)),
        lambda tok: threads_pb2.ListTurnsRequest(parent=thread, page_size=2, page_token=tok),
        lambda resp: [t.seq for t in resp.turns],
    )
    assert [p[0] for p in pages] == [[1, 4], [5, 6]]
    assert pages[-1][1] == ""


def test_list_threads_pages_of_two_over_five(lethe: Lethe) -> None:
    c = lethe.client("alice")
    ids = ["t1", "t2", "t3", "t4", "t5"]
    for tid in reversed(ids):
        create_thread(c, "alice", thread_id=tid, title=f"title {tid}")
    other = lethe.client("alicia")
    create_thread(other, "alicia", thread_id="t0")  # an owner whose id shares a prefix
    pages = _pages(
        lambda r: c.threads.ListThreads(r, metadata=tuple(c.md)),
        lambda tok: threads_pb2.ListThreadsRequest(
            parent="owners/alice", page_size=2, page_token=tok
        ),
        lambda resp: [(t.name.rsplit("/", 1)[1], t.title) for t in resp.threads],
    )
    assert [[tid for tid, _ in p[0]] for p in pages] == [["t1", "t2"], ["t3", "t4"], ["t5"]]
    assert all(title == f"title {tid}" for p in pages for tid, title in p[0])
    assert all(tok for _, tok in pages[:-1])
    assert pages[-1][1] == ""


def test_list_threads_exact_multiple_has_no_empty_trailing_page(lethe: Lethe) -> None:
    c = lethe.client("alice")
    for tid in ["a1", "a2", "a3", "a4"]:
        create_thread(c, "alice", thread_id=tid)
    pages = _pages(
        lambda r: c.threads.ListThreads(r, metadata=tuple(c.md)),
        lambda tok: threads_pb2.ListThreadsRequest(
            parent="owners/alice", page_size=2, page_token=tok
        ),
        lambda resp: [t.name.rsplit("/", 1)[1] for t in resp.threads],
    )
    assert [p[0] for p in pages] == [["a1", "a2"], ["a3", "a4"]]


def test_list_turns_default_page_size_is_100(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    append(c, thread, [f"t{i}" for i in range(150)], commit=True)
    resp = c.threads.ListTurns(threads_pb2.ListTurnsRequest(parent=thread), metadata=tuple(c.md))
    assert len(resp.turns) == 100
    assert resp.next_page_token
    big = c.threads.ListTurns(
        threads_pb2.ListTurnsRequest(parent=thread, page_size=5000), metadata=tuple(c.md)
    )
    assert len(big.turns) == 150
    assert big.next_page_token == ""


def test_an_append_retry_does_not_return_what_was_sealed_since(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    req = threads_pb2.AppendTurnsRequest(
        parent=thread,
        request_id="rq-1",
        echo_text=True,
        turns=[
            threads_pb2.TurnInput(role=common_pb2.USER, text="harmless", commit=True),
            threads_pb2.TurnInput(role=common_pb2.USER, text="sealed yakmuffin", commit=True),
        ],
    )
    c.threads.AppendTurns(req, metadata=tuple(c.md))
    repairs_pb2_grpc.RepairsStub(c.channel).SealRepair(
        repairs_pb2.SealRepairRequest(thread=thread, from_seq=2), metadata=tuple(c.md)
    )
    again = c.threads.AppendTurns(req, metadata=tuple(c.md))
    assert [t.text for t in again.turns] == ["harmless"]


def test_a_big_append_is_acknowledged_to_a_client_with_default_limits(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    """1000 turns of 14 KiB: the reply and every listing page fit a client's default limits.

    Over 13 MiB, under the server's 16 MiB receive limit: the reply carries
    names, states and versions only, and every page of the listing fits gRPC's
    default 4 MiB receive limit of the client.
    """
    lethe = lethe_at(tmp_path / "d", embedder="none")
    token = lethe.token("alice")
    channel = grpc.insecure_channel(f"127.0.0.1:{lethe.port}")  # default limits
    try:
        stubs = Stubs(channel, token)
        thread = stubs.threads.CreateThread(
            threads_pb2.CreateThreadRequest(parent="owners/alice", thread_id="big"),
            metadata=stubs.md,
        ).name
        texts = [f"{i:04d} " + "long words of a long stored turn " * 430 for i in range(1000)]
        request = threads_pb2.AppendTurnsRequest(
            parent=thread, turns=[turn_input(t, commit=True) for t in texts]
        )
        assert request.ByteSize() > 13 * 1024 * 1024
        resp = stubs.threads.AppendTurns(request, metadata=stubs.md)
        assert [t.seq for t in resp.turns] == list(range(1, 1001))
        assert {t.state for t in resp.turns} == {common_pb2.COMMITTED}
        assert all(t.text == "" for t in resp.turns)
        assert resp.ByteSize() < 1024 * 1024
        # Asked to echo 14 MiB, the reply exceeds what this client accepts.
        with pytest.raises(grpc.RpcError) as err:
            stubs.threads.AppendTurns(
                threads_pb2.AppendTurnsRequest(parent=thread, turns=request.turns, echo_text=True),
                metadata=stubs.md,
            )
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Every page of a full listing fits the default limit, cut by size.
        got: list[str] = []
        token_ = ""
        pages = 0
        while True:
            page = stubs.threads.ListTurns(
                threads_pb2.ListTurnsRequest(parent=thread, page_size=1000, page_token=token_),
                metadata=stubs.md,
            )
            pages += 1
            got.extend(t.text for t in page.turns)
            token_ = page.next_page_token
            if not token_:
                break
        assert got[:1000] == texts
        assert pages >= 5
    finally:
        channel.close()
