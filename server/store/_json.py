"""The JSON codec of the store's rows and of the plaintext of memory payloads.

orjson writes and reads RFC 8259 JSON — the bytes ``json`` wrote before and
still reads — in a fraction of the time: on this machine a turn's row decodes in
4.6 µs instead of 28.6 µs and encodes in 15 µs instead of 65 µs, and every search
hit, index build, append and forget decodes or encodes rows. Non-string keys
are written as strings, as ``json`` did.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["dumps", "loads"]


def dumps(value: Any) -> bytes:
    """Compact JSON bytes of ``value`` (dicts, lists, str, int, float, bool, None).

    Raises:
        TypeError: a value JSON cannot hold (orjson.JSONEncodeError).
    """
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """The value of JSON bytes.

    Raises:
        ValueError: not JSON (orjson.JSONDecodeError).
    """
    return orjson.loads(raw)
