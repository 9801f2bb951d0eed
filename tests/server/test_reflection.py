"""Server reflection serves what a client in another language needs (grpcurl, generated stubs).

Every service of ``lethe.v1`` and the error enum
``lethe.errors.v1.ErrorReason``, with the documentation comments' file.
"""

from __future__ import annotations

from conftest import Lethe
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

SERVICES = {
    "lethe.v1.Threads",
    "lethe.v1.Memories",
    "lethe.v1.Retrieval",
    "lethe.v1.Lifecycle",
    "lethe.v1.Repairs",
    "lethe.v1.Events",
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
}


def _ask(
    lethe: Lethe, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    c = lethe.client("alice")
    stub = reflection_pb2_grpc.ServerReflectionStub(c.channel)
    (response,) = list(stub.ServerReflectionInfo(iter([request]), metadata=c.md))
    return response


def test_reflection_lists_every_service(lethe: Lethe) -> None:
    response = _ask(lethe, reflection_pb2.ServerReflectionRequest(list_services=""))
    assert {s.name for s in response.list_services_response.service} == SERVICES


def test_reflection_finds_the_error_reason_enum(lethe: Lethe) -> None:
    response = _ask(
        lethe,
        reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="lethe.errors.v1.ErrorReason"
        ),
    )
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in response.file_descriptor_response.file_descriptor_proto
    ]
    (errors,) = [f for f in files if f.name == "lethe/errors/v1/errors.proto"]
    assert errors.package == "lethe.errors.v1"
    (enum,) = errors.enum_type
    assert enum.name == "ErrorReason"
    values = {v.name: v.number for v in enum.value}
    assert values["RECORD_DELETED"] == 7
    assert values["INTEGRITY"] == 20
    assert errors.options.go_package == "lethe/gen/go/lethe/errors/v1;errorsv1"
