"""``lethe.langgraph.LetheStore`` against a real server, differentially against ``InMemoryStore``.

LangGraph's ``InMemoryStore`` runs the same randomised sequence of operations
and their observable results must agree wherever the documented mapping says so
(``lethe/langgraph.py``, "The mapping"); each documented difference is tested
as a difference below.

What is compared, step by step:

- ``put`` / ``delete`` / ``batch`` of several ops: the same results (None for writes);
- ``get``: the same item (namespace, key, value) or both None;
- ``search`` without a query: the same items in the same order when the
  prefix selects one namespace; across namespaces, the same items in Lethe's
  documented order (oldest first), against a model of creation order;
- ``search`` with a query: every hit is an item ``InMemoryStore`` also
  matches (prefix and filter) with the same value, at most ``limit``, scores
  non-increasing; with ``limit`` covering every candidate, the same set;
- ``list_namespaces``: what ``InMemoryStore`` answers for the live items
  (a fresh ``InMemoryStore`` holding exactly them), which is what the original
  answers minus namespaces that only held deleted items or were only read.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from conftest import Lethe
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

import lethe.client as lc
from lethe.langgraph import LetheStore

NAMESPACES = [("a",), ("a", "b"), ("a", "c"), ("d",), ("a", "b", "e")]
KEYS = ["k1", "k2", "Key With Spaces", "ключ"]
WORDS = ["apple", "banana", "cherry", "dolphin", "eagle"]
PREFIXES = [(), ("a",), ("a", "b"), ("d",), ("a", "b", "e"), ("z",)]
FILTERS: list[dict[str, Any] | None] = [
    None,
    {"color": "red"},
    {"n": {"$gt": 2}},
    {"nested": {"x": 1}},
    {"n": {"$ne": 3}, "color": "blue"},
]

values = st.fixed_dictionaries(
    {
        "text": st.sampled_from(WORDS).map(lambda w: f"a note about {w}"),
        "n": st.integers(0, 5),
        "color": st.sampled_from(["red", "blue"]),
        "nested": st.fixed_dictionaries({"x": st.integers(0, 2)}),
        "tags": st.lists(st.sampled_from(["t1", "t2"]), max_size=2),
    }
)
puts = st.builds(
    lambda ns, key, value: PutOp(ns, key, value),
    st.sampled_from(NAMESPACES),
    st.sampled_from(KEYS),
    values,
)
deletes = st.builds(
    lambda ns, key: PutOp(ns, key, None), st.sampled_from(NAMESPACES), st.sampled_from(KEYS)
)
gets = st.builds(GetOp, st.sampled_from(NAMESPACES), st.sampled_from(KEYS))
filters = st.one_of(st.just(None), st.sampled_from(FILTERS))
prefixes = st.one_of(st.sampled_from([(), ("a",)]), st.sampled_from(PREFIXES))
listings = st.builds(
    lambda flt, limit, offset, prefix: SearchOp(prefix, flt, limit, offset, None),
    filters,
    st.integers(1, 6),
    st.one_of(st.just(0), st.integers(0, 3)),
    prefixes,
)
queries = st.builds(
    lambda word, flt, limit, prefix: SearchOp(prefix, flt, limit, 0, word),
    st.sampled_from(WORDS),
    st.sampled_from(FILTERS[:2]),
    st.sampled_from([2, 50]),
    st.sampled_from(PREFIXES[:4]),
)


def _conditions(prefix: tuple[str, ...], suffix: tuple[str, ...]) -> tuple[MatchCondition, ...]:
    out = []
    if prefix:
        out.append(MatchCondition("prefix", prefix))
    if suffix:
        out.append(MatchCondition("suffix", suffix))
    return tuple(out)


namespace_listings = st.builds(
    lambda prefix, suffix, depth, limit, offset: ListNamespacesOp(
        _conditions(prefix, suffix), depth, limit, offset
    ),
    st.sampled_from([(), ("a",), ("a", "*"), ("d",)]),
    st.sampled_from([(), ("b",), ("*", "e")]),
    st.sampled_from([None, 1, 2]),
    st.sampled_from([2, 100]),
    st.sampled_from([0, 1]),
)
single = st.one_of(puts, puts, puts, deletes, gets, listings, queries, namespace_listings)
steps = st.one_of(
    single, st.lists(st.one_of(puts, deletes, gets, listings), min_size=2, max_size=4)
)


class Model:
    """The test's own record of creation order: (namespace, key) → the step that created it.

    The puts of one batch are sent concurrently, so they share their step:
    their order among themselves is not defined.
    """

    def __init__(self) -> None:
        self.born: dict[tuple[tuple[str, ...], str], int] = {}
        self.clock = 0

    def write(self, op: PutOp) -> None:
        where = (tuple(op.namespace), op.key)
        if op.value is None:
            self.born.pop(where, None)
        else:
            self.born.setdefault(where, self.clock)


def _view(item: Item | None) -> tuple[tuple[str, ...], str, dict[str, Any]] | None:
    return None if item is None else (item.namespace, item.key, item.value)


def _check_search(
    op: SearchOp, ref: InMemoryStore, model: Model, got: list[Any], want: list[Any]
) -> None:
    """``want`` is InMemoryStore's own answer to ``op``."""
    candidates = ref.search(op.namespace_prefix, filter=op.filter, limit=10**6)
    by_key = {(i.namespace, i.key): i.value for i in candidates}
    if op.query is None:
        ordered = sorted(candidates, key=lambda i: model.born[(i.namespace, i.key)])
        expected = ordered[op.offset : op.offset + op.limit]

        def born(items: list[Any]) -> list[int]:
            return [model.born[(i.namespace, i.key)] for i in items]

        # Oldest first; items born in one batch may come in any order among themselves.
        assert born(got) == born(expected)
        for item in got:
            assert by_key[(item.namespace, item.key)] == item.value
        assert len({(i.namespace, i.key) for i in got}) == len(got)
        if len({i.namespace for i in candidates}) <= 1:  # one namespace: InMemoryStore's order
            assert born(got) == born(want)
        return
    assert len(got) <= op.limit
    for item in got:
        assert by_key[(item.namespace, item.key)] == item.value
    scores = [i.score for i in got]
    assert scores == sorted(scores, reverse=True)
    if op.limit >= len(candidates):
        assert {(i.namespace, i.key) for i in got} == set(by_key)
    assert [i.score for i in want] == [None] * len(want)  # InMemoryStore ignores the query


