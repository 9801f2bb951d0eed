"""``lethe.client.AsyncClient`` (grpc.aio) against a real server.

The same methods as coroutines, async page iterators, the async event stream,
typed errors. Portable, like ``test_client.py`` (run again in the light
client's venv).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import grpc
import pytest

import lethe.client as lc
from lethe.client import AsyncClient, ErrorReason
from lethe.v1 import common_pb2, memories_pb2

_T = TypeVar("_T")


class Api(Protocol):
    target: str
    admin: str
    limited: str
    limited_owner: str
    owner: str

    @property
    def parent(self) -> str: ...


def _run(api: Api, body: Callable[[AsyncClient], Awaitable[_T]], token: str = "") -> _T:
    async def main() -> _T:
        async with AsyncClient(api.target, token or api.admin) as client:
            return await body(client)

    return asyncio.run(main())


def test_round_trip_and_typed_errors(api: Api) -> None:
    parent = api.parent

    async def body(c: AsyncClient) -> None:
        await c.wait_ready(timeout=5)
        thread = await c.create_thread(parent, thread_id="t1")
        turns = (
            await c.append_turns(
                thread.name, [{"role": "USER", "text": "the cat is named Miso", "commit": True}]
            )
        ).turns
        assert (turns[0].seq, turns[0].state) == (1, common_pb2.COMMITTED)
        hits = (await c.search(parent, query_text="Miso", mode="LEXICAL")).hits
        assert [h.turn.name for h in hits] == [turns[0].name]
        receipt = await c.forget([turns[0].name])
        assert list(receipt.targets) == [turns[0].name]
        with pytest.raises(lc.RecordDeleted) as err:
            await c.get_turn(turns[0].name)
        assert err.value.reason == ErrorReason.RECORD_DELETED
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(lc.BadField) as bad:
            await c.create_thread(parent, thread_id="No Good")
        assert bad.value.fields == ["thread_id"]
        with pytest.raises(lc.AlreadyExists):
            await c.create_thread(parent, thread_id="t1")

    _run(api, body)


def test_a_token_for_another_owner_is_refused(api: Api) -> None:
    async def body(c: AsyncClient) -> None:
        with pytest.raises(lc.OwnerNotAllowed):
            await c.list_threads(api.parent)
        await c.list_threads(f"owners/{api.limited_owner}")

    _run(api, body, token=api.limited)


def test_async_iterators_walk_every_page(api: Api) -> None:
    parent = api.parent

    async def body(c: AsyncClient) -> list[list[str]]:
        for i in range(4):
            await c.create_thread(parent, thread_id=f"t{i}")
        await c.append_turns(
            f"{parent}/threads/t0", [{"role": "USER", "text": f"n{i}"} for i in range(5)]
        )
        for i in range(3):
            await c.create_memory(parent, {"kind": "ANNOTATION", "text": f"m{i}"})
        await c.forget([f"{parent}/threads/t3"])
        threads = [t.name async for t in c.iter_threads(parent, page_size=3)]
        turns = [t.text async for t in c.iter_turns(f"{parent}/threads/t0", page_size=2)]
        memories = sorted([m.text async for m in c.iter_memories(parent, page_size=2)])
        deletions = [r.name async for r in c.iter_deletions(parent, page_size=1)]
        return [threads, turns, memories, deletions]

    threads, turns, memories, deletions = _run(api, body)
    assert threads == [f"{parent}/threads/t{i}" for i in range(3)]
    assert turns == [f"n{i}" for i in range(5)]
    assert memories == ["m0", "m1", "m2"]
    assert len(deletions) == 1


def test_async_watch_follows_and_resumes(api: Api) -> None:
    parent = api.parent

    async def body(c: AsyncClient) -> None:
        thread = (await c.create_thread(parent)).name
        first = (
            await c.append_turns(thread, [{"role": "USER", "text": "x", "commit": True}])
        ).turns[0]
        await c.forget([first.name])
        async with c.watch(parent, types=["RECORD_DELETED"], timeout=10) as stream:
            event = await stream.__anext__()
            assert (event.subject, stream.last_id) == (first.name, event.id)
        quiet = c.watch(parent, after=event.id, timeout=0.5)
        with pytest.raises(lc.DeadlineExceeded):
            async for _ in quiet:
                pass
        endless = c.watch(parent, after=event.id)
        asyncio.get_running_loop().call_later(0.3, lambda: asyncio.ensure_future(endless.close()))
        assert [e async for e in endless] == []

    _run(api, body)


def test_unreachable_server_is_unavailable() -> None:
    async def main() -> None:
        async with AsyncClient("127.0.0.1:1", "lethe_x", retry=None) as c:
            with pytest.raises(lc.Unavailable):
                await c.wait_ready(timeout=0.2)
            with pytest.raises(lc.Unavailable):
                await c.get_thread("owners/a/threads/b", timeout=2)

    asyncio.run(main())


def test_batch_update_memories_takes_messages_and_mappings(api: Api) -> None:
    parent = api.parent

    async def body(c: AsyncClient) -> None:
        made = await c.create_memory(
            parent, {"kind": "FACT", "text": "likes tea", "state": "COMMITTED"}, memory_id="a"
        )
        as_message = memories_pb2.UpdateMemoryRequest(
            memory=memories_pb2.Memory(name=made.name, text="likes coffee"),
            expected_version=1,
        )
        as_mapping = {
            "memory": {"name": f"{parent}/memories/b", "kind": "GOAL", "text": "learn the oud"},
            "allow_missing": True,
            "retention": 3600,
        }
        got = await c.batch_update_memories(parent, [as_message, as_mapping])
        assert [(m.name, m.version, m.text) for m in got] == [
            (made.name, 2, "likes coffee"),
            (f"{parent}/memories/b", 1, "learn the oud"),
        ]
        assert got[1].HasField("expire_time")
        with pytest.raises(lc.VersionMismatch) as err:
            await c.batch_update_memories(parent, [as_message])
        assert err.value.message.startswith("requests[0]:")

    _run(api, body)
