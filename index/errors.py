"""Errors raised by the ``index`` package.

Exception tree::

    VectorIndexError              every failure this package raises on purpose
    ├── DimensionMismatchError    a vector's length differs from the index's or embedder's dim
    └── InvalidVectorError        non-finite values, a zero-norm row, or ndim not in (1, 2)

Argument errors that are programming mistakes rather than bad vectors (``k <= 0``,
ids that are not 1-D integers, ``ids``/``vectors`` of different lengths, an unknown
embedder name) raise the built-in ``ValueError``.

The gRPC mapping lives at the server's boundary, not here; both subclasses are
client-argument errors (``INVALID_ARGUMENT``) when the vector came from a client.
"""

from __future__ import annotations

__all__ = [
    "DimensionMismatchError",
    "IndexChangedError",
    "InvalidVectorError",
    "VectorIndexError",
]


class VectorIndexError(Exception):
    """Base class of every deliberate error raised by ``index``."""


class DimensionMismatchError(VectorIndexError):
    """A vector's dimension differs from the one expected.

    Attributes:
        expected: The dimension required (the index's or embedder's ``dim``).
        actual: The dimension received.
    """

    def __init__(self, expected: int, actual: int) -> None:
        """Build the error.

        Args:
            expected: The dimension required.
            actual: The dimension received.
        """
        super().__init__(f"vector dimension {actual} does not match expected dimension {expected}")
        self.expected = expected
        self.actual = actual


class InvalidVectorError(VectorIndexError):
    """A vector cannot be indexed or searched: non-finite, zero norm, or wrong ndim."""


class IndexChangedError(VectorIndexError):
    """The index changed while its state was handed over in pieces (the pack is abandoned)."""
