"""Every reason the server can raise is a value of ``lethe.errors.v1.ErrorReason``.

Reasons are enum constants in the code, never strings, and a number outside the
enum is refused when the error is made.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import server.errors as errors
from lethe.errors.v1 import errors_pb2
from server.errors import LetheError, Reason

ROOT = Path(__file__).resolve().parents[2]


def _subclasses(cls: type[LetheError]) -> list[type[LetheError]]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_subclasses(sub))
    return out


def test_every_default_reason_is_in_the_enum() -> None:
    import server.store  # noqa: F401  (loads every LetheError subclass)

    names = set(errors_pb2.ErrorReason.keys())
    classes: list[type[LetheError]] = [LetheError, *_subclasses(LetheError)]
    assert len(classes) >= 12
    for cls in classes:
        assert errors_pb2.ErrorReason.Name(cls.default_reason) in names, cls


def test_every_reason_in_the_server_source_is_an_enum_constant() -> None:
    """Each ``reason=`` of a LetheError raised in ``server/`` is ``Reason.<NAME>`` of the enum.

    A reason passed through from another error counts too.
    """
    import server.store  # noqa: F401  (loads every LetheError subclass)

    names = set(errors_pb2.ErrorReason.keys())
    classes: list[type[LetheError]] = [LetheError, *_subclasses(LetheError)]
    error_classes = {cls.__name__ for cls in classes}
    seen: list[str] = []
    bad: list[str] = []
    for path in sorted((ROOT / "server").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called not in error_classes:
                continue
            for kw in node.keywords:
                if kw.arg != "reason":
                    continue
                value = kw.value
                where = f"{path.relative_to(ROOT)}:{kw.lineno}"
                if (
                    isinstance(value, ast.Attribute)
                    and isinstance(value.value, ast.Name)
                    and value.value.id == "Reason"
                ):
                    (seen if value.attr in names else bad).append(f"{where} {value.attr}")
                elif not (isinstance(value, ast.Attribute) and value.attr == "reason"):
                    bad.append(f"{where} {ast.dump(value)}")
    assert bad == []
    assert len(seen) >= 30  # the check looked at the real raise sites


def test_a_reason_outside_the_enum_is_refused() -> None:
    with pytest.raises(ValueError, match="999"):
        errors.NotFound("x", reason=999)  # type: ignore[arg-type]


def test_error_info_carries_the_enum_name() -> None:
    status = errors.to_rpc_status(
        errors.FailedPrecondition("sealed", reason=Reason.SEALED, subject="owners/a/threads/t")
    )
    from google.rpc import error_details_pb2

    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.reason, info.domain) == ("SEALED", "lethe")
    failure = error_details_pb2.PreconditionFailure()
    assert status.details[1].Unpack(failure)
    assert failure.violations[0].type == "SEALED"
