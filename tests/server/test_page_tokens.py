"""Page tokens are opaque (AIP-158): bound to the request, authenticated, or refused by name.

Tokens are bound to the method and to every request field but ``page_size``,
authenticated under a key of the server process, so a forged, altered or
reused-elsewhere token answers INVALID_ARGUMENT / BAD_FIELD naming
``page_token``; a client may change ``page_size`` between pages.
"""

from __future__ import annotations

import base64
import copy
import json
import pickle

import pytest
from _helpers import append, create_thread, expect_bad_field, forget
from conftest import Client, Lethe

from lethe.v1 import common_pb2, lifecycle_pb2, memories_pb2, threads_pb2
from server.errors import InvalidArgument
from server.services._pages import PageTokens


def _turns_token(c: Client, thread: str, **fields: object) -> str:
    req = threads_pb2.ListTurnsRequest(parent=thread, page_size=1, **fields)  # type: ignore[arg-type]
    token = c.threads.ListTurns(req, metadata=c.md).next_page_token
    assert token
    return token


@pytest.fixture
def alice(lethe: Lethe) -> tuple[Client, str]:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", thread_id="t")
    append(c, thread, ["one", "two", "three"], commit=True)
    return c, thread


def test_a_token_reads_as_no_json_and_no_parent(alice: tuple[Client, str]) -> None:
    c, thread = alice
    token = _turns_token(c, thread)
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    assert b"owners" not in raw
    # The MAC is random bytes and may hold a "{": the token must not *be* JSON.
    assert not raw.startswith(b"{")
    with pytest.raises((UnicodeDecodeError, json.JSONDecodeError)):
        json.loads(raw)
    assert len(token) < 64


def test_page_size_may_change_between_pages(alice: tuple[Client, str]) -> None:
    c, thread = alice
    token = _turns_token(c, thread)
    resp = c.threads.ListTurns(
        threads_pb2.ListTurnsRequest(parent=thread, page_size=5, page_token=token), metadata=c.md
    )
    assert [t.text for t in resp.turns] == ["two", "three"]
    assert resp.next_page_token == ""


def test_a_token_with_other_filters_is_bad_field(alice: tuple[Client, str]) -> None:
    c, thread = alice
    token = _turns_token(c, thread, states=[common_pb2.COMMITTED])
    for other in (
        threads_pb2.ListTurnsRequest(parent=thread, page_token=token),
        threads_pb2.ListTurnsRequest(
            parent=thread, page_token=token, states=[common_pb2.COMMITTED], include_tainted=True
        ),
        threads_pb2.ListTurnsRequest(
            parent=thread, page_token=token, states=[common_pb2.COMMITTED], view=common_pb2.FULL
        ),
    ):
        expect_bad_field(c.threads.ListTurns, other, c.md, "page_token")
    same = threads_pb2.ListTurnsRequest(
        parent=thread, page_token=token, states=[common_pb2.COMMITTED]
    )
    assert [t.text for t in c.threads.ListTurns(same, metadata=c.md).turns] == ["two", "three"]


def test_a_token_of_another_method_with_the_same_parent_is_bad_field(lethe: Lethe) -> None:
    c = lethe.client("alice")
    for tid in ("a", "b"):
        create_thread(c, "alice", thread_id=tid)
    forget(c, "owners/alice/threads/a")
    create_thread(c, "alice", thread_id="a")
    forget(c, "owners/alice/threads/a")
    threads_token = c.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent="owners/alice", page_size=0), metadata=c.md
    ).next_page_token
    deletions_token = c.lifecycle.ListDeletions(
        lifecycle_pb2.ListDeletionsRequest(parent="owners/alice", page_size=1), metadata=c.md
    ).next_page_token
    assert deletions_token
    assert not threads_token
    expect_bad_field(
        c.threads.ListThreads,
        threads_pb2.ListThreadsRequest(parent="owners/alice", page_token=deletions_token),
        c.md,
        "page_token",
    )
    expect_bad_field(
        c.memories.ListMemories,
        memories_pb2.ListMemoriesRequest(parent="owners/alice", page_token=deletions_token),
        c.md,
        "page_token",
    )
    resumed = c.lifecycle.ListDeletions(
        lifecycle_pb2.ListDeletionsRequest(parent="owners/alice", page_token=deletions_token),
        metadata=c.md,
    )
    assert len(resumed.receipts) == 1


def test_a_token_built_by_the_client_is_bad_field(alice: tuple[Client, str]) -> None:
    """The tokens were base64 JSON ``{"p": parent, "a": after}``; a client cannot build one now.

    A client could build one for any position of a listing; now it cannot.
    """
    c, thread = alice
    forged = base64.urlsafe_b64encode(json.dumps({"p": thread, "a": "1"}).encode()).decode()
    for token in (forged, forged.rstrip("=")):
        req = threads_pb2.ListTurnsRequest(parent=thread, page_token=token)
        expect_bad_field(c.threads.ListTurns, req, c.md, "page_token")


def test_an_altered_token_is_bad_field(alice: tuple[Client, str]) -> None:
    c, thread = alice
    token = _turns_token(c, thread)
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    raw[1] ^= 0x01  # the cursor: "1" -> "0"
    altered = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    for bad in (altered, token[:-2], token + "A", token + "=", "A" * 2000):
        req = threads_pb2.ListTurnsRequest(parent=thread, page_token=bad)
        expect_bad_field(c.threads.ListTurns, req, c.md, "page_token")


def test_a_token_does_not_survive_a_restart(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", thread_id="t")
    append(c, thread, ["one", "two"], commit=True)
    token = _turns_token(c, thread)
    lethe.restart()
    c = lethe.client("alice")
    req = threads_pb2.ListTurnsRequest(parent=thread, page_token=token)
    expect_bad_field(c.threads.ListTurns, req, c.md, "page_token")
    first = c.threads.ListTurns(threads_pb2.ListTurnsRequest(parent=thread), metadata=c.md)
    assert [t.text for t in first.turns] == ["one", "two"]


def test_page_tokens_of_two_holders_do_not_mix() -> None:
    req = threads_pb2.ListThreadsRequest(parent="owners/alice")
    one, two = PageTokens("100/1000"), PageTokens("100/1000")
    token = one.issue(req, "t1")
    assert one.resume(threads_pb2.ListThreadsRequest(parent="owners/alice", page_token=token)) == (
        "t1"
    )
    with pytest.raises(InvalidArgument) as info:
        two.resume(threads_pb2.ListThreadsRequest(parent="owners/alice", page_token=token))
    assert info.value.field == "page_token"
    other_policy = PageTokens("100/500")
    assert one.issue(req, "") == ""
    with pytest.raises(InvalidArgument):
        other_policy.resume(threads_pb2.ListThreadsRequest(parent="owners/alice", page_token=token))


def test_page_tokens_refuse_pickling_copying_and_show_no_key() -> None:
    tokens = PageTokens("100/1000")
    assert repr(tokens) == "<PageTokens>"
    with pytest.raises(TypeError):
        pickle.dumps(tokens)
    with pytest.raises(TypeError):
        copy.copy(tokens)
    with pytest.raises(TypeError):
        copy.deepcopy(tokens)
