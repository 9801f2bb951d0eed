"""Text embedders and vector normalisation.

An :class:`Embedder` turns texts into ``(n, dim) float32`` rows of unit L2 norm, so
that an inner product between two rows is their cosine similarity. The default
embedder is WordLlama's 256-dimensional ``l2_supercat`` static embedding model
(https://github.com/dleemiller/WordLlama), whose weights and tokenizer ship inside
the ``wordllama`` wheel: loading it never touches the network. A stronger model the
operator downloaded runs through :class:`index.OnnxEmbedder` (``onnx:DIR``).

Threads: :func:`normalize` is pure. :meth:`WordLlamaEmbedder.embed` may be called
from any number of threads at once; calls are serialised by an internal lock
(the shared HuggingFace tokenizer holds mutable padding state).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from index.errors import DimensionMismatchError, InvalidVectorError

__all__ = ["Embedder", "WordLlamaEmbedder", "load_embedder", "normalize"]

_EMBEDDER_NAMES = ("wordllama", "none", "onnx:DIR")


@runtime_checkable
class Embedder(Protocol):
    """Something that maps texts to unit vectors of a fixed dimension."""

    @property
    def name(self) -> str:
        """Stable model identifier stored beside vectors, e.g. ``"wordllama-l2-supercat-256"``."""
        ...

    @property
    def dim(self) -> int:
        """Length of every embedding row."""
        ...

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed texts.

        Args:
            texts: ``n`` strings.

        Returns:
            ``(n, dim) float32`` C-contiguous rows of unit L2 norm; ``(0, dim)`` when
            ``texts`` is empty. A text with no known tokens may yield an all-zero row
            (see the implementation's docstring).
        """
        ...

    def embed_queries(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed search queries: as :meth:`embed`, with the model's query mark if it has one.

        For models that mark queries apart from the texts they search (e5's
        ``"query: "`` prefix); for any other model, the same rows as :meth:`embed`.
        """
        ...


def normalize(vectors: npt.ArrayLike, dim: int | None = None) -> npt.NDArray[np.float32]:
    """Scale each row to unit L2 norm.

    Norms are computed in float64 after dividing each row by its largest absolute
    value, so very large or very small finite inputs neither overflow nor underflow.

    Args:
        vectors: One vector ``(d,)`` or a batch ``(n, d)`` of real numbers.
        dim: If given, the required ``d``.

    Returns:
        ``(n, d) float32`` C-contiguous array whose rows have unit L2 norm
        (``n == 1`` for a 1-D input; ``n == 0`` is allowed for a 2-D input).

    Raises:
        InvalidVectorError: ``vectors`` is not numeric, is complex, has ndim not in
            (1, 2), contains NaN or infinity, or has a row whose norm is zero.
        DimensionMismatchError: ``dim`` is given and ``d != dim``.
    """
    try:
        raw = np.asarray(vectors)
    except ValueError as e:  # ragged nested sequences
        raise InvalidVectorError(f"vectors are not a rectangular array: {e}") from None
    # dtype kinds: "i"/"u" integers, "f" floats; bool ("b"), complex ("c") and
    # everything else are refused. (Kinds, not np.issubdtype: this runs on every
    # query, and issubdtype costs more than the arithmetic below.)
    if raw.dtype.kind not in "iuf":
        raise InvalidVectorError(f"vectors must be real numbers, got dtype {raw.dtype}")
    if raw.ndim not in (1, 2):
        raise InvalidVectorError(f"vectors must have ndim 1 or 2, got {raw.ndim}")
    arr = raw.astype(np.float64).reshape(1, -1) if raw.ndim == 1 else raw.astype(np.float64)
    if dim is not None and arr.shape[1] != dim:
        raise DimensionMismatchError(dim, arr.shape[1])
    if not np.isfinite(arr).all():
        raise InvalidVectorError("vectors contain NaN or infinity")
    if arr.shape[0] == 0:
        return np.zeros(arr.shape, dtype=np.float32)
    scale = np.abs(arr).max(axis=1, keepdims=True) if arr.shape[1] else np.zeros((len(arr), 1))
    if (scale == 0.0).any():
        raise InvalidVectorError("vectors contain a zero-norm row")
    scaled = arr / scale
    # np.linalg.norm(scaled, axis=1, keepdims=True), spelled out: the same sum
    # (bit for bit) without the wrapper's per-call cost.
    unit = scaled / np.sqrt(np.add.reduce(scaled * scaled, axis=1, keepdims=True))
    return np.ascontiguousarray(unit, dtype=np.float32)


class WordLlamaEmbedder:
    """WordLlama ``l2_supercat`` at 256 dimensions, loaded from the installed wheel.

    Texts are tokenised, their token embeddings average-pooled, and each row scaled
    to unit L2 norm here (WordLlama's own ``norm=True`` divides by zero for empty
    text). A text with no tokens (``""``, whitespace) embeds to an **all-zero row**,
    left as zeros rather than NaN: it has no direction, scores 0 against everything,
    and :meth:`index.VectorIndex.add` rejects it with ``InvalidVectorError``, so
    callers should skip such texts (lexical search still covers them).

    Note: importing ``wordllama`` calls ``logging.basicConfig(level=INFO)`` as a side
    effect; the import is deferred to construction so ``import index`` does not.

    Attributes:
        name: ``"wordllama-l2-supercat-256"``.
        dim: ``256``.
    """

    name: str
    dim: int

    def __init__(self) -> None:
        """Load the model from the wheel's bundled files, with downloads disabled.

        Raises:
            FileNotFoundError: The wheel's weight or tokenizer files are missing.
        """
        import wordllama

        pkgdir = Path(wordllama.__file__).parent
        self._model: Any = wordllama.WordLlama.load(
            config="l2_supercat", cache_dir=pkgdir, disable_download=True, dim=256
        )
        self._lock = threading.Lock()
        self.name = "wordllama-l2-supercat-256"
        self.dim = 256

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed texts with WordLlama.

        Args:
            texts: ``n`` strings.

        Returns:
            ``(n, 256) float32`` C-contiguous; each row has unit L2 norm, except rows
            of texts without tokens, which are all zeros.

        Raises:
            TypeError: An element of ``texts`` is not a ``str``.
        """
        items = list(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        if not all(isinstance(t, str) for t in items):
            raise TypeError("texts must be strings")
        with self._lock:
            pooled: Any = self._model.embed(items, norm=False)
        rows = np.asarray(pooled, dtype=np.float64)
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        out = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0.0)
        return np.ascontiguousarray(out, dtype=np.float32)

    def embed_queries(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed search queries: WordLlama marks queries no differently (:meth:`embed`)."""
        return self.embed(texts)

    def __repr__(self) -> str:
        return f"WordLlamaEmbedder(name={self.name!r}, dim={self.dim})"


def load_embedder(name: str) -> Embedder | None:
    """Build the embedder named in configuration (``lethe serve --embedder``).

    Args:
        name: ``"wordllama"`` for :class:`WordLlamaEmbedder` (the default, shipped in
            its wheel); ``"none"`` when clients always send their own vectors;
            ``"onnx:DIR"`` for :class:`index.OnnxEmbedder` loading the ONNX model and
            tokenizer in directory ``DIR``.

    Returns:
        The embedder, or ``None`` for ``"none"``.

    Raises:
        ValueError: ``name`` is none of those (or ``onnx:`` names no directory), or
            the ONNX model's files are malformed.
        FileNotFoundError: the ONNX model's directory lacks its files.
        ImportError: ``onnx:`` without onnxruntime installed.
    """
    if name == "wordllama":
        return WordLlamaEmbedder()
    if name == "none":
        return None
    if name.startswith("onnx:") and name[len("onnx:") :]:
        from index._onnx import OnnxEmbedder

        return OnnxEmbedder(Path(name[len("onnx:") :]))
    allowed = ", ".join(repr(n) for n in _EMBEDDER_NAMES)
    raise ValueError(f"unknown embedder {name!r}; allowed values: {allowed}")