def _check_namespaces(
    op: ListNamespacesOp, ref: InMemoryStore, got: list[Any], want: list[Any]
) -> None:
    live = ref.search((), limit=10**6)
    clean = InMemoryStore()
    for item in live:
        clean.put(item.namespace, item.key, item.value)
    assert got == clean.batch([op])[0]
    if op.offset == 0 and op.limit >= 100:
        assert set(got) <= set(want)  # InMemoryStore may list namespaces holding nothing


def _run(step: Op | list[Op], store: LetheStore, ref: InMemoryStore, model: Model) -> None:
    ops = step if isinstance(step, list) else [step]
    before = InMemoryStore()  # reads of a batch see the state before its writes
    for item in ref.search((), limit=10**6):
        before.put(item.namespace, item.key, item.value)
    got = store.batch(ops)
    want = ref.batch(ops)
    assert len(got) == len(want) == len(ops)
    for op, g, w in zip(ops, got, want, strict=True):
        kind = type(op).__name__ + ("(query)" if isinstance(op, SearchOp) and op.query else "")
        if isinstance(op, PutOp):
            kind = "PutOp(delete)" if op.value is None else "PutOp"
        event(f"{kind}: {'empty' if not g else 'found'}{' in a batch' if len(ops) > 1 else ''}")
        if isinstance(op, PutOp):
            assert g is None
            assert w is None
        elif isinstance(op, GetOp):
            assert _view(g) == _view(w)  # type: ignore[arg-type]
        elif isinstance(op, SearchOp):
            _check_search(op, before, model, g, w)  # type: ignore[arg-type]
        else:
            _check_namespaces(op, before, g, w)  # type: ignore[arg-type]
    model.clock += 1
    for op in {(tuple(o.namespace), o.key): o for o in ops if isinstance(o, PutOp)}.values():
        model.write(op)


@settings(
    max_examples=int(os.environ.get("LETHE_LANGGRAPH_EXAMPLES", "25")),
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=st.lists(steps, min_size=12, max_size=40))
def test_same_sequence_same_observations_as_in_memory_store(
    lethe: Lethe, sequence: list[Op | list[Op]]
) -> None:
    client = lethe.client(admin=True) if not lethe.clients else lethe.clients[0]
    store = LetheStore(client, owner=f"o{secrets.token_hex(6)}")
    ref, model = InMemoryStore(), Model()
    for step in sequence:
        _run(step, store, ref, model)


def unique(tag: str) -> str:
    return f"{tag}{secrets.token_hex(8)}"


def files_containing(root: Path, needles: list[str]) -> list[tuple[str, str]]:
    """(file, needle) for every file under ``root`` holding a needle in UTF-8."""
    return [
        (str(p), n)
        for p in sorted(root.rglob("*"))
        if p.is_file()
        for n in needles
        if n.encode() in p.read_bytes()
    ]


def _store(lethe: Lethe, **kw: Any) -> LetheStore:
    return LetheStore(lethe.client(admin=True), owner=kw.pop("owner", "alice"), **kw)


# -- the documented differences, as differences -------------------------------------


def test_created_at_survives_an_update_where_in_memory_store_resets_it(lethe: Lethe) -> None:
    store, ref = _store(lethe), InMemoryStore()
    for s in (store, ref):
        s.put(("ns",), "k", {"v": 1})
    first_lethe, first_ref = store.get(("ns",), "k"), ref.get(("ns",), "k")
    for s in (store, ref):
        s.put(("ns",), "k", {"v": 2})
    again_lethe, again_ref = store.get(("ns",), "k"), ref.get(("ns",), "k")
    assert first_lethe is not None
    assert again_lethe is not None
    assert first_ref is not None
    assert again_ref is not None
    assert again_lethe.value == again_ref.value == {"v": 2}
    assert again_lethe.created_at == first_lethe.created_at
    assert again_lethe.updated_at > first_lethe.updated_at
    assert again_ref.created_at > first_ref.created_at  # InMemoryStore: reset on every put
    assert again_lethe.created_at.tzinfo is not None


