"""``BatchUpdateMemories``: up to 1000 ``UpdateMemory`` requests of one owner, all or none.

On a real server: creates and updates mixed in one call (``allow_missing``
creating, with ``retention``), in one write op of the writer; one refused
request (checked by the service or refused in the store's transaction)
writes nothing, leaves no key behind, and is named (``requests[i]``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import Lethe

import lethe.client as lc
from lethe.v1 import common_pb2, events_pb2, memories_pb2

PARENT = "owners/alice"


def _name(memory_id: str) -> str:
    return f"{PARENT}/memories/{memory_id}"


def _upsert(memory_id: str, text: str, **kw: Any) -> dict[str, Any]:
    memory = {"name": _name(memory_id), "kind": "FACT", "text": text, "state": "COMMITTED"}
    return {"memory": memory, "update_mask": ["text"], "allow_missing": True, **kw}


def _fields(err: pytest.ExceptionInfo[lc.BadField]) -> list[str]:
    return [v.field for v in err.value.field_violations]


def _nothing_left_behind(c: lc.Client) -> None:
    report = c.audit(PARENT)
    assert (report.keys_without_record, report.records_without_key) == (0, 0)


def test_a_batch_creates_and_updates_in_one_write_op(lethe: Lethe) -> None:
    c = lethe.client("alice")
    c.create_memory(
        PARENT, {"kind": "FACT", "text": "likes tea", "state": "COMMITTED"}, memory_id="a"
    )
    c.batch_update_memories(PARENT, [_upsert("a", "likes tea", update_mask=["metadata"])])
    assert lethe.server is not None
    writer = lethe.server.store.writer
    ops = writer.ops  # the owner's slot key and first-use rows exist now
    got = c.batch_update_memories(
        PARENT,
        [
            _upsert("a", "likes coffee", retention=60),
            _upsert("b", "owns a bicycle", retention=3600),
            {
                "memory": {"name": _name("c"), "kind": "GOAL", "text": "run a marathon"},
                "allow_missing": True,
            },
        ],
    )
    assert writer.ops - ops == 1  # one op of the writer: one keystore and one data transaction
    assert [(m.name, m.version, m.text) for m in got] == [
        (_name("a"), 3, "likes coffee"),
        (_name("b"), 1, "owns a bicycle"),
        (_name("c"), 1, "run a marathon"),
    ]
    assert got[0].create_time != got[0].update_time  # updated
    assert not got[0].HasField("expire_time")  # retention applies only to a creation
    assert got[1].create_time == got[1].update_time  # created
    assert got[1].expire_time.seconds - got[1].create_time.seconds == pytest.approx(3600, abs=1)
    assert got[2].state == common_pb2.PENDING  # no state asked: a candidate
    assert c.get_memory(_name("a"), version=2).status == memories_pb2.Memory.SUPERSEDED
    assert c.get_memory(_name("b")).text == "owns a bicycle"
    hits = c.search(PARENT, query_text="owns a bicycle", kinds=["FACT"]).hits
    assert [h.memory.name for h in hits][:1] == [_name("b")]  # indexed as single writes are
    hits = c.search(PARENT, query_text="likes coffee", kinds=["FACT"]).hits
    assert [h.memory.name for h in hits][:1] == [_name("a")]
    _nothing_left_behind(c)


def test_a_bad_field_in_one_request_writes_nothing_and_names_it(lethe: Lethe) -> None:
    c = lethe.client("alice")
    with pytest.raises(lc.BadField) as err:
        c.batch_update_memories(
            PARENT, [_upsert("x", "fine"), _upsert("y", "fine too"), _upsert("z", "   ")]
        )
    assert _fields(err) == ["requests[2].memory.text"]
    for memory_id in ("x", "y", "z"):
        with pytest.raises(lc.NotFound):
            c.get_memory(_name(memory_id))


def test_a_version_mismatch_refuses_the_whole_batch_and_leaves_no_key(lethe: Lethe) -> None:
    c = lethe.client("alice")
    c.create_memory(PARENT, {"kind": "FACT", "text": "v1", "state": "COMMITTED"}, memory_id="a")
    with pytest.raises(lc.VersionMismatch) as err:
        c.batch_update_memories(
            PARENT, [_upsert("new", "created?"), _upsert("a", "v2", expected_version=7)]
        )
    assert err.value.message.startswith("requests[1]:")
    with pytest.raises(lc.NotFound):
        c.get_memory(_name("new"))  # the first request was rolled back with the second
    assert c.get_memory(_name("a")).version == 1
    _nothing_left_behind(c)
    got = c.batch_update_memories(PARENT, [_upsert("a", "v2", expected_version=1)])
    assert (got[0].version, got[0].text) == (2, "v2")


def test_without_allow_missing_a_missing_memory_is_not_found(lethe: Lethe) -> None:
    c = lethe.client("alice")
    c.create_memory(PARENT, {"kind": "FACT", "text": "here", "state": "COMMITTED"}, memory_id="a")
    request = {"memory": {"name": _name("gone"), "text": "t"}, "update_mask": ["text"]}
    with pytest.raises(lc.NotFound) as err:
        c.batch_update_memories(
            PARENT,
            [{"memory": {"name": _name("a"), "text": "t2"}, "update_mask": ["text"]}, request],
        )
    assert err.value.message.startswith("requests[1]:")
    assert c.get_memory(_name("a")).text == "here"
    with pytest.raises(lc.NotFound):  # an etag on a missing memory, with allow_missing
        c.batch_update_memories(PARENT, [_upsert("gone", "t", expected_version=1)])


def test_a_name_twice_is_a_bad_field(lethe: Lethe) -> None:
    c = lethe.client("alice")
    with pytest.raises(lc.BadField) as err:
        c.batch_update_memories(PARENT, [_upsert("a", "one"), _upsert("a", "two")])
    assert _fields(err) == ["requests[1].memory.name"]
    with pytest.raises(lc.NotFound):
        c.get_memory(_name("a"))


def test_more_than_1000_requests_or_none_is_a_bad_field(lethe: Lethe) -> None:
    c = lethe.client("alice")
    with pytest.raises(lc.BadField) as err:
        c.batch_update_memories(PARENT, [_upsert(f"m{i}", "t") for i in range(1001)])
    assert _fields(err) == ["requests"]
    with pytest.raises(lc.BadField) as err:
        c.batch_update_memories(PARENT, [])
    assert _fields(err) == ["requests"]
    assert list(c.iter_memories(PARENT)) == []


def test_another_owners_name_is_a_bad_field(lethe: Lethe) -> None:
    c = lethe.client("alice")
    intruder = _upsert("x", "t")
    intruder["memory"]["name"] = "owners/bob/memories/x"
    with pytest.raises(lc.BadField) as err:
        c.batch_update_memories(PARENT, [_upsert("a", "t"), intruder])
    assert _fields(err) == ["requests[1].memory.name"]
    assert list(c.iter_memories(PARENT)) == []


def test_another_kind_in_a_batch_is_a_bad_field_naming_the_request(lethe: Lethe) -> None:
    c = lethe.client("alice")
    c.create_memory(PARENT, {"kind": "ANNOTATION", "text": "a note"}, memory_id="n")
    with pytest.raises(lc.BadField) as err:
        c.batch_update_memories(PARENT, [_upsert("fresh", "t"), _upsert("n", "t")])
    assert _fields(err) == ["requests[1].memory.kind"]
    assert [m.name for m in c.iter_memories(PARENT)] == [_name("n")]
    _nothing_left_behind(c)


def test_an_expired_memory_not_yet_swept_is_record_deleted_and_nothing_is_written(
    lethe: Lethe,
) -> None:
    c = lethe.client("alice")
    (made,) = c.batch_update_memories(PARENT, [_upsert("e", "short-lived", retention=1.0)])
    time.sleep(max(0.0, made.expire_time.ToNanoseconds() / 1e9 - time.time()) + 0.05)
    with pytest.raises(lc.RecordDeleted) as err:
        c.batch_update_memories(PARENT, [_upsert("other", "t"), _upsert("e", "back")])
    assert err.value.message.startswith("requests[1]:")
    with pytest.raises(lc.NotFound):
        c.get_memory(_name("other"))
    assert lethe.server is not None
    assert lethe.server.lifecycle.sweep() == 1  # forgotten: the id is free again
    (back,) = c.batch_update_memories(PARENT, [_upsert("e", "back")])
    assert (back.version, back.text, back.create_time == back.update_time) == (2, "back", True)


def test_a_slot_conflict_refuses_the_batch_and_announces_the_holder(lethe: Lethe) -> None:
    c = lethe.client("alice")
    holder = c.create_memory(
        PARENT, {"kind": "FACT", "text": "guests: 40", "slot": "guests", "state": "COMMITTED"}
    )
    clash = _upsert("s2", "guests: 50")
    clash["memory"]["slot"] = "guests"
    with pytest.raises(lc.SlotConflict) as err:
        c.batch_update_memories(PARENT, [_upsert("s1", "unrelated"), clash])
    assert err.value.message.startswith("requests[1]:")
    assert err.value.subject == holder.name
    assert [m.name for m in c.iter_memories(PARENT)] == [holder.name]
    got: list[events_pb2.Event] = []
    with pytest.raises(lc.DeadlineExceeded):
        got.extend(c.watch(PARENT, types=["SLOT_CONFLICT"], timeout=1.0))
    assert [e.subject for e in got] == [holder.name]
    _nothing_left_behind(c)
