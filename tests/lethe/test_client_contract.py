"""What the typed client promises beyond the round trips of ``test_client.py``.

Its pinned public names, a method per RPC in both clients with the same
signatures, the error classes for every reason the API documents, the decoding
of hand-built statuses, retries only where they are safe (against a real gRPC
server that fails on purpose), TLS with the token as a call credential, and a
watch that resumes across a server restart.
"""

from __future__ import annotations

import inspect
import pickle
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import Lethe
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

import lethe.client as lc
from lethe.client import AsyncClient, Client, ErrorReason
from lethe.client._config import is_loopback, plan_channel
from lethe.v1 import (
    events_pb2,
    lifecycle_pb2,
    memories_pb2,
    repairs_pb2,
    retrieval_pb2,
    threads_pb2,
    threads_pb2_grpc,
)

# API.md, "Errors": reason -> code.
API_REASONS = {
    "MISSING_TOKEN": "UNAUTHENTICATED",
    "INVALID_TOKEN": "UNAUTHENTICATED",
    "OWNER_NOT_ALLOWED": "PERMISSION_DENIED",
    "BAD_FIELD": "INVALID_ARGUMENT",
    "DIMENSION_MISMATCH": "INVALID_ARGUMENT",
    "NOT_FOUND": "NOT_FOUND",
    "RECORD_DELETED": "NOT_FOUND",
    "SOURCE_DELETED": "FAILED_PRECONDITION",
    "SOURCE_STALE": "FAILED_PRECONDITION",
    "SOURCE_SEALED": "FAILED_PRECONDITION",
    "SOURCE_PENDING": "FAILED_PRECONDITION",
    "ILLEGAL_TRANSITION": "FAILED_PRECONDITION",
    "REPAIR_NOT_CONTINUED": "FAILED_PRECONDITION",
    "RESTRICTED": "FAILED_PRECONDITION",
    "SEALED": "FAILED_PRECONDITION",
    "VERSION_MISMATCH": "ABORTED",
    "SLOT_CONFLICT": "ALREADY_EXISTS",
    "ALREADY_EXISTS": "ALREADY_EXISTS",
    "STORE_FULL": "RESOURCE_EXHAUSTED",
    "INTEGRITY": "DATA_LOSS",
    "STORAGE_UNAVAILABLE": "UNAVAILABLE",
    "TOO_MANY_REQUESTS": "RESOURCE_EXHAUSTED",
    "TOO_MANY_STREAMS": "RESOURCE_EXHAUSTED",
    "MALFORMED_REQUEST": "INVALID_ARGUMENT",
    "DRAINING": "UNAVAILABLE",
    "OWNER_HEADER_MISMATCH": "INVALID_ARGUMENT",
    "OWNER_HEADER_MISSING": "INVALID_ARGUMENT",
    "OWNER_MOVED": "FAILED_PRECONDITION",
    "SHARD_UNAVAILABLE": "UNAVAILABLE",
    "OWNER_MOVING": "UNAVAILABLE",
    "ECHOES_FORGOTTEN": "FAILED_PRECONDITION",
}
SERVICES = {
    threads_pb2: "Threads",
    memories_pb2: "Memories",
    retrieval_pb2: "Retrieval",
    lifecycle_pb2: "Lifecycle",
    repairs_pb2: "Repairs",
    events_pb2: "Events",
}


def _params(fn: Any) -> list[inspect.Parameter]:
    return list(inspect.signature(fn).parameters.values())


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class _Call(grpc.RpcError):
    """A failed call with a hand-built status, as a stub raises it."""

    def __init__(self, code: grpc.StatusCode, *details: Any, message: str = "m") -> None:
        packed = []
        for detail in details:
            box = any_pb2.Any()
            box.Pack(detail)
            packed.append(box)
        self.status = status_pb2.Status(code=code.value[0], message=message, details=packed)
        self._code, self._message = code, message

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> Any:
        return (("grpc-status-details-bin", self.status.SerializeToString()),)


def _info(reason: str, domain: str = "lethe") -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(reason=reason, domain=domain)