def test_values_travel_as_json(lethe: Lethe) -> None:
    store = _store(lethe)
    store.put(("ns",), "k", {"i": 2, "f": 2.5, "whole": 2.0, "t": (1, 2), "big": 2**60 + 1})
    item = store.get(("ns",), "k")
    assert item is not None
    assert item.value["i"] == 2
    assert type(item.value["i"]) is int
    assert item.value["f"] == 2.5
    assert item.value["whole"] == 2
    assert type(item.value["whole"]) is int
    assert item.value["t"] == [1, 2]  # was a tuple
    assert item.value["big"] != 2**60 + 1  # a double: precision lost beyond 2**53
    with pytest.raises(TypeError):
        store.put(("ns",), "b", {"raw": b"bytes"})
    with pytest.raises(ValueError, match=r"JSON|Out of range"):
        store.put(("ns",), "n", {"x": float("nan")})
    with pytest.raises(TypeError):
        store.put(("ns",), "d", {"when": dt.datetime.now(dt.UTC)})
    ref = InMemoryStore()
    ref.put(("ns",), "b", {"raw": b"bytes"})  # InMemoryStore keeps any Python object
    assert ref.get(("ns",), "b").value == {"raw": b"bytes"}  # type: ignore[union-attr]


def test_query_search_is_ranked_where_in_memory_store_ignores_the_query(lethe: Lethe) -> None:
    store, ref = _store(lethe), InMemoryStore()
    texts = ["the weather is mild", "my dog is called Biscuit", "tea with lemon"]
    for i, text in enumerate(texts):
        for s in (store, ref):
            s.put(("notes",), f"n{i}", {"text": text})
    got = store.search(("notes",), query="Biscuit the dog", limit=3)
    want = ref.search(("notes",), query="Biscuit the dog", limit=3)
    assert got[0].key == "n1"
    assert got[0].score is not None
    assert got[0].score >= (got[-1].score or 0.0)
    assert [i.key for i in want] == ["n0", "n1", "n2"]  # insertion order
    assert [i.score for i in want] == [None, None, None]


def test_search_across_namespaces_is_oldest_first(lethe: Lethe) -> None:
    store, ref = _store(lethe), InMemoryStore()
    for ns, key in ((("x", "1"), "a"), (("x", "2"), "b"), (("x", "1"), "c")):
        for s in (store, ref):
            s.put(ns, key, {"v": key})
    assert [i.key for i in store.search(("x",))] == ["a", "b", "c"]
    assert [i.key for i in ref.search(("x",))] == ["a", "c", "b"]  # grouped by namespace


def test_list_namespaces_lists_only_namespaces_holding_items(lethe: Lethe) -> None:
    store, ref = _store(lethe), InMemoryStore()
    for s in (store, ref):
        s.put(("kept",), "k", {"v": 1})
        s.put(("emptied",), "k", {"v": 1})
        s.delete(("emptied",), "k")
        s.get(("only", "read"), "k")
    assert store.list_namespaces() == [("kept",)]
    assert ref.list_namespaces() == [("emptied",), ("kept",), ("only", "read")]


def test_an_unindexed_item_is_kept_and_listed_but_no_query_finds_it(lethe: Lethe) -> None:
    client = lethe.client(admin=True)
    store, ref = LetheStore(client, owner="alice"), InMemoryStore()
    for s in (store, ref):
        s.put(("ns",), "hidden", {"text": "the zebra code"}, index=False)
        s.put(("ns",), "shown", {"text": "the zebra crossing"})
    assert store.get(("ns",), "hidden").value == {"text": "the zebra code"}  # type: ignore[union-attr]
    assert client.get_memory(store.memory_name(("ns",), "hidden")).text == "(unindexed)"
    assert [i.key for i in store.search(("ns",))] == [i.key for i in ref.search(("ns",))]
    assert [i.key for i in store.search(("ns",), query="zebra")] == ["shown"]


def _letters(texts: list[str]) -> list[list[float]]:
    """A tiny embedding: counts of a, b and c, and 1 (so no vector is zero)."""
    return [[float(t.count("a")), float(t.count("b")), float(t.count("c")), 1.0] for t in texts]


def test_an_index_with_embed_scores_by_cosine_similarity_as_in_memory_store(
    lethe: Lethe,
) -> None:
    index = {"dims": 4, "embed": _letters, "fields": ["text", "more"]}
    store = LetheStore(lethe.client(admin=True), owner="alice", index=index)
    ref = InMemoryStore(index=index)  # type: ignore[arg-type]
    values = {
        "a": {"text": "aaa"},
        "b": {"text": "bbb", "more": "aaa"},  # two vectors: the best one scores
        "c": {"text": "cab"},
        "n": {"text": "ccc"},
    }
    for s in (store, ref):
        for key, value in values.items():
            s.put(("ns",), key, value)
        s.put(("ns",), "plain", {"text": "aaaa"}, index=False)
    for query in ("aaa", "bc", "zzz"):
        for limit, offset in ((10, 0), (2, 1)):
            got = store.search(("ns",), query=query, limit=limit, offset=offset)
            want = ref.search(("ns",), query=query, limit=limit, offset=offset)
            assert [i.key for i in got] == [i.key for i in want]
            assert [i.score or 0.0 for i in got] == pytest.approx([i.score or 0 for i in want])
            assert [i.score is None for i in got] == [i.score is None for i in want]
    [top, *_] = store.search(("ns",), query="aaa")
    assert top.score == pytest.approx(1.0)  # an exact match, where the fused score was 0.39
    assert store.index_config is not None
    assert store.index_config["embed"] is _letters

    async def embed_async(texts: list[str]) -> list[list[float]]:
        return _letters(texts)

    asynced = LetheStore(
        lethe.client(admin=True), owner="bob", index={"dims": 4, "embed": embed_async}
    )

    async def scenario() -> list[Any]:
        await asynced.aput(("ns",), "k", {"text": "abc"})
        return await asynced.asearch(("ns",), query="abc")

    [hit] = asyncio.run(scenario())
    assert hit.score == pytest.approx(1.0)
    with pytest.raises(ValueError, match="embed"):
        LetheStore(lethe.client(admin=True), owner="alice", index={"dims": 3})


