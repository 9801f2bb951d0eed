"""``ListMemoriesRequest.order_by``: id order, or creation order (record-number order).

Creation order is the order the server created the memories in: an update
keeps a memory's place, a memory created again after its forget comes last,
the owner's turns (in the same ``owner_records`` table) are skipped, and the
page token is bound to ``order_by`` like every other field.
"""

from __future__ import annotations

import pytest
from _helpers import append, create_thread, expect_bad_field, forget
from conftest import Client, Lethe

from lethe.v1 import memories_pb2
from server.services import _common

PARENT = "owners/alice"


def _create(c: Client, memory_id: str, kind: str = "FACT", commit: bool = True) -> None:
    memory = {"kind": kind, "text": f"the text of {memory_id}"}
    if commit:
        memory["state"] = "COMMITTED"
    c.create_memory(PARENT, memory, memory_id=memory_id)


def _ids(
    c: Client, order_by: str = "create_time", kinds: tuple[str, ...] = ("FACT", "GOAL")
) -> list[str]:
    return [
        m.name.rsplit("/", 1)[-1] for m in c.iter_memories(PARENT, order_by=order_by, kinds=kinds)
    ]


def _paged(c: Client, sizes: list[int], order_by: str = "create_time") -> list[str]:
    """Ids of every page, the page size taken from ``sizes`` in turn (the last repeats)."""
    out: list[str] = []
    token = ""
    for i in range(100):
        page = c.list_memories(
            PARENT,
            kinds=["FACT", "GOAL"],
            order_by=order_by,
            page_size=sizes[min(i, len(sizes) - 1)],
            page_token=token,
        )
        out += [m.name.rsplit("/", 1)[-1] for m in page.memories]
        token = page.next_page_token
        if not token:
            return out
    raise AssertionError("the listing did not end")


@pytest.fixture
def c(lethe: Lethe) -> Client:
    return lethe.client("alice")


def test_create_time_lists_in_creation_order_and_name_in_id_order(c: Client) -> None:
    for memory_id in ("m5", "m1", "m4", "m2", "m3"):
        _create(c, memory_id)
    assert _ids(c) == ["m5", "m1", "m4", "m2", "m3"]
    assert _ids(c, order_by="") == ["m1", "m2", "m3", "m4", "m5"]
    assert _ids(c, order_by="name") == ["m1", "m2", "m3", "m4", "m5"]


def test_an_update_keeps_its_place_in_creation_order(c: Client) -> None:
    for memory_id in ("m3", "m1", "m2"):
        _create(c, memory_id)
    updated = c.update_memory(
        {"name": f"{PARENT}/memories/m3", "text": "corrected"}, update_mask=["text"]
    )
    assert updated.version == 2
    c.update_memory(
        {"name": f"{PARENT}/memories/m1", "kind": "FACT", "text": "upserted"},
        update_mask=["text"],
        allow_missing=True,
    )
    assert _ids(c) == ["m3", "m1", "m2"]
    assert [m.text for m in c.iter_memories(PARENT, order_by="create_time")][:2] == [
        "corrected",
        "upserted",
    ]


def test_a_memory_created_again_after_its_forget_comes_last(c: Client) -> None:
    for memory_id in ("m3", "m1", "m2"):
        _create(c, memory_id)
    forget(c, f"{PARENT}/memories/m3")
    assert _ids(c) == ["m1", "m2"]
    _create(c, "m3")
    assert _ids(c) == ["m1", "m2", "m3"]


def test_turns_of_the_owner_are_skipped_between_memories(c: Client) -> None:
    thread = create_thread(c, "alice", thread_id="t")
    expected = []
    for i in range(4):
        append(c, thread, [f"turn {i} {j}" for j in range(30)], commit=True)
        memory_id = f"m{9 - i}"
        _create(c, memory_id)
        expected.append(memory_id)
    append(c, thread, [f"last turn {j}" for j in range(30)], commit=True)
    assert _ids(c) == expected
    assert _paged(c, [1]) == expected
    assert _ids(c, order_by="name") == sorted(expected)


def test_pages_by_token_give_the_whole_listing_once(c: Client) -> None:
    created = [f"m{n:02d}" for n in (7, 3, 11, 1, 9, 5, 10, 2, 8, 4, 6)]
    for memory_id in created:
        _create(c, memory_id)
    assert _paged(c, [2]) == created
    assert _paged(c, [1, 3, 5]) == created  # page_size may change between pages
    assert _paged(c, [4], order_by="name") == sorted(created)


def test_filters_apply_in_creation_order(c: Client) -> None:
    _create(c, "g2", kind="GOAL")
    _create(c, "f9")
    _create(c, "p1", commit=False)
    _create(c, "f1")
    assert _ids(c, kinds=("FACT",)) == ["f9", "p1", "f1"]
    got = c.list_memories(PARENT, order_by="create_time", states=["COMMITTED"], page_size=1)
    assert [m.name.rsplit("/", 1)[-1] for m in got.memories] == ["g2"]
    rest = c.list_memories(
        PARENT,
        order_by="create_time",
        states=["COMMITTED"],
        page_size=10,
        page_token=got.next_page_token,
    )
    assert [m.name.rsplit("/", 1)[-1] for m in rest.memories] == ["f9", "f1"]
    assert rest.next_page_token == ""


def test_an_unknown_order_by_is_bad_field(c: Client) -> None:
    _create(c, "m1")
    for order_by in ("create_time desc", "update_time", "CREATE_TIME", "id"):
        expect_bad_field(
            c.memories.ListMemories,
            memories_pb2.ListMemoriesRequest(parent=PARENT, order_by=order_by),
            c.md,
            "order_by",
        )


def test_a_token_of_another_order_by_is_bad_field(c: Client) -> None:
    for memory_id in ("m3", "m1", "m2"):
        _create(c, memory_id)
    by_creation = c.list_memories(PARENT, order_by="create_time", page_size=1).next_page_token
    by_id = c.list_memories(PARENT, page_size=1).next_page_token
    assert by_creation
    assert by_id
    for order_by, token in (("", by_creation), ("name", by_creation), ("create_time", by_id)):
        expect_bad_field(
            c.memories.ListMemories,
            memories_pb2.ListMemoriesRequest(parent=PARENT, order_by=order_by, page_token=token),
            c.md,
            "page_token",
        )
    resumed = c.list_memories(PARENT, order_by="create_time", page_token=by_creation)
    assert [m.name.rsplit("/", 1)[-1] for m in resumed.memories] == ["m1", "m2"]


def test_a_page_cut_by_the_reply_budget_resumes_after_its_last_memory(
    c: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = [f"m{n}" for n in (6, 2, 5, 1, 4, 3)]
    for memory_id in created:
        c.create_memory(
            PARENT,
            {"kind": "FACT", "text": f"{memory_id} " + "x" * 3000, "state": "COMMITTED"},
            memory_id=memory_id,
        )
    monkeypatch.setattr(_common, "MAX_REPLY_BYTES", 7000)  # room for two 3 KB memories
    first = c.list_memories(PARENT, order_by="create_time", page_size=100)
    assert [m.name.rsplit("/", 1)[-1] for m in first.memories] == ["m6", "m2"]
    assert _paged(c, [100]) == created
