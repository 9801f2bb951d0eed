"""Every RPC of every ``lethe.v1`` service, from the descriptors: bad tokens and bad bytes refused.

Each refuses a missing, malformed, unknown or revoked token and a token of
another owner before reading anything (no existence oracle), answers
undecodable request bytes with ``INVALID_ARGUMENT`` / ``MALFORMED_REQUEST``
once the token is good (and ``UNAUTHENTICATED`` before that), and leaves the
owner's data as it was; 200 hostile requests of each kind add only a few log
lines. Each over gRPC and over Connect (binary and JSON): one edge, the same
answers.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import pytest
from _connect import ENVELOPE, ConnectChannel, ConnectRpcError
from _helpers import append, create_thread, error_reason, get_turn
from conftest import Client, Lethe
from google.protobuf import duration_pb2, field_mask_pb2, message

from lethe.v1 import (
    common_pb2,
    events_pb2,
    lifecycle_pb2,
    memories_pb2,
    repairs_pb2,
    retrieval_pb2,
    threads_pb2,
)
from server import token_digest

OWNERLESS = frozenset({"Lifecycle/GetServerInfo"})
"""Methods that name no owner: any valid token may call them (they hold nothing of an owner)."""
MODULES = (threads_pb2, memories_pb2, retrieval_pb2, lifecycle_pb2, repairs_pb2, events_pb2)
UNDECODABLE = b"\xff\xff\xff\xff\xff\xff"  # a tag whose varint never ends (and not UTF-8)
Names = dict[str, str]
Send = Callable[[str, bool, "message.Message | bytes", Sequence[tuple[str, str]]], Any]
"""``(Service/Method, streaming, request or raw bytes, metadata)`` → ``(code, reason)``."""


def _requests(n: Names) -> dict[str, message.Message]:
    """One well-formed request per method, naming records of alice."""
    t, turn, mem = n["thread"], n["turn"], n["memory"]
    alice = "owners/alice"
    return {
        "Threads/CreateThread": threads_pb2.CreateThreadRequest(parent=alice),
        "Threads/GetThread": threads_pb2.GetThreadRequest(name=t),
        "Threads/ListThreads": threads_pb2.ListThreadsRequest(parent=alice),
        "Threads/AppendTurns": threads_pb2.AppendTurnsRequest(
            parent=t, turns=[threads_pb2.TurnInput(role=common_pb2.USER, text="intruder")]
        ),
        "Threads/ListTurns": threads_pb2.ListTurnsRequest(parent=t),
        "Threads/GetTurn": threads_pb2.GetTurnRequest(name=turn),
        "Memories/CreateMemory": memories_pb2.CreateMemoryRequest(
            parent=alice, memory=memories_pb2.Memory(kind=memories_pb2.Memory.FACT, text="x")
        ),
        "Memories/GetMemory": memories_pb2.GetMemoryRequest(name=mem),
        "Memories/ListMemories": memories_pb2.ListMemoriesRequest(parent=alice),
        "Memories/UpdateMemory": memories_pb2.UpdateMemoryRequest(
            memory=memories_pb2.Memory(name=mem, text="overwritten"),
            update_mask=field_mask_pb2.FieldMask(paths=["text"]),
            expected_version=1,
        ),
        "Memories/BatchUpdateMemories": memories_pb2.BatchUpdateMemoriesRequest(
            parent=alice,
            requests=[
                memories_pb2.UpdateMemoryRequest(
                    memory=memories_pb2.Memory(name=mem, text="overwritten"),
                    update_mask=field_mask_pb2.FieldMask(paths=["text"]),
                )
            ],
        ),
        "Memories/TransitionMemory": memories_pb2.TransitionMemoryRequest(
            name=mem, expected_version=1, status=memories_pb2.Memory.SUPERSEDED
        ),
        "Memories/ResolvePreference": memories_pb2.ResolvePreferenceRequest(
            parent=alice, slot="diet"
        ),
        "Retrieval/Search": retrieval_pb2.SearchRequest(parent=alice, query_text="secret"),
        "Retrieval/AssembleContext": retrieval_pb2.AssembleContextRequest(
            thread=t, query_text="secret"
        ),
        "Retrieval/GetContextManifest": retrieval_pb2.GetContextManifestRequest(name=n["manifest"]),
        "Lifecycle/Commit": lifecycle_pb2.CommitRequest(names=[n["pending"]]),
        "Lifecycle/ExtendPending": lifecycle_pb2.ExtendPendingRequest(
            names=[n["pending"]], ttl=duration_pb2.Duration(seconds=3600)
        ),
        "Lifecycle/Forget": lifecycle_pb2.ForgetRequest(names=[turn]),
        "Lifecycle/GetLineage": lifecycle_pb2.GetLineageRequest(name=turn),
        "Lifecycle/ListDeletions": lifecycle_pb2.ListDeletionsRequest(parent=alice),
        "Lifecycle/Audit": lifecycle_pb2.AuditRequest(parent=alice),
        "Lifecycle/GetServerInfo": lifecycle_pb2.GetServerInfoRequest(),
        "Lifecycle/ExportOwner": lifecycle_pb2.ExportOwnerRequest(parent=alice),
        "Lifecycle/SetRetention": lifecycle_pb2.SetRetentionRequest(
            names=[turn], ttl=duration_pb2.Duration(seconds=1)
        ),
        "Repairs/SealRepair": repairs_pb2.SealRepairRequest(thread=t, from_seq=1),
        "Repairs/ReopenRepair": repairs_pb2.ReopenRepairRequest(name=n["repair"]),
        "Repairs/PauseRepair": repairs_pb2.PauseRepairRequest(name=n["repair"]),
        "Repairs/ConcludeRepair": repairs_pb2.ConcludeRepairRequest(
            name=n["repair"], outcome=threads_pb2.RepairInfo.DESTROY
        ),
        "Events/Watch": events_pb2.WatchRequest(parent=alice),
    }


def _all_methods() -> dict[str, bool]:
    """``Service/Method`` → server-streaming, for every lethe.v1 method."""
    return {
        f"{svc.name}/{m.name}": m.server_streaming
        for module in MODULES
        for svc in module.DESCRIPTOR.services_by_name.values()
        for m in svc.methods
    }


@pytest.fixture
def alice(lethe: Lethe) -> tuple[Client, Names]:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", thread_id="t")
    (turn,) = append(c, thread, ["alice's secret"], commit=True)
    (pending,) = append(c, thread, ["alice's pending"])
    mem = c.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent="owners/alice",
            memory=memories_pb2.Memory(kind=memories_pb2.Memory.FACT, text="alice fact"),
        ),
        metadata=tuple(c.md),
    )
    bundle = c.retrieval.AssembleContext(
        retrieval_pb2.AssembleContextRequest(thread=thread, query_text="secret"),
        metadata=tuple(c.md),
    )
    other = create_thread(c, "alice", thread_id="r")
    append(c, other, ["to seal"], commit=True)
    repair = c.repairs.SealRepair(
        repairs_pb2.SealRepairRequest(thread=other, from_seq=1), metadata=tuple(c.md)
    )
    names = {
        "thread": thread,
        "turn": turn.name,
        "pending": pending.name,
        "memory": mem.name,
        "manifest": bundle.manifest.name,
        "repair": repair.name,
    }
    return c, names


def _call(
    channel: grpc.Channel, path: str, streaming: bool, body: bytes, md: Sequence[tuple[str, str]]
) -> tuple[grpc.StatusCode, str]:
    """Send raw request bytes; the call must fail: returns (code, reason)."""
    full = f"/lethe.v1.{path}"
    try:
        if streaming:
            stream: Any = channel.unary_stream(full, None, None)(
                body, metadata=tuple(md), timeout=10
            )
            next(stream)
        else:
            channel.unary_unary(full, None, None)(body, metadata=tuple(md), timeout=10)
    except grpc.RpcError as err:
        return error_reason(err)
    raise AssertionError(f"{path} succeeded")


def _connect_call(
    channel: ConnectChannel,
    path: str,
    streaming: bool,
    body: message.Message | bytes,
    md: Sequence[tuple[str, str]],
) -> tuple[grpc.StatusCode, str]:
    """Send a request (or raw bytes) over Connect; the call must fail: returns (code, reason)."""
    raw = body if isinstance(body, bytes) else channel.encode(body)
    full = f"/lethe.v1.{path}"
    if streaming:
        status, _, out = channel.post(
            full, ENVELOPE.pack(0, len(raw)) + raw, f"application/connect+{channel.codec}", md
        )
        assert status == 200, status
        flags, length = ENVELOPE.unpack_from(out)
        assert flags == 2, f"{path} streamed a message"  # the end of the stream, at once
        end = json.loads(out[ENVELOPE.size : ENVELOPE.size + length])
        return error_reason(ConnectRpcError(status, end["error"]))
    status, _, out = channel.post(full, raw, f"application/{channel.codec}", md)
    assert status != 200, f"{path} succeeded"
    return error_reason(ConnectRpcError(status, json.loads(out)))


class Sender:
    """Calls over one transport; :attr:`port` is its listener's."""

    def __init__(self, send: Send, port: int) -> None:
        self._send = send
        self.port = port

    def __call__(
        self,
        path: str,
        streaming: bool,
        body: message.Message | bytes,
        md: Sequence[tuple[str, str]],
    ) -> tuple[grpc.StatusCode, str]:
        """Make the call, which must fail; returns (code, reason)."""
        result: tuple[grpc.StatusCode, str] = self._send(path, streaming, body, md)
        return result


