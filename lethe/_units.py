"""The units of Lethe's command lines: durations and byte sizes.

One grammar of each, shared by ``lethe probe`` (:mod:`lethe.probe`, a client
of the API) and the server's command line (:mod:`server.cli`), which may
both import this module; it imports nothing of the project. Each parser is
an ``argparse`` type: it raises :class:`argparse.ArgumentTypeError` with a
message naming the bad value and an example of a good one.
"""

from __future__ import annotations

import argparse
import re

__all__ = ["parse_duration", "parse_message_size", "parse_size"]

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


def parse_duration(text: str) -> float:
    """Parse ``72h``, ``30s``, ``5m``, ``1h30m``, ``500ms`` or ``1d`` into seconds.

    Args:
        text: one or more ``NUMBER UNIT`` parts with no spaces; units ``ms``,
            ``s``, ``m``, ``h``, ``d``.

    Returns:
        The duration in seconds (> 0).

    Raises:
        argparse.ArgumentTypeError: malformed, or zero.
    """
    parts = _DURATION_RE.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (examples: 72h, 30m, 1h30m)")
    seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise argparse.ArgumentTypeError("duration must be positive")
    return seconds


def parse_size(text: str) -> int:
    """Parse a store size (``64GiB``, ``512MiB``, ``10GB`` or bytes) into bytes (≥ 1 MiB).

    Raises:
        argparse.ArgumentTypeError: malformed, or below 1 MiB.
    """
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 64GiB, 512MiB, 10GB)")
    size = int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    if size < 1 << 20:
        raise argparse.ArgumentTypeError("the store's maximum size must be at least 1MiB")
    return size


def parse_message_size(text: str) -> int:
    """Parse a gRPC message limit (``16MiB``, ``512KiB``, ``1048576``) into bytes (< 2 GiB).

    Raises:
        argparse.ArgumentTypeError: malformed, zero, or 2 GiB or more (too large for gRPC).
    """
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 16MiB, 512KiB, 65536)")
    size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
    if not 0 < size < 1 << 31:
        raise argparse.ArgumentTypeError("size must be positive and below 2GiB")
    return size