TTL_MINUTES = 0.025
"""1.5 s: how long the ttl tests' items live."""


def _expires(client: lc.Client, name: str) -> float:
    memory = client.get_memory(name)
    return memory.expire_time.ToNanoseconds() / 1e9 if memory.HasField("expire_time") else 0.0


def test_ttl_is_the_items_retention_gone_from_every_read_then_forgotten(lethe: Lethe) -> None:
    client = lethe.client(admin=True)
    store = LetheStore(client, owner="alice")
    store.put(("ns",), "brief", {"text": "the door code is 4821"}, ttl=TTL_MINUTES)
    store.put(("ns",), "kept", {"text": "likes the door painted blue"})
    name = store.memory_name(("ns",), "brief")
    assert _expires(client, name) == pytest.approx(dt.datetime.now().timestamp() + 1.5, abs=1.0)
    assert _expires(client, store.memory_name(("ns",), "kept")) == 0.0
    assert store.get(("ns",), "brief", refresh_ttl=False) is not None
    time.sleep(1.6)
    assert store.get(("ns",), "brief") is None  # no sweeper has run (the fixture runs none)
    assert [i.key for i in store.search(("ns",))] == ["kept"]
    assert [i.key for i in store.search(("ns",), query="door")] == ["kept"]
    assert store.list_namespaces() == [("ns",)]
    assert lethe.server is not None
    with pytest.raises(lc.RecordDeleted):  # its id is held until the sweeper forgets it
        store.put(("ns",), "brief", {"text": "the door code is 1234"})
    assert lethe.server.lifecycle.sweep() == 1
    [receipt] = list(client.iter_deletions("owners/alice"))
    assert (list(receipt.targets), receipt.reason) == ([name], "RETENTION")
    store.put(("ns",), "brief", {"text": "the door code is 1234"})
    assert store.get(("ns",), "brief").value == {"text": "the door code is 1234"}  # type: ignore[union-attr]


def test_a_read_refreshes_the_ttl_and_a_put_without_one_removes_it(lethe: Lethe) -> None:
    client = lethe.client(admin=True)
    store = LetheStore(client, owner="alice")
    store.put(("ns",), "k", {"v": 1}, ttl=10.0)
    name = store.memory_name(("ns",), "k")
    first = _expires(client, name)
    time.sleep(0.05)
    store.get(("ns",), "k", refresh_ttl=False)
    assert _expires(client, name) == first
    store.get(("ns",), "k")  # refresh_on_read is the default
    assert _expires(client, name) > first
    refreshed = _expires(client, name)
    time.sleep(0.05)
    store.search(("ns",))
    assert _expires(client, name) > refreshed
    store.put(("ns",), "k", {"v": 2})
    assert _expires(client, name) == 0.0  # as InMemoryStore: no ttl, no expiry
    assert store.get(("ns",), "k").value == {"v": 2}  # type: ignore[union-attr]


def test_the_stores_default_ttl_and_the_owners_default(lethe: Lethe) -> None:
    client = lethe.client(admin=True)
    store = LetheStore(client, owner="alice", ttl={"default_ttl": 10.0, "refresh_on_read": False})
    store.put(("ns",), "k", {"v": 1})
    name = store.memory_name(("ns",), "k")
    expires = _expires(client, name)
    assert expires == pytest.approx(dt.datetime.now().timestamp() + 600, abs=5)
    store.get(("ns",), "k")
    assert _expires(client, name) == expires  # no refresh on read
    plain = LetheStore(client, owner="bob")
    client.set_retention(["owners/bob"], ttl=3600)
    plain.put(("ns",), "k", {"v": 1})
    plain.put(("ns",), "k", {"v": 2})  # no ttl, but the owner's default is not this store's
    assert _expires(client, plain.memory_name(("ns",), "k")) > 0


def test_delete_is_a_forget_with_a_receipt_and_the_key_can_come_back(lethe: Lethe) -> None:
    client = lethe.client(admin=True)
    store = LetheStore(client, owner="alice")
    store.put(("ns",), "k", {"text": "remember the passport"})
    name = store.memory_name(("ns",), "k")
    assert client.get_memory(name).version == 1
    store.delete(("ns",), "k")
    assert store.get(("ns",), "k") is None
    with pytest.raises(lc.RecordDeleted):
        client.get_memory(name)
    receipts = list(client.iter_deletions("owners/alice"))
    assert [list(r.targets) for r in receipts] == [[name]]
    assert receipts[0].reason == "langgraph delete"
    assert store.search(("ns",), query="passport") == []
    store.delete(("ns",), "k")  # deleting again is a no-op, as in InMemoryStore
    store.put(("ns",), "k", {"text": "new"})
    assert client.get_memory(name).version == 2  # the id numbers on; never two contents
    assert store.get(("ns",), "k").value == {"text": "new"}  # type: ignore[union-attr]