def test_public_names_are_pinned() -> None:
    assert sorted(lc.__all__) == sorted(
        [
            "DEFAULT_TIMEOUT", "DOMAIN", "MAX_MESSAGE_BYTES", "RETRIED_METHODS", "Aborted",
            "AlreadyExists", "AsyncClient", "AsyncEventStream", "BadField", "Cancelled", "Client",
            "DataLoss", "DeadlineExceeded", "DimensionMismatch", "Draining", "EchoesForgotten",
            "ErrorReason",
            "EventStream", "FailedPrecondition", "FieldViolation", "IllegalTransition", "Integrity",
            "Internal", "InvalidArgument", "InvalidToken", "LetheError", "MalformedRequest",
            "MissingToken", "NotFound", "OutOfRange", "OwnerHeaderMismatch", "OwnerHeaderMissing",
            "OwnerMoved", "OwnerMoving", "OwnerNotAllowed", "PermissionDenied", "ShardUnavailable",
            "RecordDeleted", "RepairNotContinued", "ResourceExhausted", "Restricted", "RetryPolicy",
            "Sealed", "SlotConflict", "SourceDeleted", "SourcePending", "SourceSealed",
            "SourceStale", "StorageUnavailable", "StoreFull", "TLSConfig", "TooManyRequests",
            "TooManyStreams", "Unauthenticated", "Unavailable", "Unimplemented", "Unknown",
            "VersionMismatch", "error_from_rpc", "new_request_id",
        ]
    )  # fmt: skip
    for name in lc.__all__:
        assert hasattr(lc, name), name


def test_every_rpc_has_a_method_in_both_clients_with_one_signature() -> None:
    for module, service in SERVICES.items():
        for method in module.DESCRIPTOR.services_by_name[service].methods:
            name = _snake(method.name)
            sync, aio = getattr(Client, name), getattr(AsyncClient, name)
            assert _params(sync) == _params(aio), name
            assert f"``{service}.{method.name}``" in (sync.__doc__ or ""), name
    extras = {"iter_threads", "iter_turns", "iter_memories", "iter_deletions", "wait_ready"}
    for name in extras:
        assert _params(getattr(Client, name)) == _params(getattr(AsyncClient, name)), name


def test_every_documented_reason_has_a_class_under_its_code() -> None:
    named = {n for n in ErrorReason.keys() if n != "ERROR_REASON_UNSPECIFIED"}  # noqa: SIM118
    assert named == set(API_REASONS)
    for reason, code in API_REASONS.items():
        err = lc.error_from_rpc(_Call(grpc.StatusCode[code], _info(reason)))
        assert (err.code().name, err.reason_name, err.reason) == (
            code,
            reason,
            ErrorReason.Value(reason),
        )
        assert err.status_code.name == code
        if reason not in ("NOT_FOUND", "ALREADY_EXISTS"):
            assert type(err).reason_value == ErrorReason.Value(reason), reason
    assert type(lc.error_from_rpc(_Call(grpc.StatusCode.NOT_FOUND, _info("NOT_FOUND")))) is (
        lc.NotFound
    )


