"""``lethe._rpc``: the stubs holder against the real server, and the ``google.rpc.Status`` decoders.

The decoders of ``google.rpc.Status`` details run on real and hand-built
errors.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from conftest import Lethe
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2

from lethe._rpc import DOMAIN, Stubs, bad_fields, error_info, reason_of
from lethe.v1 import repairs_pb2, threads_pb2


class _FakeError(grpc.RpcError):
    """A failed call carrying a hand-built ``google.rpc.Status`` (or none)."""

    def __init__(self, status: status_pb2.Status | None) -> None:
        self._status = status

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return "bad" if self._status is not None else ""

    def trailing_metadata(self) -> Any:  # the stubs' _Metadatum is not what grpc returns
        if self._status is None:
            return ()
        return (("grpc-status-details-bin", self._status.SerializeToString()),)


def _status(*details: object) -> status_pb2.Status:
    packed = []
    for detail in details:
        box = any_pb2.Any()
        box.Pack(detail)  # type: ignore[arg-type]
        packed.append(box)
    return status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="bad", details=packed)


def _error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


def test_stubs_reach_every_service_with_the_token(lethe: Lethe) -> None:
    token = lethe.token("alice")
    with Stubs.insecure(f"127.0.0.1:{lethe.port}", token) as c:
        assert c.token == token
        assert c.md == (("authorization", f"Bearer {token}"),)
        health = c.health.Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        thread = c.threads.CreateThread(
            threads_pb2.CreateThreadRequest(parent="owners/alice", thread_id="t1"), metadata=c.md
        )
        assert thread.name == "owners/alice/threads/t1"
        err = _error(
            lambda: c.repairs.ReopenRepair(
                repairs_pb2.ReopenRepairRequest(name="owners/alice/threads/nope"), metadata=c.md
            )
        )
        assert err.code() == grpc.StatusCode.NOT_FOUND


def test_stubs_on_an_existing_channel_close_it(lethe: Lethe) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{lethe.port}")
    c = Stubs(channel, lethe.token("alice"))
    assert c.channel is channel
    health = c.health.Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    c.close()
    with pytest.raises(ValueError, match="closed channel"):
        c.health.Check(health_pb2.HealthCheckRequest())
    c.close()  # idempotent


def test_reason_of_a_deleted_record_is_record_deleted(lethe: Lethe) -> None:
    c = lethe.client("alice")
    c.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent="owners/alice", thread_id="t1"), metadata=c.md
    )
    err = _error(
        lambda: c.threads.GetThread(
            threads_pb2.GetThreadRequest(name="owners/alice/threads/t2"), metadata=c.md
        )
    )
    assert (err.code(), reason_of(err)) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    info = error_info(err)
    assert info is not None
    assert (info.domain, info.reason) == (DOMAIN, "NOT_FOUND")
    assert bad_fields(err) == []


def test_bad_fields_name_the_malformed_field(lethe: Lethe) -> None:
    c = lethe.client("alice")
    err = _error(
        lambda: c.threads.CreateThread(
            threads_pb2.CreateThreadRequest(parent="owners/alice", thread_id="Not An Id"),
            metadata=c.md,
        )
    )
    assert (err.code(), reason_of(err), bad_fields(err)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "BAD_FIELD",
        ["thread_id"],
    )


def test_reason_of_an_unauthenticated_call_is_missing_token(lethe: Lethe) -> None:
    c = lethe.client("alice")
    err = _error(
        lambda: c.threads.GetThread(threads_pb2.GetThreadRequest(name="owners/alice/threads/t"))
    )
    assert (err.code(), reason_of(err)) == (grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN")


def test_error_without_status_details_has_no_reason() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        with Stubs.insecure(f"127.0.0.1:{s.getsockname()[1]}", "t") as c:
            err = _error(lambda: c.health.Check(health_pb2.HealthCheckRequest(), timeout=5))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert (reason_of(err), error_info(err), bad_fields(err)) == ("", None, [])


def test_reason_of_ignores_an_error_info_of_another_domain() -> None:
    foreign = error_details_pb2.ErrorInfo(reason="RATE_LIMITED", domain="proxy.example")
    err = _FakeError(_status(foreign))
    assert reason_of(err) == ""
    info = error_info(err)
    assert info is not None
    assert (info.domain, info.reason) == ("proxy.example", "RATE_LIMITED")


def test_decoders_read_every_detail_of_a_hand_built_status() -> None:
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field="turns[0].text"),
            error_details_pb2.BadRequest.FieldViolation(field="turns[2].role"),
        ]
    )
    info = error_details_pb2.ErrorInfo(reason="BAD_FIELD", domain=DOMAIN)
    err = _FakeError(_status(bad, info))
    assert reason_of(err) == "BAD_FIELD"
    assert bad_fields(err) == ["turns[0].text", "turns[2].role"]
    assert (reason_of(_FakeError(None)), bad_fields(_FakeError(None))) == ("", [])