def test_fields_choose_the_indexed_text(lethe: Lethe) -> None:
    client = lethe.client(admin=True)
    store = LetheStore(client, owner="alice", fields=["memory", "tags[*]"])
    store.put(("ns",), "k", {"memory": "likes sailing", "tags": ["boats"], "secret": "zebra"})
    memory = client.get_memory(store.memory_name(("ns",), "k"))
    assert memory.text == "likes sailing\nboats"
    assert [i.key for i in store.search(("ns",), query="sailing")] == ["k"]
    store.put(("ns",), "j", {"other": "x"}, index=["memory"])  # nothing there: the whole value
    assert client.get_memory(store.memory_name(("ns",), "j")).text == '{"other": "x"}'


def test_nothing_of_namespace_key_or_value_is_stored_in_plaintext(lethe: Lethe) -> None:
    store = _store(lethe, id_key=secrets.token_bytes(32))
    ns, key, value = unique("ns"), unique("key"), unique("val")
    store.put((ns, "x"), key, {"text": value})
    name = store.memory_name((ns, "x"), key)
    assert key not in name
    assert ns not in name
    assert store.get((ns, "x"), key).value == {"text": value}  # type: ignore[union-attr]
    lethe.stop()
    assert files_containing(lethe.data_dir, [ns, key, value]) == []


def test_id_key_addresses_other_ids(lethe: Lethe) -> None:
    client = lethe.client(admin=True)
    plain = LetheStore(client, owner="alice")
    keyed = LetheStore(client, owner="alice", id_key=b"k" * 32)
    assert plain.memory_name(("n",), "k") != keyed.memory_name(("n",), "k")
    plain.put(("n",), "k", {"v": 1})
    assert keyed.get(("n",), "k") is None
    assert keyed.search(("n",)) == []  # another key's items are not this store's
    with pytest.raises(ValueError, match="16 bytes"):
        LetheStore(client, owner="alice", id_key=b"short")


def test_without_an_owner_the_first_label_names_it(lethe: Lethe) -> None:
    token = lethe.token("alice", "bob")
    with LetheStore(target=f"127.0.0.1:{lethe.port}", token=token) as store:
        store.put(("alice", "prefs"), "k", {"v": "a"})
        store.put(("bob", "prefs"), "k", {"v": "b"})
        assert store.get(("alice", "prefs"), "k").value == {"v": "a"}  # type: ignore[union-attr]
        assert store.memory_name(("alice", "prefs"), "k").startswith("owners/alice/memories/lg-")
        assert [i.value for i in store.search(("bob",))] == [{"v": "b"}]
        assert store.list_namespaces(prefix=("alice",)) == [("alice", "prefs")]
        with pytest.raises(lc.OwnerNotAllowed):
            store.put(("carol", "prefs"), "k", {"v": "c"})
        with pytest.raises(InvalidNamespaceError):
            store.put(("Not An Id",), "k", {"v": 1})
        with pytest.raises(NotImplementedError, match="owner"):
            store.search(())
        with pytest.raises(NotImplementedError, match="owner"):
            store.list_namespaces(prefix=("*", "prefs"))
    # The namespace is kept whole in both modes: the same tuple, the same item.
    single = LetheStore(lethe.client(admin=True), owner="alice")
    assert single.get(("alice", "prefs"), "k").value == {"v": "a"}  # type: ignore[union-attr]


def test_abatch_and_the_async_methods(lethe: Lethe) -> None:
    store = _store(lethe)

    async def scenario() -> list[Any]:
        await store.aput(("ns",), "k", {"text": "async note"})
        got = await store.aget(("ns",), "k")
        found = await store.asearch(("ns",), query="note")
        await store.adelete(("ns",), "k")
        return [got, found, await store.aget(("ns",), "k"), await store.alist_namespaces()]

    got, found, gone, spaces = asyncio.run(scenario())
    assert got.value == {"text": "async note"}
    assert [i.key for i in found] == ["k"]
    assert (gone, spaces) == (None, [])


def test_a_token_not_allowed_for_the_owner_is_refused(lethe: Lethe) -> None:
    store = LetheStore(lethe.client("bob"), owner="alice")
    with pytest.raises(lc.OwnerNotAllowed) as err:
        store.put(("ns",), "k", {"v": 1})
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_value_over_the_limit_is_a_bad_field(lethe: Lethe) -> None:
    store = _store(lethe)
    with pytest.raises(lc.BadField) as err:
        store.put(("ns",), "k", {"text": "x" * 300_000})
    assert err.value.fields == ["memory.metadata"]


def test_constructor_refuses_what_it_cannot_serve(lethe: Lethe) -> None:
    client = lethe.client(admin=True)
    bad: list[Callable[[], object]] = [
        lambda: LetheStore(),
        lambda: LetheStore(client, target="x:1", token="t"),
        lambda: LetheStore(target="127.0.0.1:1"),
        lambda: LetheStore(client, owner="Alice"),
        lambda: LetheStore(client, owner="a", kind="POEM"),
    ]
    for make in bad:
        with pytest.raises(ValueError, match=r"client|token|owner|kind"):
            make()


# -- writes: calls, races, whole batches ----------------------------------------------


