"""An index's state as bytes: one versioned container of named arrays and a small header.

Each index (:class:`index.VectorIndex`, :class:`index.LexicalIndex`,
:class:`index.SessionIndex`, :class:`index.TimeIndex`) can hand its whole state
over as a :data:`State` (``to_state``) and be made again from one
(``from_state``), so that a caller can keep it between processes (Lethe keeps an
owner's indexes in a sealed snapshot, see ``server/retrieval/_snapshot.py``).
This module turns a state into bytes and back. It knows arrays and names only;
what they mean is each index's business, and whatever holds the bytes must
protect them: they are derived from plaintext (vectors, terms). Nothing here
writes a file.

Layout of a container (every integer little-endian)::

    offset  size  field
    0       8     magic b"lethe-ix"
    8       4     format, unsigned (FORMAT = 1)
    12      4     header length H in bytes, unsigned
    16      H     header: UTF-8 JSON {"meta": {...}, "arrays": [[name, dtype, shape,
                  offset, nbytes], ...]}
    16 + H  pad   zeros up to the next multiple of ALIGN (64) bytes: the body starts there
    body    ...   each array's bytes, C order, at ``body + offset`` (offsets are
                  multiples of ALIGN; zeros between arrays)

Only the dtypes of :data:`DTYPES` are accepted (never an object array), so
reading a container runs no code and allocates only what its header states.
Readers refuse another magic or format; a change of layout bumps
:data:`FORMAT`.

Threads: the functions are pure; any thread.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "ALIGN",
    "DTYPES",
    "FORMAT",
    "MAGIC",
    "Pieces",
    "State",
    "StateReader",
    "combine",
    "dumps",
    "loads",
    "pack",
    "pack_stream",
    "separate",
    "strings_from_arrays",
    "strings_to_arrays",
    "unpack",
]

MAGIC = b"lethe-ix"
"""The first 8 bytes of every container."""
FORMAT = 1
"""Container format written and the only one read."""
ALIGN = 64
"""Alignment in bytes of the body and of every array in it."""
DTYPES = frozenset({"<i8", "<i4", "<f4", "<f8", "|u1", "|b1"})
"""Array dtypes (numpy ``dtype.str``) a container may hold: int64, int32, float32,
float64, uint8 and bool."""
_PREFIX = struct.Struct("<8sII")

State = tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]
"""``(meta, arrays)``: JSON-able metadata (str keys; str, int, float, bool, None,
lists and dicts of them) and named arrays of :data:`DTYPES`."""


def _pad(n: int) -> int:
    return -n % ALIGN


@dataclass(frozen=True)
class Pieces:
    """An array of a state handed over a piece at a time when packed (:func:`pack_stream`).

    For an array too large to copy whole beside the index that holds it (an
    owner's vectors while its snapshot is written). ``pieces()`` yields arrays
    of ``dtype`` whose bytes, in C order and one after the other, are the
    array's; it may raise to abandon the pack (the consumer of the stream sees
    the exception).

    Attributes:
        dtype: One of :data:`DTYPES`, little-endian.
        shape: The whole array's shape.
        pieces: Makes the pieces' iterator; called once per pack.
    """

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    pieces: Callable[[], Iterator[npt.NDArray[Any]]]

    @property
    def nbytes(self) -> int:
        """The whole array's bytes."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def pack_stream(
    meta: Mapping[str, Any], arrays: Mapping[str, npt.NDArray[Any] | Pieces]
) -> tuple[int, Iterator[memoryview]]:
    """The container of a state as ``(size in bytes, its buffers in order)``, made as read.

    As :func:`pack`, and an array may be :class:`Pieces`: its pieces are asked
    for only when the stream reaches it, each viewed, not copied; a consumer
    that is done with a buffer before asking for the next holds one piece at a
    time.

    Raises:
        ValueError: An array's dtype is not in :data:`DTYPES`, or ``meta`` is not
            JSON-able; from the stream, a :class:`Pieces` whose pieces are of
            another dtype or hold another number of bytes than its shape.
    """
    entries: list[list[Any]] = []
    bodies: list[npt.NDArray[Any] | Pieces] = []
    offset = 0
    for name, array in arrays.items():
        if isinstance(array, Pieces):
            if array.dtype.str not in DTYPES:
                raise ValueError(f"array {name!r} has dtype {array.dtype}, not one of {DTYPES}")
            body: npt.NDArray[Any] | Pieces = array
            kind, shape = array.dtype.str, list(array.shape)
        else:
            arr = np.ascontiguousarray(array)
            if arr.dtype.str not in DTYPES:
                little = arr.dtype.newbyteorder("<")
                if little.str not in DTYPES:
                    raise ValueError(f"array {name!r} has dtype {arr.dtype}, not one of {DTYPES}")
                arr = arr.astype(little)
            body, kind, shape = arr, arr.dtype.str, list(arr.shape)
        entries.append([name, kind, shape, offset, body.nbytes])
        bodies.append(body)
        offset += body.nbytes + _pad(body.nbytes)
    try:
        header = json.dumps({"meta": meta, "arrays": entries}, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"state metadata is not JSON-able: {exc}") from None
    head = _PREFIX.pack(MAGIC, FORMAT, len(header)) + header
    head += bytes(_pad(len(head)))

    def stream() -> Iterator[memoryview]:
        yield memoryview(head)
        for body in bodies:
            if isinstance(body, Pieces):
                yield from _pieces_of(body)
            else:
                yield memoryview(body.reshape(-1).view(np.uint8).data)
            if _pad(body.nbytes):
                yield memoryview(bytes(_pad(body.nbytes)))

    return len(head) + offset, stream()


