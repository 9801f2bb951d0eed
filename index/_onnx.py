"""A sentence-embedding model in ONNX, loaded from a directory the operator gives.

:class:`OnnxEmbedder` runs any BERT-style sentence encoder exported to ONNX (for
example ``sentence-transformers/all-MiniLM-L6-v2`` or ``intfloat/multilingual-e5-small``
as exported by Hugging Face Optimum) with ``onnxruntime``, tokenised by the
``tokenizers`` library from the model's ``tokenizer.json``. Nothing is downloaded:
the operator puts the files in a directory and starts ``lethe serve --embedder
onnx:DIR``. Both libraries are the ``onnx`` extra (``pip install 'lethe-store[onnx]'``).

The directory holds:

- ``model.onnx`` (or ``onnx/model.onnx``): inputs ``input_ids`` and optionally
  ``attention_mask`` and ``token_type_ids`` (``(batch, tokens) int64``); its first
  output is either token states ``(batch, tokens, dim)`` — mean-pooled over the
  attention mask, as Sentence-BERT does (Reimers and Gurevych, EMNLP 2019) — or, when
  an output is named ``sentence_embedding``, that ``(batch, dim)`` output;
- ``tokenizer.json``: a ``tokenizers`` tokenizer (its own truncation and padding
  settings are replaced: truncation at ``max_length``, padding to the longest text);
- optionally ``lethe-embedder.json``: ``{"query_prefix": "query: ", "text_prefix":
  "passage: ", "max_length": 256, "pooling": "mean" | "cls", "threads": 1}``. E5
  models need their prefixes (Wang et al., "Text Embeddings by Weakly-Supervised
  Contrastive Pre-training", arXiv:2212.03533); the defaults are no prefix, 256
  tokens, mean pooling, one intra-op thread.

Every row is scaled to unit L2 norm (rows without tokens stay all zeros, as
:class:`index.WordLlamaEmbedder` does). The :attr:`OnnxEmbedder.name` stored beside
the vectors is ``onnx-<directory name>-<first 12 hex digits of the SHA-256 of the
model, tokenizer and configuration files>``, so another model — or the same one with
other weights or prefixes — is a different embedder, and the server re-embeds.

Threads: :meth:`OnnxEmbedder.embed` may be called from any thread; tokenisation is
serialised by a lock, ``InferenceSession.run`` is thread-safe.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["OnnxEmbedder"]

CONFIG_FILE = "lethe-embedder.json"
_CONFIG_KEYS = {"query_prefix", "text_prefix", "max_length", "pooling", "threads"}
_BATCH = 32


def _model_path(directory: Path) -> Path:
    for candidate in (directory / "model.onnx", directory / "onnx" / "model.onnx"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no model.onnx in {directory} (nor in {directory / 'onnx'})")


def _digest(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:12]


class OnnxEmbedder:
    """A sentence encoder in ONNX with its ``tokenizers`` tokenizer (module docstring).

    Args:
        directory: The model's directory.

    Attributes:
        name: ``onnx-<directory name>-<12 hex digits>`` (module docstring).
        dim: The embedding dimension, read from the model's output.

    Raises:
        ImportError: ``onnxruntime`` or ``tokenizers`` is not installed.
        FileNotFoundError: ``model.onnx`` or ``tokenizer.json`` is missing.
        ValueError: the configuration file is malformed, or the model's inputs or
            outputs are not those of a sentence encoder.
    """

    name: str
    dim: int

    def __init__(self, directory: Path) -> None:
        try:
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError(
                "the ONNX embedder needs onnxruntime and tokenizers: "
                "pip install 'lethe-store[onnx]'"
            ) from e
        directory = Path(directory)
        model = _model_path(directory)
        tok_path = directory / "tokenizer.json"
        if not tok_path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {directory}")
        cfg_path = directory / CONFIG_FILE
        config: dict[str, Any] = {}
        if cfg_path.is_file():
            try:
                config = json.loads(cfg_path.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{cfg_path} is not JSON: {e}") from None
            if not isinstance(config, dict) or set(config) - _CONFIG_KEYS:
                raise ValueError(f"{cfg_path}: keys must be among {sorted(_CONFIG_KEYS)}")
        self._query_prefix = str(config.get("query_prefix", ""))
        self._text_prefix = str(config.get("text_prefix", ""))
        self._pooling = str(config.get("pooling", "mean"))
        if self._pooling not in ("mean", "cls"):
            raise ValueError(f"{cfg_path}: pooling must be 'mean' or 'cls'")
        max_length = int(config.get("max_length", 256))
        threads = int(config.get("threads", 1))
        if max_length < 2 or threads < 1:
            raise ValueError(f"{cfg_path}: max_length must be >= 2 and threads >= 1")

        self._tokenizer: Any = Tokenizer.from_file(str(tok_path))
        self._tokenizer.enable_truncation(max_length=max_length)
        pad_id = self._tokenizer.token_to_id("[PAD]")
        if pad_id is None:
            pad_id = self._tokenizer.token_to_id("<pad>") or 0
        self._tokenizer.enable_padding(pad_id=pad_id)
        self._lock = threading.Lock()

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session: Any = onnxruntime.InferenceSession(
            str(model), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._inputs = [i.name for i in self._session.get_inputs()]
        if "input_ids" not in self._inputs or set(self._inputs) - {
            "input_ids",
            "attention_mask",
            "token_type_ids",
        }:
            raise ValueError(
                f"{model}: inputs must be input_ids [, attention_mask, token_type_ids], "
                f"got {self._inputs}"
            )
        outputs = self._session.get_outputs()
        names = [o.name for o in outputs]
        self._output = "sentence_embedding" if "sentence_embedding" in names else names[0]
        shape = next(o.shape for o in outputs if o.name == self._output)
        if len(shape) not in (2, 3):
            raise ValueError(f"{model}: output {self._output} has rank {len(shape)}, not 2 or 3")
        self._pooled = len(shape) == 2
        last = shape[-1]
        self.dim = int(last) if isinstance(last, int) else int(self._run(["dim"]).shape[1])
        files = [model, tok_path] + ([cfg_path] if cfg_path.is_file() else [])
        self.name = f"onnx-{directory.resolve().name}-{_digest(files)}"

    def _run(self, texts: list[str]) -> npt.NDArray[np.float64]:
        """Pooled, unnormalised rows ``(n, dim) float64`` of ``texts`` (already prefixed)."""
        with self._lock:
            encodings = self._tokenizer.encode_batch(texts)
        ids = np.asarray([e.ids for e in encodings], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
        feed = {"input_ids": ids}
        if "attention_mask" in self._inputs:
            feed["attention_mask"] = mask
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.asarray([e.type_ids for e in encodings], dtype=np.int64)
        (out,) = self._session.run([self._output], feed)
        states = np.asarray(out, dtype=np.float64)
        if self._pooled:
            return states
        if self._pooling == "cls":
            return states[:, 0, :]
        weights = mask[:, :, None].astype(np.float64)
        counts = np.maximum(weights.sum(axis=1), 1.0)
        return np.asarray((states * weights).sum(axis=1) / counts, dtype=np.float64)

    def _embed(self, texts: Sequence[str], prefix: str) -> npt.NDArray[np.float32]:
        items = list(texts)
        if not all(isinstance(t, str) for t in items):
            raise TypeError("texts must be strings")
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = np.zeros((len(items), self.dim), dtype=np.float64)
        live = [i for i, t in enumerate(items) if t.strip()]
        for start in range(0, len(live), _BATCH):
            part = live[start : start + _BATCH]
            rows[part] = self._run([prefix + items[i] for i in part])
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        out = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0.0)
        return np.ascontiguousarray(out, dtype=np.float32)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed texts to be searched (with the configured ``text_prefix``).

        Args:
            texts: ``n`` strings.

        Returns:
            ``(n, dim) float32`` C-contiguous; rows of unit L2 norm, all zeros for a
            text that is empty or whitespace.

        Raises:
            TypeError: An element of ``texts`` is not a ``str``.
        """
        return self._embed(texts, self._text_prefix)

    def embed_queries(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed search queries (with the configured ``query_prefix``); as :meth:`embed`."""
        return self._embed(texts, self._query_prefix)

    def __repr__(self) -> str:
        return f"OnnxEmbedder(name={self.name!r}, dim={self.dim})"