class CountingClient:
    """A real :class:`lethe.client.Client` that counts the RPC methods called on it."""

    def __init__(self, client: lc.Client) -> None:
        self.client = client
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted

    def take(self) -> dict[str, int]:
        """The counts since the last take."""
        out = dict(self.calls)
        self.calls.clear()
        return out


def _counting(lethe: Lethe, **kw: Any) -> tuple[LetheStore, CountingClient]:
    counting = CountingClient(lethe.client(admin=True))
    return LetheStore(cast(lc.Client, counting), owner="alice", **kw), counting


def test_a_put_is_one_call_whoever_wrote_the_key(lethe: Lethe) -> None:
    """Every put is one ``UpdateMemory`` with ``allow_missing``: new key, own key, or another's.

    Before the upsert a key another store instance wrote cost two calls
    (``CreateMemory`` refused ``ALREADY_EXISTS``, then ``UpdateMemory``).
    """
    store, calls = _counting(lethe)
    store.put(("ns",), "k", {"v": 1})
    assert calls.take() == {"update_memory": 1}  # a new key: created
    store.put(("ns",), "k", {"v": 2})
    assert calls.take() == {"update_memory": 1}  # a key this store has written
    other, other_calls = _counting(lethe)
    other.put(("ns",), "k", {"v": 3})  # a key another store instance wrote
    assert other_calls.take() == {"update_memory": 1}
    assert other.get(("ns",), "k").value == {"v": 3}  # type: ignore[union-attr]
    store.put(("ns",), "k", {"v": 4})
    assert store.get(("ns",), "k").value == {"v": 4}  # type: ignore[union-attr]
    calls.take()
    other_calls.take()
    other.delete(("ns",), "k")
    other.put(("ns",), "k", {"v": 5})  # deleted and purged: created again
    assert other_calls.take() == {"forget": 1, "update_memory": 1}
    store.delete(("ns",), "k")
    store.put(("ns",), "k", {"v": 6})
    assert calls.take() == {"forget": 1, "update_memory": 1}
    assert store.get(("ns",), "k").value == {"v": 6}  # type: ignore[union-attr]
    client = lethe.client(admin=True)
    memory = client.get_memory(store.memory_name(("ns",), "k"))
    assert (memory.version, memory.create_time == memory.update_time) == (6, True)


def test_a_put_of_a_key_another_instance_wrote_is_one_call(lethe: Lethe) -> None:
    writer, _ = _counting(lethe)
    writer.put(("shared",), "k", {"by": "writer"})
    reader, calls = _counting(lethe)  # a fresh instance, as another process: knows nothing
    reader.put(("shared",), "k", {"by": "reader"})
    assert calls.take() == {"update_memory": 1}
    got = writer.get(("shared",), "k")
    assert got is not None
    assert got.value == {"by": "reader"}
    client = lethe.client(admin=True)
    assert client.get_memory(writer.memory_name(("shared",), "k")).version == 2


def test_a_ttl_travels_in_the_one_call_that_creates_an_item(lethe: Lethe) -> None:
    """A creation carries its retention; only removing or setting one on an update costs more."""
    writer, writer_calls = _counting(lethe)
    writer.put(("shared",), "fresh", {"n": 1}, ttl=60)
    assert writer_calls.take() == {"update_memory": 1}
    client = lethe.client(admin=True)
    name = writer.memory_name(("shared",), "fresh")
    assert client.get_memory(name).HasField("expire_time")
    reader, calls = _counting(lethe)
    reader.put(("shared",), "fresh", {"n": 2})  # without ttl: the earlier ttl is removed
    assert calls.take() == {"update_memory": 1, "get_memory": 1, "set_retention": 1}
    assert not client.get_memory(name).HasField("expire_time")


def test_a_put_racing_a_delete_of_the_key_never_fails(lethe: Lethe) -> None:
    """Two stores, one putting and one deleting the same key, never see an error.

    Before the fix a put raised RecordDeleted here: update NOT_FOUND, create
    ALREADY_EXISTS (the delete's tombstone, not yet purged), then the update
    again, on the deleted memory.
    """
    client = lethe.client(admin=True)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        store = LetheStore(client, owner="alice")  # its own hints, as a separate process
        try:
            for n in range(60):
                if i % 2:
                    store.delete(("race",), "k")
                else:
                    store.put(("race",), "k", {"n": n, "writer": i})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store = LetheStore(client, owner="alice")
    store.put(("race",), "k", {"n": "last"})
    assert store.get(("race",), "k").value == {"n": "last"}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (PutOp(("ok", "bad.label"), "k", {"v": 1}), InvalidNamespaceError),
        (PutOp((), "k", {"v": 1}), InvalidNamespaceError),
        (PutOp(("ok",), "k", {"v": float("nan")}), ValueError),
        (PutOp(("ok",), "k", {"v": b"bytes"}), TypeError),
        (PutOp(("ok",), "k", {"v": 1}, ttl=-1.0), ValueError),
        (PutOp(("ok",), 5, {"v": 1}), TypeError),  # type: ignore[arg-type]
        (SearchOp(("ok", ""), None, 10, 0, None), InvalidNamespaceError),
    ],
)
def test_a_batch_with_one_bad_op_writes_nothing(
    lethe: Lethe, bad: Op, error: type[Exception]
) -> None:
    store, calls = _counting(lethe)
    store.put(("ok",), "gone", {"v": 0})
    calls.take()
    ops: list[Op] = [PutOp(("ok",), f"k{i}", {"v": i}) for i in range(3)]
    ops += [PutOp(("ok",), "gone", None), bad, PutOp(("ok",), "after", {"v": 9})]
    with pytest.raises(error):
        store.batch(ops)
    assert calls.take() == {}  # not one call was sent
    assert [i.key for i in store.search(("ok",))] == ["gone"]