def _pieces_of(array: Pieces) -> Iterator[memoryview]:
    got = 0
    for piece in array.pieces():
        part = np.ascontiguousarray(piece)
        if part.dtype.str != array.dtype.str:
            raise ValueError(f"a piece of dtype {part.dtype}, not {array.dtype}")
        got += part.nbytes
        if got > array.nbytes:
            raise ValueError(f"pieces hold more than the array's {array.nbytes} bytes")
        yield memoryview(part.reshape(-1).view(np.uint8).data)
    if got != array.nbytes:
        raise ValueError(f"pieces hold {got} bytes, not the array's {array.nbytes}")


def pack(meta: Mapping[str, Any], arrays: Mapping[str, npt.NDArray[Any]]) -> list[memoryview]:
    """The container of a state, as buffers to write one after the other (no copy of the arrays).

    Args:
        meta: JSON-able metadata.
        arrays: Named arrays; each must have a dtype of :data:`DTYPES` (in any
            byte order: big-endian ones are converted).

    Returns:
        Buffers whose concatenation is the container; arrays that are already
        little-endian and C-contiguous are viewed, not copied. They stay valid
        while the arrays do.

    Raises:
        ValueError: An array's dtype is not in :data:`DTYPES`, or ``meta`` is not
            JSON-able.
    """
    return list(pack_stream(meta, arrays)[1])


def unpack(buf: bytes | bytearray | memoryview) -> State:
    """Read a container.

    Args:
        buf: The whole container.

    Returns:
        ``(meta, arrays)``; each array is a view into ``buf`` (writable only if
        ``buf`` is), so a caller that keeps an array past ``buf`` copies it.

    Raises:
        ValueError: ``buf`` is not a container of :data:`FORMAT`: another magic,
            another format, a header that is not JSON of the layout above, a
            dtype outside :data:`DTYPES`, or an array outside ``buf``.
    """
    view = memoryview(buf).cast("B")
    meta, entries = _header(view, len(view))
    arrays: dict[str, npt.NDArray[Any]] = {}
    for entry in entries:
        raw = np.frombuffer(view, dtype=entry.kind, count=entry.count, offset=entry.lo)
        arrays[entry.name] = raw.reshape(entry.shape)
    return meta, arrays


@dataclass(frozen=True, slots=True)
class _Entry:
    """One array of a container's header, checked: where its bytes lie in the container."""

    name: str
    kind: np.dtype[Any]
    shape: tuple[int, ...]
    count: int
    lo: int  # offset of its first byte in the container
    nbytes: int