def test_decoding_is_robust_to_the_unexpected() -> None:
    unknown = lc.error_from_rpc(_Call(grpc.StatusCode.NOT_FOUND, _info("FROM_THE_FUTURE")))
    assert (type(unknown), unknown.reason, unknown.reason_name) == (
        lc.NotFound,
        ErrorReason.ERROR_REASON_UNSPECIFIED,
        "FROM_THE_FUTURE",
    )
    mismatched = lc.error_from_rpc(_Call(grpc.StatusCode.INTERNAL, _info("RECORD_DELETED")))
    assert type(mismatched) is lc.Internal  # a reason under another code: the code decides
    foreign = lc.error_from_rpc(_Call(grpc.StatusCode.NOT_FOUND, _info("GONE", "proxy.example")))
    assert (type(foreign), foreign.reason_name) == (lc.NotFound, "")
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field="turns[0].text", description="empty"),
            error_details_pb2.BadRequest.FieldViolation(field="turns[1].role", description="bad"),
        ]
    )
    err = lc.error_from_rpc(_Call(grpc.StatusCode.INVALID_ARGUMENT, _info("BAD_FIELD"), bad))
    assert isinstance(err, lc.BadField)
    assert err.field_violations == [
        lc.FieldViolation("turns[0].text", "empty"),
        lc.FieldViolation("turns[1].role", "bad"),
    ]
    assert err.fields == ["turns[0].text", "turns[1].role"]
    failure = error_details_pb2.PreconditionFailure(
        violations=[error_details_pb2.PreconditionFailure.Violation(subject="owners/a/memories/m")]
    )
    pre = lc.error_from_rpc(
        _Call(grpc.StatusCode.FAILED_PRECONDITION, _info("SOURCE_DELETED"), failure)
    )
    assert (type(pre), pre.subject) == (lc.SourceDeleted, "owners/a/memories/m")
    bare = lc.error_from_rpc(_Call(grpc.StatusCode.UNAVAILABLE))
    assert (type(bare), bare.reason_name, str(bare)) == (lc.Unavailable, "", "UNAVAILABLE: m")
    assert lc.error_from_rpc(err) is err
    again = pickle.loads(pickle.dumps(err))  # noqa: S301 (our own bytes)
    assert (type(again), again.fields, again.code()) == (lc.BadField, err.fields, err.code())


def test_slot_conflict_names_the_holder(lethe: Lethe) -> None:
    c = lethe.client("alice")
    first = c.create_memory(
        "owners/alice", {"kind": "FACT", "text": "10 guests", "slot": "guests"}, memory_id="a"
    )
    with pytest.raises(lc.SlotConflict) as err:
        c.create_memory("owners/alice", {"kind": "FACT", "text": "12 guests", "slot": "guests"})
    assert err.value.subject == first.name


def test_channel_plans() -> None:
    local_targets = ["127.0.0.1:5", "127.8.9.1:5", "localhost:5", "[::1]:5", "unix:/tmp/s"]
    for target in [*local_targets, "dns:///localhost:5"]:
        assert is_loopback(target), target
    for target in ("10.0.0.1:5", "lethe.example:443", "[2001:db8::1]:5", "example.com"):
        assert not is_loopback(target), target
    local = plan_channel("127.0.0.1:5", "tok", None, lc.RetryPolicy(), ())
    assert (local.credentials, local.metadata) == (None, (("authorization", "Bearer tok"),))
    remote = plan_channel("lethe.example:443", "tok", None, None, ())
    assert remote.credentials is not None
    assert remote.metadata == ()
    assert ("grpc.enable_retries", 0) in remote.options
    forced = plan_channel("lethe.example:443", "tok", False, None, ())
    assert forced.credentials is None
    with pytest.raises(ValueError, match="token"):
        plan_channel("127.0.0.1:5", "", None, None, ())
    with pytest.raises(ValueError, match="max_attempts"):
        lc.RetryPolicy(max_attempts=9).service_config()
    with pytest.raises(ValueError, match="code"):
        lc.RetryPolicy(retryable_codes=("NOPE",)).service_config()
    served = {
        (f"lethe.v1.{service}", m.name)
        for module, service in SERVICES.items()
        for m in module.DESCRIPTOR.services_by_name[service].methods
    } | {("grpc.health.v1.Health", "Check")}
    assert set(lc.RETRIED_METHODS) <= served