def test_a_batch_pipelines_its_calls_and_deletes_in_one_forget(lethe: Lethe) -> None:
    store, calls = _counting(lethe)
    store.batch([PutOp(("b",), f"k{i}", {"i": i}) for i in range(40)])
    assert calls.take() == {"batch_update_memories": 1}
    got = store.batch(
        [GetOp(("b",), f"k{i}") for i in range(5)]
        + [PutOp(("b",), f"k{i}", None) for i in range(5)]
        + [PutOp(("b",), f"k{i}", {"i": -i}) for i in range(5, 40)]
    )
    assert [g.value for g in got[:5]] == [{"i": i} for i in range(5)]  # type: ignore[union-attr]
    assert got[5:] == [None] * 40
    assert calls.take() == {"get_memory": 5, "forget": 1, "batch_update_memories": 1}
    client = lethe.client(admin=True)
    [receipt] = list(client.iter_deletions("owners/alice"))
    assert sorted(receipt.targets) == sorted(store.memory_name(("b",), f"k{i}") for i in range(5))
    assert sorted(i.value["i"] for i in store.search(("b",), limit=100)) == list(range(-39, -4))
    calls.take()
    # A Forget naming a gone item is refused whole: then one Forget per name.
    store.batch([PutOp(("b",), k, None) for k in ("k5", "k0", "k6")])
    assert calls.take() == {"forget": 1 + 3}
    assert len(list(client.iter_deletions("owners/alice"))) == 3
    assert store.get(("b",), "k5") is None
    assert store.get(("b",), "k6") is None


def _rpc_count(lethe: Lethe, method: str) -> float:
    """How many calls of ``Memories/method`` the server answered OK (its own metric)."""
    assert lethe.server is not None
    labels = {"method": f"/lethe.v1.Memories/{method}", "code": "OK"}
    value = lethe.server.metrics.registry.get_sample_value(
        "lethe_rpc_duration_seconds_count", labels
    )
    return value or 0.0


def test_a_batch_of_1000_puts_is_one_batch_call(lethe: Lethe) -> None:
    """Creates and updates mixed: one ``BatchUpdateMemories``, as the server counts it too."""
    store, calls = _counting(lethe)
    store.batch([PutOp(("m",), f"k{i}", {"i": i}) for i in range(0, 1000, 2)])
    calls.take()
    before = (_rpc_count(lethe, "BatchUpdateMemories"), _rpc_count(lethe, "UpdateMemory"))
    store.batch([PutOp(("m",), f"k{i}", {"i": -i}) for i in range(1000)])
    assert calls.take() == {"batch_update_memories": 1}
    after = (_rpc_count(lethe, "BatchUpdateMemories"), _rpc_count(lethe, "UpdateMemory"))
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)
    got = store.batch([GetOp(("m",), f"k{i}") for i in (0, 1, 998, 999)])
    assert [g.value["i"] for g in got] == [0, -1, -998, -999]  # type: ignore[union-attr]
    client = lethe.client(admin=True)
    assert client.get_memory(store.memory_name(("m",), "k2")).version == 2  # updated
    assert client.get_memory(store.memory_name(("m",), "k3")).version == 1  # created


def test_a_key_written_twice_in_a_batch_keeps_the_place_of_its_first_write(
    lethe: Lethe,
) -> None:
    """As ``InMemoryStore``: the last write of a key wins, in the place of its first.

    The bug (found by a probe): the key took the place of its last write, so a
    search without a query listed ``[k2, k1]`` where ``InMemoryStore`` lists
    ``[k1, k2]``.
    """
    store = LetheStore(lethe.client(admin=True), owner="alice")
    memory = InMemoryStore()
    for ops in (
        [
            PutOp(("a",), "k1", {"v": 1}),
            PutOp(("a",), "k2", {"v": 2}),
            PutOp(("a",), "k1", {"v": 3}),
        ],
        [
            PutOp(("b",), "k1", {"v": 1}),
            PutOp(("b",), "k2", {"v": 2}),
            PutOp(("b",), "k1", None),
            PutOp(("b",), "k1", {"v": 4}),
        ],
    ):
        store.batch(ops)
        memory.batch(ops)
        ns = ops[0].namespace
        got = [(i.key, i.value) for i in store.search(ns)]
        assert got == [(i.key, i.value) for i in memory.search(ns)]
        assert got[0][0] == "k1"


