"""Text embedders and vector normalisation.

An :class:`Embedder` turns texts into ``(n, dim) float32`` rows of unit L2 norm, so
that an inner product between two rows is their cosine similarity. The default
embedder is WordLlama's 256-dimensional ``l2_supercat`` static embedding model
(https://github.com/dleemiller/WordLlama), whose weights and tokenizer ship inside
the ``wordllama`` wheel: loading it never touches the network. A stronger model the
operator downloaded runs through :class:`index.OnnxEmbedder` (``onnx:DIR``).

Threads: :func:`normalize` is pure. :meth:`WordLlamaEmbedder.embed` may be called
from any number of threads at once, with no lock: its tokenizer is a private copy
that is never reconfigured after construction, and the HuggingFace tokenizer's
``encode_batch`` takes it by shared reference and releases the interpreter lock, so
a large batch embedding beside a one-line query never makes the query wait for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from index.errors import DimensionMismatchError, InvalidVectorError

__all__ = ["Embedder", "WordLlamaEmbedder", "load_embedder", "normalize"]

_EMBEDDER_NAMES = ("wordllama", "none", "onnx:DIR")

_TOKENIZE_BATCH = 64
"""Texts per tokenizer call (WordLlama's own ``batch_size``)."""

_GATHER_TOKENS = 32_768
"""Most token rows gathered at once: 32 MiB of float32 at 256 dimensions."""


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
        # A private tokenizer without padding: WordLlama's own pads every batch to its
        # longest text, so one 16 KiB turn made every short text of its batch cost
        # thousands of tokens and a ``(batch, longest, 256)`` float32 array.
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_str(self._model.tokenizer.to_str())
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._table: npt.NDArray[np.float32] = np.ascontiguousarray(
            self._model.embedding, dtype=np.float32
        )
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
        return self._embed(texts, batched=True)

    def _embed(self, texts: Sequence[str], *, batched: bool) -> npt.NDArray[np.float32]:
        """:meth:`embed`, tokenizing in batches or one text at a time.

        ``encode_batch`` runs on the tokenizer's shared worker pool (rayon) with the
        interpreter lock released; a query tokenized there waits behind whatever
        batches fill the pool, so queries are tokenized one by one on the calling
        thread (``encode``), which for a short text is microseconds.

        Raises:
            TypeError: An element of ``texts`` is not a ``str``.
        """
        items = list(texts)
        if not all(isinstance(t, str) for t in items):
            raise TypeError("texts must be strings")
        pooled = np.zeros((len(items), self.dim), dtype=np.float32)
        for start in range(0, len(items), _TOKENIZE_BATCH):
            batch = items[start : start + _TOKENIZE_BATCH]
            if batched:
                encodings = self._tokenizer.encode_batch(batch, add_special_tokens=False)
            else:
                encodings = [self._tokenizer.encode(t, add_special_tokens=False) for t in batch]
            self._pool([e.ids for e in encodings], pooled[start : start + len(batch)])
        rows = np.asarray(pooled, dtype=np.float64)
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        out = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0.0)
        return np.ascontiguousarray(out, dtype=np.float32)

    def _pool(self, token_ids: list[list[int]], out: npt.NDArray[np.float32]) -> None:
        """Write the mean token embedding of each text into ``out``.

        This is WordLlama's ``avg_pool`` (``WordLlamaInference.embed``, wordllama
        0.3) without the padding: the same rows of the same table, summed in
        float32 in the same order and divided by the token count, so the result is
        bit-for-bit the library's (``tests/index/test_index_embedder.py`` checks it
        on LoCoMo turns). Gathers hold at most
        :data:`_GATHER_TOKENS` rows (``_GATHER_TOKENS * 256 * 4`` bytes); a longer
        text (about 128 KiB of English) is summed in slices of that many tokens,
        which rounds less than the library's one running float32 sum (within
        1e-4).

        Args:
            token_ids: per text, its token ids (``n`` lists; may be empty).
            out: ``(n, 256) float32`` zeros, written in place; a text without
                tokens keeps its zero row.
        """
        vocab = self._table.shape[0]
        group: list[int] = []
        tokens = 0
        for i, ids in enumerate(token_ids):
            if len(ids) > _GATHER_TOKENS:
                out[i] = self._long_mean(np.clip(np.asarray(ids, dtype=np.int64), 0, vocab - 1))
                continue
            if tokens + len(ids) > _GATHER_TOKENS:
                self._group_means(token_ids, group, out)
                group, tokens = [], 0
            if ids:
                group.append(i)
                tokens += len(ids)
        self._group_means(token_ids, group, out)

    def _group_means(
        self, token_ids: list[list[int]], group: list[int], out: npt.NDArray[np.float32]
    ) -> None:
        """Means of the texts ``group`` (each with tokens) from one gather.

        Each text's rows are summed alone (``np.add.reduce`` of its slice), not by
        one ``np.add.reduceat``: the reduce releases the interpreter lock and
        ``reduceat`` does not (it held it for 35-45 ms per 32k rows, which other
        owners' searches waited out).
        """
        if not group:
            return
        ids = np.concatenate([np.asarray(token_ids[i], dtype=np.int64) for i in group])
        np.clip(ids, 0, self._table.shape[0] - 1, out=ids)
        rows = self._table[ids]
        start = 0
        for i in group:
            end = start + len(token_ids[i])
            out[i] = np.add.reduce(rows[start:end], axis=0, dtype=np.float32) / np.float32(
                end - start
            )
            start = end

    def _long_mean(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The mean row of one text longer than :data:`_GATHER_TOKENS` tokens."""
        total = np.zeros(self.dim, dtype=np.float32)
        for start in range(0, ids.size, _GATHER_TOKENS):
            total += self._table[ids[start : start + _GATHER_TOKENS]].sum(axis=0, dtype=np.float32)
        return total / np.float32(ids.size)

    def embed_queries(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed search queries as :meth:`embed` does (WordLlama marks queries no differently).

        The texts are tokenized on the calling thread, not on the tokenizer's
        worker pool, so a query never queues behind a large append's batch.

        Raises:
            TypeError: An element of ``texts`` is not a ``str``.
        """
        return self._embed(texts, batched=False)

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
