"""``UpdateMemory`` with ``allow_missing``: create or update in one call (AIP-134).

On a real server: a missing memory is created under the caller's name (its
kind, sources, metadata, state and retention as ``CreateMemory`` takes them),
an existing one updated as without ``allow_missing``; an etag on a missing
memory is ``NOT_FOUND``; a deleted memory whose deletion is not complete is
``RECORD_DELETED``, never created over.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from _connect import ConnectChannel
from conftest import Lethe
from google.protobuf import json_format

import lethe.client as lc
from lethe.v1 import common_pb2, memories_pb2

NAME = "owners/alice/memories/up"


def _upsert(
    c: lc.Client, text: str, memory: dict[str, Any] | None = None, **kw: Any
) -> memories_pb2.Memory:
    whole = {"name": NAME, "kind": "FACT", "text": text, "state": "COMMITTED", **(memory or {})}
    return c.update_memory(whole, allow_missing=True, **kw)


def test_allow_missing_creates_a_missing_memory_under_the_callers_name(lethe: Lethe) -> None:
    c = lethe.client("alice")
    src = c.create_memory(
        "owners/alice", {"kind": "FACT", "text": "a source", "state": "COMMITTED"}, memory_id="s"
    )
    made = _upsert(
        c,
        "likes tea",
        memory={"metadata": {"k": "v"}, "sources": [{"name": src.name, "version": 1}]},
        retention=3600,
    )
    assert (made.name, made.version, made.text) == (NAME, 1, "likes tea")
    assert made.state == common_pb2.COMMITTED
    assert made.create_time == made.update_time  # created, not updated
    assert json_format.MessageToDict(made.metadata) == {"k": "v"}
    assert [(s.name, s.version) for s in made.sources] == [(src.name, 1)]
    assert made.HasField("expire_time")
    assert made.expire_time.seconds - made.create_time.seconds == pytest.approx(3600, abs=1)
    assert c.get_memory(NAME).text == "likes tea"
    hits = c.search("owners/alice", query_text="likes tea", kinds=["FACT"]).hits
    assert [h.memory.name for h in hits][:1] == [NAME]


def test_allow_missing_updates_an_existing_memory_as_an_update_does(lethe: Lethe) -> None:
    c = lethe.client("alice")
    c.create_memory(
        "owners/alice",
        {"kind": "FACT", "text": "likes tea", "state": "COMMITTED", "metadata": {"v": 1}},
        memory_id="up",
    )
    got = _upsert(c, "likes coffee", update_mask=["text"], retention=60)
    assert (got.version, got.text) == (2, "likes coffee")
    assert got.create_time != got.update_time
    assert json_format.MessageToDict(got.metadata) == {"v": 1.0}  # not in the mask: kept
    assert not got.HasField("expire_time")  # retention applies only to a creation
    assert c.get_memory(NAME, version=1).status == memories_pb2.Memory.SUPERSEDED
    with pytest.raises(lc.VersionMismatch):
        _upsert(c, "again", expected_version=1)
    assert _upsert(c, "again", expected_version=2).version == 3


def test_allow_missing_with_another_kind_is_a_bad_field(lethe: Lethe) -> None:
    c = lethe.client("alice")
    c.create_memory("owners/alice", {"kind": "ANNOTATION", "text": "a"}, memory_id="up")
    with pytest.raises(lc.BadField) as err:
        _upsert(c, "b")
    assert err.value.fields == ["memory.kind"]
    with pytest.raises(lc.BadField) as err:  # a creation needs its kind
        c.update_memory({"name": "owners/alice/memories/new", "text": "x"}, allow_missing=True)
    assert err.value.fields == ["memory.kind"]
    assert c.get_memory(NAME).version == 1


def test_an_etag_on_a_missing_memory_is_not_found(lethe: Lethe) -> None:
    c = lethe.client("alice")
    with pytest.raises(lc.NotFound) as err:
        _upsert(c, "x", expected_version=1)
    assert not isinstance(err.value, lc.RecordDeleted)
    with pytest.raises(lc.NotFound):
        c.get_memory(NAME)


def test_retention_without_allow_missing_is_a_bad_field(lethe: Lethe) -> None:
    c = lethe.client("alice")
    c.create_memory("owners/alice", {"kind": "FACT", "text": "a"}, memory_id="up")
    with pytest.raises(lc.BadField) as err:
        c.update_memory({"name": NAME, "text": "b"}, retention=60)
    assert err.value.fields == ["retention"]


def test_allow_missing_recreates_a_forgotten_id_with_its_versions_numbering_on(
    lethe: Lethe,
) -> None:
    c = lethe.client("alice")
    _upsert(c, "first")
    _upsert(c, "second")
    c.forget([NAME], echoes="IGNORE")
    again = _upsert(c, "third")
    assert (again.version, again.text, again.create_time == again.update_time) == (
        3,
        "third",
        True,
    )
    assert c.get_memory(NAME).text == "third"


def test_an_expired_memory_not_yet_swept_is_record_deleted_not_created_over(
    lethe: Lethe,
) -> None:
    c = lethe.client("alice")
    made = _upsert(c, "short-lived", retention=1.0)
    time.sleep(max(0.0, made.expire_time.ToNanoseconds() / 1e9 - time.time()) + 0.05)
    with pytest.raises(lc.RecordDeleted):
        _upsert(c, "back")
    assert lethe.server is not None
    assert lethe.server.lifecycle.sweep() == 1  # forgotten: the id is free again
    back = _upsert(c, "back")
    assert (back.version, back.text) == (2, "back")


def test_concurrent_upserts_of_a_missing_id_create_it_once(lethe: Lethe) -> None:
    c = lethe.client("alice")
    results: list[int] = []
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results.append(_upsert(c, f"writer {i}").version)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == list(range(1, 9))  # one creation, seven updates
    assert c.get_memory(NAME).version == 8


def test_allow_missing_over_connect_json_creates_then_updates(lethe: Lethe) -> None:
    """The Connect listener reads ``allowMissing`` and ``retention`` from JSON as gRPC does."""
    channel = ConnectChannel(f"127.0.0.1:{lethe.http_port}")
    auth = [("authorization", f"Bearer {lethe.token('alice')}")]
    path = "/lethe.v1.Memories/UpdateMemory"
    memory = {"name": NAME, "kind": "FACT", "text": "likes tea", "state": "COMMITTED"}
    body = {"memory": memory, "allowMissing": True, "retention": "3600s"}
    status, _, raw = channel.post(path, json.dumps(body).encode(), "application/json", auth)
    made = json.loads(raw)
    assert (status, made["name"], made["version"]) == (200, NAME, "1")
    assert made["createTime"] == made["updateTime"]
    assert "expireTime" in made
    body = {"memory": {**memory, "text": "likes coffee"}, "allowMissing": True}
    status, _, raw = channel.post(path, json.dumps(body).encode(), "application/json", auth)
    got = json.loads(raw)
    assert (status, got["version"], got["text"]) == (200, "2", "likes coffee")


def test_upserts_racing_forgets_of_the_id_answer_only_record_deleted(lethe: Lethe) -> None:
    """An upsert racing a ``Forget`` of its id lands, or answers ``RECORD_DELETED``.

    Before the fix an upsert answered ``ALREADY_EXISTS``: its create found the
    id taken, and the purge freed it before the upsert looked again.
    """
    c = lethe.client("alice")
    errors: list[BaseException] = []
    landed: list[int] = []

    def upsert(i: int) -> None:
        for n in range(40):
            try:
                _upsert(c, f"writer {i} round {n}")
                landed.append(i)
            except lc.RecordDeleted:
                pass  # a deletion not complete yet: the documented answer
            except BaseException as exc:
                errors.append(exc)

    def forget() -> None:
        for _ in range(40):
            try:
                c.forget([NAME], echoes="IGNORE")
            except lc.NotFound:
                pass  # nothing to forget right now
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=upsert, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=forget) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert landed  # some upserts landed between the forgets
    assert _upsert(c, "last").text == "last"