def _header(view: memoryview, size: int) -> tuple[dict[str, Any], list[_Entry]]:
    """The metadata and the checked array entries of a container of ``size`` bytes.

    ``view`` holds at least the container's prefix and header.

    Raises:
        ValueError: as :func:`unpack`; also when ``view`` ends inside the header.
    """
    if len(view) < _PREFIX.size:
        raise ValueError("not an index state: too short")
    magic, fmt, head = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise ValueError("not an index state: bad magic")
    if fmt != FORMAT:
        raise ValueError(f"index state format {fmt} is not {FORMAT}")
    start = _PREFIX.size + head
    if start > min(size, len(view)):
        raise ValueError("index state header runs past the end")
    try:
        header = json.loads(bytes(view[_PREFIX.size : start]))
        meta, entries = header["meta"], header["arrays"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("index state header is malformed") from None
    if not isinstance(meta, dict) or not isinstance(entries, list):
        raise ValueError("index state header is malformed")
    body = start + _pad(start)
    out: list[_Entry] = []
    for entry in entries:
        try:
            name, dtype, shape, offset, nbytes = entry
            shape = tuple(int(s) for s in shape)
        except (ValueError, TypeError):
            raise ValueError("index state header is malformed") from None
        if not isinstance(name, str) or dtype not in DTYPES or min(shape, default=0) < 0:
            raise ValueError(f"index state array {name!r} is malformed")
        kind = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if not isinstance(offset, int) or offset < 0 or nbytes != count * kind.itemsize:
            raise ValueError(f"index state array {name!r} is malformed")
        lo = body + offset
        if lo + nbytes > size:
            raise ValueError(f"index state array {name!r} runs past the end")
        out.append(_Entry(name, kind, shape, count, lo, nbytes))
    return meta, out


class StateReader:
    """Reads a container as it arrives in pieces, each array into memory of its own.

    :func:`unpack` returns views into one buffer, so no array's memory is freed
    before all are. Arrays read here are separate allocations: a caller that
    makes an index from each part and drops the part frees it at once, so a
    state is never held twice over (Lethe's snapshot load: the whole container,
    then every leg made from it).

    Args:
        size: The container's length in bytes.

    Usage: :meth:`write` every piece in order, then :meth:`state`.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._at = 0  # container bytes received
        self._head = bytearray()  # bytes received until the header is read
        self._meta: dict[str, Any] | None = None
        self._entries: list[_Entry] = []
        self._arrays: dict[str, npt.NDArray[Any]] = {}
        self._targets: list[tuple[int, int, memoryview]] = []  # (lo, hi, bytes), by lo
        self._next = 0  # first target that may still receive bytes
        self._taken = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Take the next ``len(data)`` bytes of the container.

        Raises:
            ValueError: more bytes than ``size``, or a malformed header (as :func:`unpack`).
        """
        piece = memoryview(data).cast("B")
        if self._at + len(piece) > self._size:
            raise ValueError("index state longer than its stated size")
        if self._meta is None:
            self._head += piece
            self._at += len(piece)
            if len(self._head) < _PREFIX.size:
                return
            head = _PREFIX.unpack_from(self._head)[2]
            if len(self._head) < min(_PREFIX.size + head, self._size):
                return
            self._meta, self._entries = _header(memoryview(self._head), self._size)
            arrays = [(e.lo, np.empty(e.count, e.kind)) for e in self._entries]
            self._arrays = {e.name: a for e, (_, a) in zip(self._entries, arrays, strict=True)}
            self._targets = sorted(
                ((lo, lo + a.nbytes, a.data.cast("B")) for lo, a in arrays),
                key=lambda t: t[0],
            )
            held, self._head = self._head, bytearray()
            self._fill(0, memoryview(held))
            return
        self._fill(self._at, piece)
        self._at += len(piece)

    def _fill(self, at: int, piece: memoryview) -> None:
        """Copy ``piece`` (container bytes from offset ``at``) into the arrays it covers."""
        end = at + len(piece)
        targets = self._targets
        while self._next < len(targets) and targets[self._next][1] <= at:
            self._next += 1
        for lo, hi, target in targets[self._next :]:
            if lo >= end:
                break
            a, b = max(lo, at), min(hi, end)
            if a < b:
                target[a - lo : b - lo] = piece[a - at : b - at]

    def state(self) -> State:
        """The state read: ``(meta, arrays)``, each array its own allocation.

        The reader lets go of the arrays (a second call raises): once the caller
        drops one, its memory is freed.

        Raises:
            ValueError: fewer bytes than ``size`` arrived, or the state was taken already.
        """
        if self._meta is None or self._at != self._size or self._taken:
            raise ValueError("index state cut short")
        arrays = {e.name: self._arrays[e.name].reshape(e.shape) for e in self._entries}
        self._arrays, self._targets, self._entries, self._taken = {}, [], [], True
        return self._meta, arrays


def dumps(state: State) -> bytes:
    """The container of ``state`` as one bytes object (see :func:`pack`).

    Raises:
        ValueError: as :func:`pack`.
    """
    return b"".join(pack(*state))


def loads(buf: bytes | bytearray | memoryview) -> State:
    """A state read from one container (see :func:`unpack`).

    Raises:
        ValueError: as :func:`unpack`.
    """
    return unpack(buf)


_A = TypeVar("_A", npt.NDArray[Any], npt.NDArray[Any] | Pieces)


def combine(
    parts: Mapping[str, tuple[dict[str, Any], Mapping[str, _A]]],
) -> tuple[dict[str, Any], dict[str, _A]]:
    """One state holding several, each under its name: arrays ``"{name}/{array}"``.

    Names must not contain ``/``. Arrays may be :class:`Pieces` (for :func:`pack_stream`).

    Raises:
        ValueError: A part's name contains ``/``.
    """
    meta: dict[str, Any] = {}
    arrays: dict[str, _A] = {}
    for part, (part_meta, part_arrays) in parts.items():
        if "/" in part:
            raise ValueError(f"part name {part!r} contains '/'")
        meta[part] = part_meta
        arrays.update({f"{part}/{name}": arr for name, arr in part_arrays.items()})
    return meta, arrays


def separate(state: State, names: Sequence[str]) -> dict[str, State]:
    """The parts :func:`combine` put in ``state``, by name.

    Raises:
        ValueError: A named part is missing.
    """
    meta, arrays = state
    out: dict[str, State] = {}
    for part in names:
        if not isinstance(meta.get(part), dict):
            raise ValueError(f"index state has no part {part!r}")
        prefix = f"{part}/"
        out[part] = (
            meta[part],
            {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)},
        )
    return out