@pytest.fixture(params=["grpc", "connect-proto", "connect-json"])
def send(request: pytest.FixtureRequest, lethe: Lethe, alice: tuple[Client, Names]) -> Sender:
    """Each transport in turn: gRPC, Connect binary, Connect JSON."""
    c, _ = alice
    if request.param == "grpc":

        def over_grpc(
            path: str, streaming: bool, body: message.Message | bytes, md: Sequence[tuple[str, str]]
        ) -> tuple[grpc.StatusCode, str]:
            raw = body if isinstance(body, bytes) else body.SerializeToString()
            return _call(c.channel, path, streaming, raw, md)

        return Sender(over_grpc, lethe.port)
    channel = ConnectChannel(
        f"127.0.0.1:{lethe.http_port}", codec=str(request.param).removeprefix("connect-")
    )
    return Sender(functools.partial(_connect_call, channel), lethe.http_port)


def _state(c: Client, names: Names) -> tuple[Any, ...]:
    thread = c.threads.GetThread(threads_pb2.GetThreadRequest(name=names["thread"]), metadata=c.md)
    mem = c.memories.GetMemory(memories_pb2.GetMemoryRequest(name=names["memory"]), metadata=c.md)
    threads = c.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent="owners/alice"), metadata=c.md
    )
    return (
        thread.last_seq,
        get_turn(c, names["turn"]).text,
        mem.version,
        mem.text,
        sorted(t.name for t in threads.threads),
    )