class _Flaky(threads_pb2_grpc.ThreadsServicer):
    """A real gRPC servicer that answers UNAVAILABLE to the first ``fail`` calls of each method."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.calls: dict[str, list[Any]] = {}
        self.lock = threading.Lock()

    def _seen(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        with self.lock:
            calls = self.calls.setdefault(method, [])
            calls.append(request)
            failing = len(calls) <= self.fail
        if failing:
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again")

    def GetThread(  # noqa: N802
        self, request: threads_pb2.GetThreadRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Thread:
        self._seen("GetThread", request, context)
        return threads_pb2.Thread(name=request.name)

    def CreateThread(  # noqa: N802
        self, request: threads_pb2.CreateThreadRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Thread:
        self._seen("CreateThread", request, context)
        return threads_pb2.Thread(name=f"{request.parent}/threads/{request.thread_id}")

    def AppendTurns(  # noqa: N802
        self, request: threads_pb2.AppendTurnsRequest, context: grpc.ServicerContext
    ) -> threads_pb2.AppendTurnsResponse:
        self._seen("AppendTurns", request, context)
        return threads_pb2.AppendTurnsResponse()


@pytest.fixture
def flaky() -> Iterator[tuple[_Flaky, str]]:
    servicer = _Flaky(fail=2)  # type: ignore[abstract]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    threads_pb2_grpc.add_ThreadsServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def test_reads_and_request_id_appends_are_retried_other_writes_are_not(
    flaky: tuple[_Flaky, str],
) -> None:
    servicer, target = flaky
    policy = lc.RetryPolicy(initial_backoff=0.01, max_backoff=0.05)
    with Client(target, "tok", retry=policy) as c:
        assert c.get_thread("owners/a/threads/t").name == "owners/a/threads/t"
        assert len(servicer.calls["GetThread"]) == 3
        c.append_turns("owners/a/threads/t", [{"role": "USER", "text": "hi"}])
        ids = {r.request_id for r in servicer.calls["AppendTurns"]}
        assert len(servicer.calls["AppendTurns"]) == 3
        assert len(ids) == 1  # every attempt carries the same request_id
        assert ids.pop().startswith("py-")
        with pytest.raises(lc.Unavailable):
            c.create_thread("owners/a", thread_id="t")
        assert len(servicer.calls["CreateThread"]) == 1
    with Client(target, "tok", retry=None) as c:
        servicer.calls.clear()
        with pytest.raises(lc.Unavailable):
            c.get_thread("owners/a/threads/t")
        assert len(servicer.calls["GetThread"]) == 1


def test_watch_resumes_after_a_server_restart(lethe: Lethe) -> None:
    c = lethe.client(admin=True, retry=lc.RetryPolicy(initial_backoff=0.05, max_backoff=0.2))
    thread = c.create_thread("owners/alice").name
    turns = c.append_turns(
        thread, [{"role": "USER", "text": f"t{i}", "commit": True} for i in range(3)]
    ).turns
    c.forget([turns[0].name])
    with c.watch("owners/alice", types=["RECORD_DELETED"], timeout=60) as stream:
        assert next(stream).subject == turns[0].name
        lethe.restart(same_port=True)
        c.wait_ready(timeout=30)  # the channel may sit in reconnect backoff for a moment
        c.forget([turns[1].name])
        assert next(stream).subject == turns[1].name  # reconnected, resumed after the last id
        c.forget([turns[2].name])
        assert next(stream).subject == turns[2].name


def _self_signed(tmp: Path) -> tuple[bytes, bytes]:
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=lethe.test", "-addext", "subjectAltName=DNS:lethe.test",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key.read_bytes(), cert.read_bytes()


class _Echo(threads_pb2_grpc.ThreadsServicer):
    def GetThread(  # noqa: N802
        self, request: threads_pb2.GetThreadRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Thread:
        md = dict(context.invocation_metadata())
        return threads_pb2.Thread(name=request.name, title=str(md.get("authorization", "")))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for a test certificate")
def test_tls_sends_the_token_as_a_call_credential(tmp_path: Path) -> None:
    key, cert = _self_signed(tmp_path)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    threads_pb2_grpc.add_ThreadsServicer_to_server(_Echo(), server)  # type: ignore[abstract]
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    server.start()
    try:
        tls = lc.TLSConfig(root_certificates=cert, server_name="lethe.test")
        with Client(f"127.0.0.1:{port}", "lethe_tok", tls=tls) as c:
            assert c.metadata == ()
            assert c.get_thread("owners/a/threads/t").title == "Bearer lethe_tok"
        default_roots = Client(f"127.0.0.1:{port}", "lethe_tok", tls=True, retry=None)
        with default_roots as c, pytest.raises(lc.Unavailable):  # untrusted certificate
            c.get_thread("owners/a/threads/t", timeout=5)
    finally:
        server.stop(None)
