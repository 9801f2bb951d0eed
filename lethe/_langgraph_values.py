"""The values side of :mod:`lethe.langgraph`: JSON from ``Struct``, LangGraph's filters, cosine.

Pure functions, no calls: how an item's value comes back from its
memory's ``metadata`` (:func:`from_value`), LangGraph's filter and
namespace-condition semantics (:func:`matches_filter`,
:func:`condition_holds`, as ``langgraph.store.memory.InMemoryStore`` applies
them), the namespace label rule (:func:`check_labels`), and the cosine
similarity that scores a query against an item's vectors when the store has
an ``index`` with ``embed`` (:func:`cosine`).

Imports langgraph-checkpoint, protobuf and the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import struct_pb2
from langgraph.store.base import InvalidNamespaceError, MatchCondition

__all__ = [
    "check_labels",
    "condition_holds",
    "cosine",
    "from_value",
    "matches_filter",
    "similarity",
    "truncate",
]

_EXACT = float(2**53)


def from_value(value: struct_pb2.Value) -> Any:
    """A ``google.protobuf.Value`` as Python, integral doubles back to ints (within ±2**53).

    One pass over the message (no JSON mapping in between).

    Args:
        value: a ``Value`` of a memory's ``metadata``.

    Returns:
        dict, list, str, bool, int, float or None.
    """
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {k: from_value(v) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [from_value(v) for v in value.list_value.values]
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() and abs(number) <= _EXACT else number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    return None


def _compare(item_value: Any, filter_value: Any) -> bool:
    """LangGraph's filter semantics: nested equality and ``$`` operators."""
    if isinstance(filter_value, dict):
        if any(k.startswith("$") for k in filter_value):
            return all(_operator(item_value, op, v) for op, v in filter_value.items())
        if not isinstance(item_value, dict):
            return False
        return all(_compare(item_value.get(k), v) for k, v in filter_value.items())
    if isinstance(filter_value, (list, tuple)):
        return (
            isinstance(item_value, (list, tuple))
            and len(item_value) == len(filter_value)
            and all(_compare(i, f) for i, f in zip(item_value, filter_value, strict=True))
        )
    return bool(item_value == filter_value)


def _operator(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    if op in ("$gt", "$gte", "$lt", "$lte"):
        left, right = float(value), float(operand)
        return {
            "$gt": left > right,
            "$gte": left >= right,
            "$lt": left < right,
            "$lte": left <= right,
        }[op]
    raise ValueError(f"Unsupported operator: {op}")


def _at(value: Mapping[str, Any], key: str) -> Any:
    """The value at a filter key: the key itself, else a dotted path into nested objects."""
    if key in value or "." not in key:
        return value.get(key)
    found: Any = value
    for part in key.split("."):
        if not isinstance(found, Mapping) or part not in found:
            return None
        found = found[part]
    return found


def matches_filter(value: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """Whether an item's value passes a LangGraph ``filter``.

    Each key names a top-level field, or, when no field has that name, a
    dotted path into nested objects (``"user.level"``, as LangGraph's SQL
    stores read it); its condition is a value (nested equality) or a mapping
    of ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``.

    Raises:
        ValueError: an unknown ``$`` operator.
    """
    return not flt or all(_compare(_at(value, k), v) for k, v in flt.items())


def condition_holds(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise ValueError(f"Unsupported match type: {condition.match_type}")
    return all(p == "*" or n == p for n, p in pairs)


def check_labels(namespace: Sequence[str]) -> None:
    for label in namespace:
        if not isinstance(label, str) or not label or "." in label or "\x00" in label:
            raise InvalidNamespaceError(
                f"Invalid namespace label {label!r} in {tuple(namespace)}: labels are "
                "non-empty strings without periods or NUL bytes"
            )


def truncate(text: str, limit: int) -> str:
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[:limit].decode(errors="ignore")


def cosine(query: Sequence[float], vector: Sequence[float]) -> float:
    """Cosine similarity of two vectors, as LangGraph's ``InMemoryStore`` scores.

    Args:
        query: the query's embedding, ``(d,)`` floats.
        vector: an item's embedding, ``(d,)`` floats.

    Returns:
        ``q·v / (|q| |v|)`` in [-1, 1]; 0.0 when either is the zero vector.

    Raises:
        ValueError: the dimensions differ.
    """
    if len(query) != len(vector):
        raise ValueError(f"dimension {len(vector)} differs from the query's {len(query)}")
    dot = math.fsum(q * v for q, v in zip(query, vector, strict=True))
    norms = math.sqrt(math.fsum(q * q for q in query)) * math.sqrt(math.fsum(v * v for v in vector))
    return dot / norms if norms else 0.0


def similarity(query: Sequence[float], vector: Sequence[float], distance: str) -> float:
    """The score of an item's vector for a query, as LangGraph's stores' ``distance_type`` says.

    Args:
        query: the query's embedding, ``(d,)`` floats.
        vector: an item's embedding, ``(d,)`` floats.
        distance: ``"cosine"`` (cosine similarity), ``"inner_product"`` (the
            dot product) or ``"l2"`` (the negated Euclidean distance, so that
            higher is nearer), the ``distance_type`` of LangGraph's Postgres
            store's index config.

    Returns:
        The score; higher is more similar.

    Raises:
        ValueError: an unknown ``distance``; the dimensions differ.
    """
    if distance == "cosine":
        return cosine(query, vector)
    if len(query) != len(vector):
        raise ValueError(f"dimension {len(vector)} differs from the query's {len(query)}")
    if distance == "inner_product":
        return math.fsum(q * v for q, v in zip(query, vector, strict=True))
    if distance == "l2":
        return -math.sqrt(math.fsum((q - v) ** 2 for q, v in zip(query, vector, strict=True)))
    raise ValueError(f"unknown distance_type {distance!r} (cosine, inner_product or l2)")