def test_the_table_covers_every_method(alice: tuple[Client, Names]) -> None:
    assert set(_requests(alice[1])) == set(_all_methods())


def test_every_method_refuses_bad_tokens_and_other_owners(
    lethe: Lethe, alice: tuple[Client, Names], send: Sender
) -> None:
    c, names = alice
    before = _state(c, names)
    bob = lethe.client("bob")
    create_thread(bob, "bob")
    revoked = lethe.client("alice")
    assert lethe.server is not None
    assert lethe.server.store.revoke_token(token_digest(revoked.token)[:8].hex()) is not None
    cases: list[tuple[str, Sequence[tuple[str, str]], tuple[grpc.StatusCode, str]]] = [
        ("none", (), (grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN")),
        (
            "basic",
            (("authorization", "Basic YTpi"),),
            (grpc.StatusCode.UNAUTHENTICATED, "INVALID_TOKEN"),
        ),
        (
            "unknown",
            (("authorization", "Bearer lethe_" + "A" * 43),),
            (grpc.StatusCode.UNAUTHENTICATED, "INVALID_TOKEN"),
        ),
        ("revoked", revoked.md, (grpc.StatusCode.UNAUTHENTICATED, "INVALID_TOKEN")),
        ("bob", bob.md, (grpc.StatusCode.PERMISSION_DENIED, "OWNER_NOT_ALLOWED")),
    ]
    streaming = _all_methods()
    for path, request in _requests(names).items():
        for label, md, expected in cases:
            if label == "bob" and path in OWNERLESS:
                continue
            got = send(path, streaming[path], request, md)
            assert got == expected, (path, label, got)
    assert _state(c, names) == before
    assert bob.get_server_info().store_id  # a token of another owner may ask this one


def test_undecodable_bytes_are_invalid_argument_after_the_token_check(
    lethe: Lethe, alice: tuple[Client, Names], send: Sender
) -> None:
    # Was: INTERNAL ("Exception deserializing request!") before authentication,
    # with a traceback in the log per request.
    c, names = alice
    before = _state(c, names)
    for path, streaming in _all_methods().items():
        assert send(path, streaming, UNDECODABLE, ()) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "MISSING_TOKEN",
        ), path
        assert send(path, streaming, UNDECODABLE, c.md) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "MALFORMED_REQUEST",
        ), path
    assert _state(c, names) == before


def test_hostile_input_adds_a_bounded_log(
    lethe: Lethe,
    alice: tuple[Client, Names],
    send: Sender,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Was: 200 six-byte unauthenticated requests added 82 KB of log.
    c, _ = alice
    capfd.readouterr()
    senders: list[Callable[[], object]] = [
        lambda: send("Threads/GetTurn", False, UNDECODABLE, ()),
        lambda: send("Threads/GetTurn", False, UNDECODABLE, c.md),
        lambda: send("Threads/GetTurn", False, b"", (("authorization", "Bearer lethe_x"),)),
        lambda: send("Events/Watch", True, UNDECODABLE, c.md),
    ]
    with caplog.at_level(logging.INFO):  # the level `lethe serve` logs at
        for sender in senders:
            for _ in range(200):
                sender()
        for _ in range(200):  # not even HTTP: six bytes on a bare TCP connection
            with socket.create_connection(("127.0.0.1", send.port), timeout=5) as s:
                s.sendall(UNDECODABLE)
    out, err = capfd.readouterr()
    logged = caplog.text + out + err
    assert "Traceback" not in logged
    assert len(caplog.records) <= 15  # 5 a minute per kind: unauthenticated, malformed
    assert len(logged) < 4096, logged[-2000:]
