"""Type aliases of the typed client's arguments.

:mod:`lethe.client._build` holds the conversions behind them.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any, TypeVar, Union

from google.protobuf import duration_pb2, timestamp_pb2

_T = TypeVar("_T")

MessageOr = Union[_T, Mapping[str, Any]]  # noqa: UP007 (a generic alias needs Union)
"""A message, or a ``dict`` of its fields (nested messages as dicts too)."""

EnumOr = Union[_T, str]  # noqa: UP007
"""An enum value, or its name (``"USER"``)."""

TimeLike = Union[timestamp_pb2.Timestamp, _dt.datetime, float]  # noqa: UP007
"""A ``Timestamp``, an aware ``datetime``, or seconds since the Unix epoch."""

DurationLike = Union[duration_pb2.Duration, _dt.timedelta, float]  # noqa: UP007
"""A ``Duration``, a ``timedelta``, or seconds."""

Metadata = tuple[tuple[str, str], ...]
"""Call metadata as gRPC takes it: ``(key, value)`` pairs."""
