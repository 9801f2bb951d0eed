"""Authentication and authorisation: tokens, owner checks, admin, health, reflection.

Bearer tokens and owner checks before anything is read or written — over
gRPC and over Connect (the ``transport`` fixture: the same edge refuses the
same calls with the same reasons) —, admin tokens, health and reflection.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from _helpers import (
    append,
    create_thread,
    error_reason,
    expect_error,
    get_turn,
    list_texts,
    run_cli,
    search_texts,
    unique,
)
from conftest import Client, Lethe
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from lethe.v1 import common_pb2, lifecycle_pb2, retrieval_pb2, threads_pb2
from server import new_token, principal_record, token_digest
from server.errors import Unauthenticated

UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED

# (client, thread name, committed text, committed turn, pending turn)
AliceData = tuple[Client, str, str, threads_pb2.Turn, threads_pb2.Turn]


@pytest.fixture
def alice_data(lethe: Lethe) -> AliceData:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", thread_id="t")
    text = f"alice private {unique()}"
    (turn,) = append(c, thread, [text], commit=True)
    (pending,) = append(c, thread, [f"alice pending {unique()}"])
    return c, thread, text, turn, pending


def _requests(thread: str, turn: str, pending: str) -> list[tuple[str, str, object]]:
    return [
        ("threads", "GetThread", threads_pb2.GetThreadRequest(name=thread)),
        ("threads", "ListThreads", threads_pb2.ListThreadsRequest(parent="owners/alice")),
        ("threads", "CreateThread", threads_pb2.CreateThreadRequest(parent="owners/alice")),
        ("threads", "GetTurn", threads_pb2.GetTurnRequest(name=turn)),
        ("threads", "ListTurns", threads_pb2.ListTurnsRequest(parent=thread)),
        (
            "threads",
            "AppendTurns",
            threads_pb2.AppendTurnsRequest(
                parent=thread, turns=[threads_pb2.TurnInput(role=common_pb2.USER, text="intruder")]
            ),
        ),
        (
            "retrieval",
            "Search",
            retrieval_pb2.SearchRequest(parent="owners/alice", query_text="alice private"),
        ),
        ("lifecycle", "Forget", lifecycle_pb2.ForgetRequest(names=[turn])),
        ("lifecycle", "Forget", lifecycle_pb2.ForgetRequest(names=[thread])),
        ("lifecycle", "Forget", lifecycle_pb2.ForgetRequest(names=["owners/alice"])),
        (
            "lifecycle",
            "Forget",
            lifecycle_pb2.ForgetRequest(
                range=lifecycle_pb2.TurnRange(thread=thread, from_seq=1, to_seq=2)
            ),
        ),
        ("lifecycle", "Commit", lifecycle_pb2.CommitRequest(names=[pending])),
    ]


def _assert_alice_intact(
    c: Client, thread: str, text: str, turn: threads_pb2.Turn, pending: threads_pb2.Turn
) -> None:
    assert get_turn(c, turn.name).text == text
    assert get_turn(c, pending.name).state == pending.state
    assert list_texts(c, thread) == [text, pending.text]
    assert search_texts(c, "alice", text)[0] == text
    threads = c.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent="owners/alice"), metadata=tuple(c.md)
    )
    assert [t.name for t in threads.threads] == [thread]


def test_missing_token_is_unauthenticated(
    lethe: Lethe, alice_data: AliceData, transport: str
) -> None:
    c, thread, text, turn, pending = alice_data
    stubs = lethe.stubs(transport, c)
    for stub, method, req in _requests(thread, turn.name, pending.name):
        fn = getattr(getattr(stubs, stub), method)
        expect_error(fn, req, None, UNAUTH, "MISSING_TOKEN")
    _assert_alice_intact(c, thread, text, turn, pending)


@pytest.mark.parametrize(
    "header",
    [
        "Bearer lethe_thisisnotarealtokenthisisnotarealtoken123",
        "Bearer nonsense",
        "Basic YWxpY2U6cGFzcw==",
        "Bearer ",
        "lethe_justthetoken",
    ],
)
def test_bad_token_is_unauthenticated_invalid_token(
    lethe: Lethe, alice_data: AliceData, header: str, transport: str
) -> None:
    c, thread, text, turn, pending = alice_data
    stubs = lethe.stubs(transport, c)
    md = [("authorization", header)]
    for stub, method, req in _requests(thread, turn.name, pending.name):
        fn = getattr(getattr(stubs, stub), method)
        expect_error(fn, req, md, UNAUTH, "INVALID_TOKEN")
    _assert_alice_intact(c, thread, text, turn, pending)


def test_other_owners_token_is_permission_denied_and_touches_nothing(
    lethe: Lethe, alice_data: AliceData, transport: str
) -> None:
    c, thread, text, turn, pending = alice_data
    bob = lethe.client("bob")
    create_thread(bob, "bob")
    stubs = lethe.stubs(transport, bob)
    for stub, method, req in _requests(thread, turn.name, pending.name):
        fn = getattr(getattr(stubs, stub), method)
        expect_error(fn, req, bob.md, DENIED, "OWNER_NOT_ALLOWED")
    _assert_alice_intact(c, thread, text, turn, pending)
    t = c.threads.GetThread(threads_pb2.GetThreadRequest(name=thread), metadata=tuple(c.md))
    assert t.last_seq == 2


def test_permission_denied_does_not_reveal_existence(
    lethe: Lethe, alice_data: AliceData, transport: str
) -> None:
    bob = lethe.client("bob")
    stubs = lethe.stubs(transport, bob)
    missing = threads_pb2.GetTurnRequest(name="owners/alice/threads/nothere/turns/1")
    expect_error(stubs.threads.GetTurn, missing, bob.md, DENIED, "OWNER_NOT_ALLOWED")
    expect_error(
        stubs.threads.GetThread,
        threads_pb2.GetThreadRequest(name="owners/alice/threads/nothere"),
        bob.md,
        DENIED,
        "OWNER_NOT_ALLOWED",
    )


def test_forget_naming_two_owners_is_refused_and_deletes_nothing(
    lethe: Lethe, alice_data: AliceData
) -> None:
    c, thread, text, turn, pending = alice_data
    both = lethe.client("alice", "bob")
    b_thread = create_thread(both, "bob")
    (b_turn,) = append(both, b_thread, ["bob's"], commit=True)
    req = lifecycle_pb2.ForgetRequest(names=[turn.name, b_turn.name])
    err = expect_error(
        both.lifecycle.Forget, req, both.md, grpc.StatusCode.INVALID_ARGUMENT, "BAD_FIELD"
    )
    assert err is not None
    _assert_alice_intact(c, thread, text, turn, pending)
    assert get_turn(both, b_turn.name).text == "bob's"


def test_token_for_several_owners_acts_for_each(lethe: Lethe) -> None:
    both = lethe.client("alice", "bob")
    for owner in ("alice", "bob"):
        thread = create_thread(both, owner)
        (turn,) = append(both, thread, [f"{owner} {unique()}"], commit=True)
        assert get_turn(both, turn.name).text == turn.text
    expect_error(
        both.threads.CreateThread,
        threads_pb2.CreateThreadRequest(parent="owners/carol"),
        both.md,
        DENIED,
        "OWNER_NOT_ALLOWED",
    )


def test_admin_token_acts_for_any_owner(lethe: Lethe, alice_data: AliceData) -> None:
    c, thread, text, turn, pending = alice_data
    admin = lethe.client(admin=True)
    assert get_turn(admin, turn.name).text == text
    assert list_texts(admin, thread) == [text, pending.text]
    assert search_texts(admin, "alice", text)[0] == text
    z_thread = create_thread(admin, "zed")
    (z_turn,) = append(admin, z_thread, ["zed's turn"], commit=True)
    assert get_turn(admin, z_turn.name).text == "zed's turn"
    receipt = admin.lifecycle.Forget(
        lifecycle_pb2.ForgetRequest(names=[turn.name]), metadata=tuple(admin.md)
    )
    assert list(receipt.targets) == [turn.name]
    expect_error(
        c.threads.GetTurn,
        threads_pb2.GetTurnRequest(name=turn.name),
        c.md,
        grpc.StatusCode.NOT_FOUND,
        "RECORD_DELETED",
    )


def test_health_check_needs_no_token(lethe: Lethe) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{lethe.port}")
    lethe.channels.append(channel)
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "lethe.v1.Threads", "lethe.v1.Retrieval", "lethe.v1.Lifecycle"):
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as info:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def _reflect(channel: grpc.Channel, md: Sequence[tuple[str, str]] | None) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    kwargs = {} if md is None else {"metadata": tuple(md)}
    responses = list(stub.ServerReflectionInfo(iter([req]), **kwargs))
    return {s.name for s in responses[0].list_services_response.service}


def test_reflection_lists_lethe_services_with_token(lethe: Lethe) -> None:
    c = lethe.client("alice")
    names = _reflect(c.channel, c.md)
    assert {"lethe.v1.Threads", "lethe.v1.Retrieval", "lethe.v1.Lifecycle"} <= names
    assert "grpc.health.v1.Health" in names


def test_reflection_needs_no_token(lethe: Lethe) -> None:
    # Was: reflection needed a token although it reveals only the public
    # schema, so `grpcurl list` failed as docs/other-languages.md tells it.
    channel = grpc.insecure_channel(f"127.0.0.1:{lethe.port}")
    lethe.channels.append(channel)
    names = _reflect(channel, None)
    assert {"lethe.v1.Threads", "lethe.v1.Events", "grpc.health.v1.Health"} <= names


def test_two_authorization_headers_are_refused(lethe: Lethe, transport: str) -> None:
    # Was: the first header won, so the order of two credentials decided the outcome.
    alice = lethe.client("alice")
    stubs = lethe.stubs(transport, alice)
    bob_token = lethe.token("bob")
    both = (("authorization", f"Bearer {alice.token}"), ("authorization", f"Bearer {bob_token}"))
    with pytest.raises(grpc.RpcError) as err:
        stubs.threads.ListThreads(
            threads_pb2.ListThreadsRequest(parent="owners/alice"), metadata=both
        )
    assert error_reason(err.value) == (grpc.StatusCode.UNAUTHENTICATED, "INVALID_TOKEN")


def test_token_create_refuses_a_directory_without_a_store(tmp_path: Path, kek_env: str) -> None:
    # Was: a typo in --data silently created a new store and printed a useless token.
    assert run_cli(["token", "create", "--data", str(tmp_path / "typo"), "--owner", "x"]) == 2
    assert not (tmp_path / "typo").exists()


def test_a_token_row_is_read_once_per_half_second_and_a_revocation_still_lands(
    tmp_path: Path, kek_env: str
) -> None:
    """The authenticator caches a token's row for ``TOKEN_CACHE_SECONDS``, on a real store.

    Repeated calls read the row once; an unknown token is never cached (a token
    stored afterwards works at once); a revocation is refused once the row is
    older than the cache's life.
    """
    from server.edge import Authenticator
    from server.store import Store

    store = Store(tmp_path / "d")
    try:
        reads: list[bytes] = []

        def lookup(digest: bytes) -> Any:
            reads.append(digest)
            return store.get_token(digest)

        auth = Authenticator(lookup, ttl=0.3)
        token = new_token()
        md = (("authorization", f"Bearer {token}"),)
        with pytest.raises(Unauthenticated):
            auth.authenticate(md)  # unknown: not cached
        store.put_token(token_digest(token), principal_record(["alice"], False))
        assert auth.authenticate(md).owners == frozenset({"alice"})
        for _ in range(50):
            auth.authenticate(md)
        assert len(reads) == 2  # the unknown read, then one read for 51 calls
        store.revoke_token(token_digest(token)[:8].hex())
        time.sleep(0.35)
        with pytest.raises(Unauthenticated):
            auth.authenticate(md)
    finally:
        store.close()
