"""``LetheStore.search`` without a query reads creation-ordered pages and stops early.

Against a real server: the items come back in ``InMemoryStore``'s order for
the same single puts in one namespace (insertion order, an update keeping its
place, a key deleted and put again last), and the listing asks the server for
pages of 32 (or twice ``offset + limit``) memories, each next one 4 times
larger, only until ``offset + limit`` items matched: a filter matching early
items reads one page, one matching late items or nothing reads them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import Lethe
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

import lethe.client as lc
from lethe.langgraph import LetheStore

NS = ("bench", "items")
ITEMS = 200


def _value(i: int) -> dict[str, Any]:
    return {"n": i, "color": "red" if i % 5 == 0 else "blue", "late": i >= ITEMS - 4}


class _Pages:
    """The page sizes of every ``ListMemories`` call a store's client sends (the real calls)."""

    def __init__(self, client: lc.Client) -> None:
        self.sizes: list[int] = []
        self.after_first: Callable[[], None] | None = None  # runs once, between two pages
        self._list = client.list_memories

        def counted(*args: Any, **kwargs: Any) -> Any:
            assert kwargs["order_by"] == "create_time"
            if self.sizes and self.after_first is not None:
                hook, self.after_first = self.after_first, None
                hook()
            self.sizes.append(kwargs["page_size"])
            return self._list(*args, **kwargs)

        client.list_memories = counted  # type: ignore[method-assign]


@pytest.fixture
def stores(lethe: Lethe) -> tuple[LetheStore, InMemoryStore, _Pages]:
    client = lethe.client(admin=True)
    store, ref = LetheStore(client, owner="alice"), InMemoryStore()
    for i in range(ITEMS):
        for s in (store, ref):
            s.put(NS, f"k{i:03d}", _value(i))
    return store, ref, _Pages(client)


def _keys(store: BaseStore, prefix: tuple[str, ...] = NS, **kw: Any) -> list[str]:
    return [i.key for i in store.search(prefix, **kw)]


def test_a_filter_matching_early_items_reads_one_page(
    stores: tuple[LetheStore, InMemoryStore, _Pages],
) -> None:
    store, ref, pages = stores
    got = _keys(store, filter={"color": "red"}, limit=5)
    assert got == [f"k{i:03d}" for i in (0, 5, 10, 15, 20)]
    assert got == _keys(ref, filter={"color": "red"}, limit=5)
    assert pages.sizes == [32]


def test_more_matches_than_a_page_read_growing_pages(
    stores: tuple[LetheStore, InMemoryStore, _Pages],
) -> None:
    store, ref, pages = stores
    got = _keys(store, limit=50)
    assert got == [f"k{i:03d}" for i in range(50)] == _keys(ref, limit=50)
    assert pages.sizes == [100]  # twice offset + limit
    pages.sizes.clear()
    got = _keys(store, filter={"color": "red"}, limit=10, offset=25)
    assert got == [f"k{i:03d}" for i in range(125, 175, 5)]
    assert got == _keys(ref, filter={"color": "red"}, limit=10, offset=25)
    # 70 items hold 14 red ones, one in five: the other 21 need 105 more, asked twice over.
    assert pages.sizes == [70, 210]


def test_the_next_page_follows_the_match_rate(
    stores: tuple[LetheStore, InMemoryStore, _Pages],
) -> None:
    store, ref, pages = stores
    got = _keys(store, filter={"color": "red"}, limit=10)  # the benchmark's search
    assert got == [f"k{i:03d}" for i in range(0, 50, 5)] == _keys(ref, filter={"color": "red"})
    assert pages.sizes == [32, 32]  # 7 in the first 32; 3 more need about 14, at least 32


def test_a_filter_matching_late_items_or_none_reads_every_page(
    stores: tuple[LetheStore, InMemoryStore, _Pages],
) -> None:
    store, ref, pages = stores
    got = _keys(store, filter={"late": True}, limit=3)
    assert got == ["k196", "k197", "k198"] == _keys(ref, filter={"late": True}, limit=3)
    assert pages.sizes == [32, 128, 512]
    pages.sizes.clear()
    assert _keys(store, filter={"color": "violet"}) == [] == _keys(ref, filter={"color": "violet"})
    assert pages.sizes == [32, 128, 512]
    pages.sizes.clear()
    assert _keys(store, ("other",)) == []
    assert pages.sizes == [32, 128, 512]
    pages.sizes.clear()
    assert _keys(store, limit=0) == [] == _keys(ref, limit=0)
    assert pages.sizes == []


def test_updates_keep_their_place_and_a_key_put_again_comes_last(
    stores: tuple[LetheStore, InMemoryStore, _Pages],
) -> None:
    store, ref, _ = stores
    for s in (store, ref):
        s.put(NS, "k001", {"n": -1, "color": "red"})  # an update: keeps its place
        s.delete(NS, "k000")
        s.put(NS, "k000", {"n": 0, "color": "red"})  # created again: last
        s.put(("other",), "o", {"color": "red"})
    want = [(i.key, i.value) for i in ref.search(NS, filter={"color": "red"}, limit=100)]
    got = [(i.key, i.value) for i in store.search(NS, filter={"color": "red"}, limit=100)]
    assert got == want
    assert got[0] == ("k001", {"n": -1, "color": "red"})
    assert got[-1] == ("k000", {"n": 0, "color": "red"})
    assert [i.key for i in store.search((), filter={"color": "red"}, limit=100)][-2:] == [
        "k000",
        "o",
    ]


def test_a_key_deleted_and_put_again_between_pages_is_listed_once(
    stores: tuple[LetheStore, InMemoryStore, _Pages],
) -> None:
    store, _, pages = stores

    def again() -> None:  # after the first page listed k000: it comes again at the end
        store.delete(NS, "k000")
        store.put(NS, "k000", {"n": 0, "color": "violet"})

    pages.after_first = again
    got = store.search(NS, filter={"n": 0}, limit=10)
    assert pages.sizes == [32, 128, 512]  # one match of 10: every page, the new k000 last
    assert [(i.key, i.value) for i in got] == [("k000", _value(0))]  # its first listing
    assert [i.value for i in store.search(NS, filter={"n": 0})] == [{"n": 0, "color": "violet"}]
