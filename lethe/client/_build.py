"""Requests from keyword arguments, checked against the message descriptor.

What the typed methods accept for each field kind:

- a message field takes the message, or a ``dict`` of its fields (nested
  freely); ``google.protobuf.Timestamp`` also takes an aware ``datetime`` or
  float seconds since the epoch, ``Duration`` a ``timedelta`` or float
  seconds, ``FieldMask`` a list of paths, ``Struct`` a ``dict``;
- an enum field takes the value or its name (``"USER"``);
- a repeated field takes any iterable of the above;
- ``None`` leaves a field unset.

The same conversions on every supported protobuf runtime (the constructor's
own coercions differ between versions). :func:`new_request_id` makes the
idempotency key every ``AppendTurns`` carries. Imports only protobuf.
"""

from __future__ import annotations

import datetime as _dt
import math
import secrets
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from google.protobuf import duration_pb2, field_mask_pb2, struct_pb2, timestamp_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["build", "new_request_id"]

_M = TypeVar("_M", bound=Message)

_TIMESTAMP = timestamp_pb2.Timestamp.DESCRIPTOR.full_name
_DURATION = duration_pb2.Duration.DESCRIPTOR.full_name
_FIELD_MASK = field_mask_pb2.FieldMask.DESCRIPTOR.full_name
_STRUCT = struct_pb2.Struct.DESCRIPTOR.full_name


def _is_repeated(field: Any) -> bool:
    # ``label`` is deprecated in newer runtimes; ``is_repeated`` is absent in older ones.
    flag = getattr(field, "is_repeated", None)
    if isinstance(flag, bool):
        return flag
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def _seconds_split(seconds: float) -> tuple[int, int]:
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite number of seconds: {seconds!r}")
    whole = math.floor(seconds)
    nanos = round((seconds - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    return int(whole), int(nanos)


def _well_known(full_name: str, value: Any) -> Message | None:
    """A well-known message from a Python value, or None when ``value`` is not one."""
    if full_name == _TIMESTAMP:
        if isinstance(value, _dt.datetime):
            if value.tzinfo is None:
                raise ValueError("a Timestamp needs an aware datetime (tzinfo set)")
            ts = timestamp_pb2.Timestamp()
            ts.FromDatetime(value.astimezone(_dt.UTC))
            return ts
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds, nanos = _seconds_split(float(value))
            return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
    elif full_name == _DURATION:
        if isinstance(value, _dt.timedelta):
            value = value.total_seconds()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds, nanos = _seconds_split(float(value))
            return duration_pb2.Duration(seconds=seconds, nanos=nanos)
    elif full_name == _FIELD_MASK:
        if isinstance(value, (list, tuple)):
            return field_mask_pb2.FieldMask(paths=[str(p) for p in value])
    elif full_name == _STRUCT and isinstance(value, Mapping):
        struct = struct_pb2.Struct()
        struct.update(value)
        return struct
    return None


def _message(descriptor: Any, value: Any, where: str) -> Message:
    cls: type[Message] = _message_class(descriptor)
    if isinstance(value, Message):
        if value.DESCRIPTOR.full_name != descriptor.full_name:
            raise TypeError(
                f"{where}: expected {descriptor.full_name}, got {value.DESCRIPTOR.full_name}"
            )
        return value
    known = _well_known(descriptor.full_name, value)
    if known is not None:
        return known
    if isinstance(value, Mapping):
        return build(cls, value, where=where)
    raise TypeError(f"{where}: expected {descriptor.full_name} or a dict, got {type(value)!r}")


def _message_class(descriptor: Any) -> type[Message]:
    from google.protobuf import message_factory

    get = getattr(message_factory, "GetMessageClass", None)
    if get is not None:
        return get(descriptor)  # type: ignore[no-any-return]
    return message_factory.MessageFactory().GetPrototype(descriptor)  # type: ignore[no-any-return,attr-defined]


def _scalar(field: Any, value: Any, where: str) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM and isinstance(value, str):
        number = field.enum_type.values_by_name.get(value)
        if number is None:
            names = ", ".join(v.name for v in field.enum_type.values)
            raise ValueError(
                f"{where}: {value!r} is not a value of {field.enum_type.name} ({names})"
            )
        return number.number
    return value


def build(cls: type[_M], fields: Mapping[str, Any], *, where: str = "") -> _M:
    """``cls`` with ``fields`` set, converting values as the module docstring says.

    Args:
        cls: a generated message class.
        fields: field name → value; ``None`` values are skipped.
        where: the path of this message in the request, for error messages.

    Returns:
        The new message.

    Raises:
        TypeError: an unknown field, or a value of the wrong type.
        ValueError: an unknown enum name, a naive datetime, a non-finite number
            of seconds, or a value protobuf refuses (out of range).
    """
    descriptor: Any = cls.DESCRIPTOR
    out = cls()
    for name, value in fields.items():
        if value is None:
            continue
        field = descriptor.fields_by_name.get(name)
        path = f"{where}.{name}" if where else name
        if field is None:
            raise TypeError(f"{descriptor.full_name} has no field {path!r}")
        target = getattr(out, name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            raise TypeError(f"{path}: map fields are not supported")
        if _is_repeated(field):
            if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
                raise TypeError(f"{path}: expected a list, got {type(value)!r}")
            items = list(value)
            if field.message_type is not None:
                target.extend(
                    _message(field.message_type, v, f"{path}[{i}]") for i, v in enumerate(items)
                )
            else:
                target.extend(_scalar(field, v, f"{path}[{i}]") for i, v in enumerate(items))
        elif field.message_type is not None:
            target.CopyFrom(_message(field.message_type, value, path))
        else:
            try:
                setattr(out, name, _scalar(field, value, path))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{path}: {exc}") from None
    return out


def new_request_id() -> str:
    """A fresh ``AppendTurns.request_id``: ``py-`` and 32 hex digits (128 random bits)."""
    return "py-" + secrets.token_hex(16)
