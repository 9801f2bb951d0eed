"""``lethe.client.Client`` against a real server: every RPC, typed errors, pages, the event stream.

One method per RPC, fields as keyword arguments (dicts for nested messages,
enum names, datetimes), typed errors by code and reason, page iterators and the
event stream.

Portable: it needs only the ``api`` fixture, ``lethe`` and ``grpc``, so
``test_light_client.py`` runs it again in the light client's own venv.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Protocol

import grpc
import pytest

import lethe.client as lc
from lethe.client import Client, ErrorReason
from lethe.v1 import common_pb2, memories_pb2, threads_pb2


class Api(Protocol):
    """The ``api`` fixture (``tests/conftest.py``, or ``light_conftest.py`` in the light venv)."""

    target: str
    admin: str
    limited: str
    limited_owner: str
    owner: str

    @property
    def parent(self) -> str: ...


def _client(api: Api, token: str | None = None) -> Client:
    return Client(api.target, token or api.admin)


def test_thread_turns_search_and_forget_round_trip(api: Api) -> None:
    parent = api.parent
    with _client(api) as c:
        thread = c.create_thread(parent, thread_id="t1", title="first")
        assert (thread.name, thread.title) == (f"{parent}/threads/t1", "first")
        said = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
        appended = c.append_turns(
            thread.name,
            [
                {
                    "role": "USER",
                    "text": "I adopted a puppy named Biscuit",
                    "commit": True,
                    "time": said,
                    "speaker": "Ann",
                },
                threads_pb2.TurnInput(role=common_pb2.USER, text="it rains", pending_ttl=None),
            ],
            echo_text=True,
        )
        first, second = appended.turns
        assert (first.seq, first.state, first.speaker) == (1, common_pb2.COMMITTED, "Ann")
        assert first.text == "I adopted a puppy named Biscuit"
        assert first.time.ToDatetime(tzinfo=dt.UTC) == said
        assert second.state == common_pb2.PENDING
        hits = c.search(parent, query_text="puppy Biscuit", mode="LEXICAL").hits
        assert [h.turn.name for h in hits] == [first.name]
        assert c.get_turn(first.name).text == "I adopted a puppy named Biscuit"
        receipt = c.forget([first.name], reason="test")
        assert list(receipt.targets) == [first.name]
        with pytest.raises(lc.RecordDeleted) as err:
            c.get_turn(first.name)
        assert err.value.reason == ErrorReason.RECORD_DELETED
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert isinstance(err.value, lc.NotFound)
        assert isinstance(err.value, grpc.RpcError)
        assert c.search(parent, query_text="puppy Biscuit", mode="LEXICAL").hits == []


def test_errors_carry_code_reason_and_fields(api: Api) -> None:
    parent = api.parent
    with _client(api) as c:
        with pytest.raises(lc.BadField) as bad:
            c.create_thread(parent, thread_id="Not An Id")
        assert (bad.value.code(), bad.value.reason_name, bad.value.fields) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "BAD_FIELD",
            ["thread_id"],
        )
        assert bad.value.field_violations[0].description
        with pytest.raises(lc.NotFound) as missing:
            c.get_thread(f"{parent}/threads/nope")
        assert type(missing.value) is lc.NotFound
        assert missing.value.reason == ErrorReason.NOT_FOUND
        c.create_thread(parent, thread_id="dup")
        with pytest.raises(lc.AlreadyExists):
            c.create_thread(parent, thread_id="dup")
    with Client(api.target, api.limited) as limited:
        with pytest.raises(lc.OwnerNotAllowed) as denied:
            limited.list_threads(parent)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with Client(api.target, "lethe_not-a-token") as stranger, pytest.raises(lc.InvalidToken):
        stranger.list_threads(parent)


def test_memories_versions_and_preconditions(api: Api) -> None:
    parent = api.parent
    with _client(api) as c:
        thread = c.create_thread(parent, thread_id="t")
        turn = c.append_turns(thread.name, [{"role": "USER", "text": "I moved to Lyon"}]).turns[0]
        fact = c.create_memory(
            parent,
            {
                "kind": "FACT",
                "text": "lives in Lyon",
                "sources": [{"name": turn.name, "version": turn.version}],
            },
            memory_id="home",
        )
        assert (fact.name, fact.version, fact.state) == (
            f"{parent}/memories/home",
            1,
            common_pb2.PENDING,
        )
        with pytest.raises(lc.SourcePending) as pending:
            c.commit([fact.name])
        assert pending.value.subject == turn.name
        committed = c.commit([fact.name], include_sources=True).committed
        assert {r.name for r in committed} == {fact.name, turn.name}
        fixed = c.update_memory(
            {"name": fact.name, "text": "lives in Lyon, France"},
            update_mask=["text"],
            expected_version=1,
        )
        assert (fixed.version, fixed.text) == (2, "lives in Lyon, France")
        with pytest.raises(lc.VersionMismatch):
            c.update_memory(
                {"name": fact.name, "text": "x"}, update_mask=["text"], expected_version=1
            )
        old = c.get_memory(fact.name, version=1)
        assert old.status == memories_pb2.Memory.SUPERSEDED
        with pytest.raises(lc.IllegalTransition):
            c.transition_memory(fact.name, status="ACHIEVED")
        c.forget([turn.name])
        with pytest.raises(lc.RecordDeleted):
            c.get_memory(fact.name)
        with pytest.raises(lc.SourceDeleted) as gone:
            c.create_memory(
                parent,
                {"kind": "SUMMARY", "text": "s", "sources": [{"name": turn.name, "version": 1}]},
            )
        assert gone.value.subject == turn.name


def test_iterators_walk_every_page(api: Api) -> None:
    parent = api.parent
    with _client(api) as c:
        for i in range(5):
            c.create_thread(parent, thread_id=f"t{i}")
        assert [t.name.rsplit("/", 1)[1] for t in c.iter_threads(parent, page_size=2)] == [
            f"t{i}" for i in range(5)
        ]
        first = c.list_threads(parent, page_size=2)
        assert len(first.threads) == 2
        assert first.next_page_token
        texts = [f"turn {i}" for i in range(7)]
        c.append_turns(f"{parent}/threads/t0", [{"role": "USER", "text": t} for t in texts])
        assert [t.text for t in c.iter_turns(f"{parent}/threads/t0", page_size=3)] == texts
        for i in range(3):
            c.create_memory(parent, {"kind": "ANNOTATION", "text": f"note {i}"}, memory_id=f"m{i}")
        assert [m.text for m in c.iter_memories(parent, page_size=2)] == [
            "note 0",
            "note 1",
            "note 2",
        ]
        c.forget([f"{parent}/threads/t1"])
        c.forget([f"{parent}/memories/m1"])
        assert len(list(c.iter_deletions(parent, page_size=1))) == 2


def test_append_turns_sends_a_request_id_and_a_given_one_is_idempotent(api: Api) -> None:
    parent = api.parent
    with _client(api) as c:
        thread = c.create_thread(parent).name
        once = c.append_turns(thread, [{"role": "USER", "text": "hello"}], request_id="r-1")
        again = c.append_turns(thread, [{"role": "USER", "text": "hello"}], request_id="r-1")
        assert [t.name for t in again.turns] == [t.name for t in once.turns]
        c.append_turns(thread, [{"role": "USER", "text": "hello"}])
        c.append_turns(thread, [{"role": "USER", "text": "hello"}])
        assert [t.seq for t in c.iter_turns(thread)] == [1, 2, 3]
    assert lc.new_request_id() != lc.new_request_id()


def test_build_refuses_unknown_fields_and_names(api: Api) -> None:
    with _client(api) as c:
        with pytest.raises(TypeError, match="no field"):
            c.append_turns(f"{api.parent}/threads/t", [{"role": "USER", "txt": "typo"}])
        with pytest.raises(ValueError, match="not a value of Role"):
            c.append_turns(f"{api.parent}/threads/t", [{"role": "KING", "text": "x"}])
        with pytest.raises(TypeError, match="expected a list"):
            c.forget("owners/x/threads/t")


def test_context_lineage_audit_and_repairs(api: Api) -> None:
    parent = api.parent
    with _client(api) as c:
        thread = c.create_thread(parent).name
        turns = c.append_turns(
            thread,
            [
                {"role": "USER", "text": f"line {i} about gardening", "commit": True}
                for i in range(1, 5)
            ],
        ).turns
        bundle = c.assemble_context(thread, query_text="gardening")
        assert bundle.manifest.name.startswith(f"{parent}/manifests/")
        assert c.get_context_manifest(bundle.manifest.name).name == bundle.manifest.name
        summary = c.create_memory(
            parent,
            {
                "kind": "SUMMARY",
                "text": "gardening",
                "state": "COMMITTED",
                "sources": [{"name": t.name, "version": 1} for t in turns[:2]],
            },
        )
        edges = c.get_lineage(turns[0].name, direction="DESCENDANTS").edges
        assert [e.derivative.name for e in edges] == [summary.name]
        report = c.audit(parent)
        assert (report.orphans, report.records_without_key) == (0, 0)
        repair = c.seal_repair(thread, from_seq=3)
        assert repair.repair.state == threads_pb2.RepairInfo.PAUSED
        with pytest.raises(lc.Sealed):
            c.get_turn(turns[2].name)
        reopened = c.reopen_repair(repair.name)
        assert [t.text for t in reopened.turns][:2] == [
            "line 3 about gardening",
            "line 4 about gardening",
        ]
        c.pause_repair(repair.name)
        done = c.conclude_repair(repair.name, outcome="DESTROY")
        assert done.repair.repair.state == threads_pb2.RepairInfo.CONCLUDED
        with pytest.raises(lc.NotFound):
            c.get_turn(turns[2].name)


def test_watch_yields_events_in_order_and_resumes_after(api: Api) -> None:
    parent = api.parent
    with _client(api) as c:
        thread = c.create_thread(parent).name
        first = c.append_turns(thread, [{"role": "USER", "text": "a", "commit": True}]).turns[0]
        c.forget([first.name])
        with c.watch(parent, types=["RECORD_DELETED"], timeout=10) as stream:
            event = next(stream)
            assert (event.subject, stream.last_id) == (first.name, event.id)
        second = c.append_turns(thread, [{"role": "USER", "text": "b", "commit": True}]).turns[0]
        c.forget([second.name])
        with c.watch(parent, types=["RECORD_DELETED"], after=event.id, timeout=10) as stream:
            assert next(stream).subject == second.name
        quiet = c.watch(parent, after="999999", timeout=0.5)
        with quiet, pytest.raises(lc.DeadlineExceeded):
            list(quiet)


def test_watch_close_from_another_thread_ends_iteration(api: Api) -> None:
    with _client(api) as c:
        stream = c.watch(api.parent)
        threading.Timer(0.3, stream.close).start()
        start = time.monotonic()
        assert list(stream) == []
        assert time.monotonic() - start < 5


def test_wait_ready_and_deadlines(api: Api) -> None:
    with _client(api) as c:
        c.wait_ready(timeout=5)
    with Client("127.0.0.1:1", "lethe_x", retry=None) as dead:
        with pytest.raises(lc.Unavailable):
            dead.wait_ready(timeout=0.2)
        with pytest.raises(lc.Unavailable):
            dead.get_thread("owners/a/threads/b", timeout=2)