def strings_to_arrays(
    strings: Sequence[str],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Strings as one UTF-8 blob and their offsets: ``(blob (b,) uint8, offsets (n + 1,) int64)``.

    String ``i`` is ``blob[offsets[i]:offsets[i + 1]]``.
    """
    raw = [s.encode() for s in strings]
    offsets = np.zeros(len(raw) + 1, dtype=np.int64)
    if raw:
        np.cumsum(np.fromiter(map(len, raw), np.int64, count=len(raw)), out=offsets[1:])
    return np.frombuffer(b"".join(raw), dtype=np.uint8).copy(), offsets


def strings_from_arrays(blob: npt.NDArray[Any], offsets: npt.NDArray[Any]) -> list[str]:
    """The strings :func:`strings_to_arrays` made.

    Raises:
        ValueError: The offsets do not fit the blob, or a string is not UTF-8.
    """
    if blob.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1:
        raise ValueError("malformed string arrays")
    ends = offsets.tolist()
    if ends[0] != 0 or ends[-1] != len(blob) or any(a > b for a, b in itertools.pairwise(ends)):
        raise ValueError("malformed string offsets")
    raw = blob.tobytes()
    try:
        return [raw[a:b].decode() for a, b in itertools.pairwise(ends)]
    except UnicodeDecodeError:
        raise ValueError("a string is not UTF-8") from None