def test_a_batch_is_chunked_by_owner_count_and_bytes(
    lethe: Lethe, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lethe.langgraph as lg

    counting = CountingClient(lethe.client(admin=True))
    store = LetheStore(cast(lc.Client, counting), owner=None)
    monkeypatch.setattr(lg, "MAX_BATCH_REQUESTS", 10)
    store.batch(
        [PutOp(("alice", "n"), f"k{i}", {"i": i}) for i in range(25)]
        + [PutOp(("bob", "n"), f"k{i}", {"i": i}) for i in range(3)]
    )
    assert counting.take() == {"batch_update_memories": 3 + 1}  # 10, 10, 5 for alice; 3 for bob
    monkeypatch.setattr(lg, "MAX_BATCH_BYTES", 4000)  # 3 of these puts (about 1.3 kB each)
    store.batch([PutOp(("alice", "big"), f"k{i}", {"t": "x" * 600}) for i in range(9)])
    assert counting.take() == {"batch_update_memories": 3}
    assert len(store.search(("alice",), limit=100)) == 25 + 9
    assert len(store.search(("bob",), limit=100)) == 3
    # An owner's chunks go one after another: created, and listed, in the batch's order.
    listed = store.search(("alice", "n"), limit=100)
    assert [item.key for item in listed] == [f"k{i}" for i in range(25)]


def test_a_batch_sets_the_ttl_of_updates_once_per_distinct_ttl(lethe: Lethe) -> None:
    store, calls = _counting(lethe)
    store.batch([PutOp(("t",), f"k{i}", {"i": i}) for i in range(6)])
    calls.take()
    store.batch(
        [PutOp(("t",), f"k{i}", {"i": i}, ttl=60) for i in range(3)]
        + [PutOp(("t",), f"k{i}", {"i": i}, ttl=30) for i in range(3, 5)]
        + [PutOp(("t",), f"new{i}", {"i": i}, ttl=30) for i in range(4)]  # created with it
    )
    assert calls.take() == {"batch_update_memories": 1, "set_retention": 2}
    client = lethe.client(admin=True)
    for key, minutes in [("k0", 60), ("k4", 30), ("new3", 30), ("k5", 0)]:
        memory = client.get_memory(store.memory_name(("t",), key))
        if not minutes:
            assert not memory.HasField("expire_time")
            continue
        left = memory.expire_time.seconds - time.time()
        assert minutes * 60 - 10 < left <= minutes * 60, key


def test_a_chunk_refused_for_one_put_is_sent_put_by_put(lethe: Lethe) -> None:
    """The other puts land and the refused one raises, as when each put was its own call."""
    store, calls = _counting(lethe)
    big = {"text": "x" * (300 * 1024)}  # over Lethe's 256 KiB of metadata: BadField
    ops = [PutOp(("r",), f"k{i}", {"i": i}) for i in range(4)] + [PutOp(("r",), "big", big)]
    with pytest.raises(lc.BadField):
        store.batch(ops)
    assert calls.take() == {"batch_update_memories": 1, "update_memory": 5}
    assert sorted(i.key for i in store.search(("r",), limit=10)) == ["k0", "k1", "k2", "k3"]


def test_a_dotted_filter_key_reaches_into_nested_values(lethe: Lethe) -> None:
    """As LangGraph's SQL stores read filter keys; a field named with the dots wins."""
    store = _store(lethe)
    store.put(("docs",), "hyphen", {"access-level": "public", "user": {"access-level": "nested"}})
    store.put(("docs",), "dotted", {"user.access-level": "literal"})
    assert [i.key for i in store.search(("docs",), filter={"access-level": "public"})] == ["hyphen"]
    found = store.search(("docs",), filter={"user.access-level": "nested"})
    assert [i.key for i in found] == ["hyphen"]
    found = store.search(("docs",), filter={"user.access-level": "literal"})
    assert [i.key for i in found] == ["dotted"]
    assert store.search(("docs",), filter={"user.missing.deeper": "x"}) == []


def test_distance_type_scores_as_langgraphs_postgres_store(lethe: Lethe) -> None:
    """``inner_product``: the dot product; ``l2``: the negated Euclidean distance."""
    item, query = _letters(["aab"])[0], _letters(["bc"])[0]  # (2, 1, 0, 1), (0, 1, 1, 1)
    want = {
        "inner_product": 2.0,
        "l2": -((4.0 + 0 + 1 + 0) ** 0.5),
        "cosine": 2 / (6**0.5 * 3**0.5),
    }
    for distance, score in want.items():
        index = {"dims": 4, "embed": _letters, "distance_type": distance}
        store = LetheStore(
            lethe.client(admin=True), owner=f"o-{distance.replace('_', '-')}", index=index
        )
        store.put(("ns",), "k", {"text": "aab"})
        [hit] = store.search(("ns",), query="bc")
        assert hit.score == pytest.approx(score), (distance, item, query)
    with pytest.raises(ValueError, match="distance_type"):
        LetheStore(
            lethe.client(admin=True),
            owner="a",
            index={"dims": 4, "embed": _letters, "distance_type": "hamming"},
        )


def test_a_batch_beyond_the_servers_per_token_bound_waits_instead_of_failing(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    """A batch deeper than the token's bound on calls in flight still lands whole.

    The server refuses calls past ``max_inflight_per_principal`` before doing
    anything (``TooManyRequests``); before the fix the batch raised it.
    """
    server = lethe_at(tmp_path / "d", max_inflight_per_principal=2, max_running_per_principal=1)
    store = LetheStore(server.client(admin=True), owner="alice")
    store.batch([PutOp(("ns",), f"k{i}", {"i": i}) for i in range(60)])
    store.batch([PutOp(("ns",), f"k{i}", {"i": -i}) for i in range(60)])
    store.batch([PutOp(("ns",), f"k{i}", None) for i in range(0, 60, 2)])
    assert sorted(i.value["i"] for i in store.search(("ns",), limit=100)) == sorted(
        -i for i in range(1, 60, 2)
    )
