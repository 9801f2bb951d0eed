"""The vectors and texts of the scale benchmark (``bench_scale.py``).

Two kinds of vectors, both ``(n, 256) float32`` rows of unit L2 norm:

- ``random``: standard normal rows scaled to unit norm (numpy's PCG64, seeded);
  their queries are drawn the same way from another seed.
- ``real``: WordLlama ``l2_supercat`` embeddings (``index.WordLlamaEmbedder``,
  exactly what the server computes with ``--embedder wordllama``) of
  LoCoMo-derived turns ``"speaker: text"``; the queries are the LoCoMo
  questions embedded the same way.

LoCoMo has 5,882 turns. Larger owners repeat them with small textual
variations (an interjection before the text and a tag after it, see
:func:`varied_texts`) so that every text stays distinct and its vector moves a
little. Both kinds carry the same texts, so lexical search has real words.

Embeddings are cached outside the repository (``~/.cache/lethe-bench`` by
default), keyed by a SHA-256 of the model name and the texts; LoCoMo itself is
read in place (``lethe.locomo.find_locomo``) and never copied.

Imports numpy, ``index`` (for the embedder) and ``lethe.locomo``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from lethe.locomo import find_locomo, load_locomo, sample_conversation

__all__ = [
    "DIM",
    "Corpus",
    "EmbeddingCache",
    "load_corpus",
    "random_unit",
    "varied_texts",
]

DIM = 256
"""Vector dimension of both kinds (WordLlama ``l2_supercat`` at 256)."""

Vectors = npt.NDArray[np.float32]

_PREFIXES = (
    "",
    "Also, ",
    "By the way, ",
    "Oh, ",
    "Well, ",
    "Honestly, ",
    "Anyway, ",
    "So, ",
    "Actually, ",
    "You know, ",
    "Right, ",
    "Hey, ",
)
_SUFFIXES = (
    "",
    " Really.",
    " Just saying.",
    " Anyway.",
    " Ha.",
    " Right?",
    " You know?",
    " Cheers.",
    " For sure.",
    " Indeed.",
    " Truly.",
    " Yes.",
)


def random_unit(n: int, seed: int, dim: int = DIM) -> Vectors:
    """Random unit vectors.

    Args:
        n: Number of rows.
        seed: Seed of numpy's default generator (PCG64).
        dim: Row length.

    Returns:
        ``(n, dim) float32`` C-contiguous, each row of unit L2 norm.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x)


def varied_texts(base: list[tuple[str, str]], n: int) -> list[str]:
    """``n`` distinct turn texts from ``base`` turns, repeated with small variations.

    Copy ``k`` (turns ``k * len(base)`` to ``(k + 1) * len(base) - 1``) of turn
    ``(speaker, text)`` reads ``"speaker: <prefix>text<suffix>"`` with prefix
    ``k % 12`` and suffix ``(k // 12) % 12`` of fixed lists; copy 0 is the turn
    as it is. From copy 144 on (847k turns of LoCoMo) a copy number ``" #k"`` is
    appended as well.

    Args:
        base: ``(speaker, text)`` turns, non-empty.
        n: Number of texts wanted.

    Returns:
        ``n`` texts.
    """
    out: list[str] = []
    period = len(_PREFIXES) * len(_SUFFIXES)
    k = 0
    while len(out) < n:
        prefix = _PREFIXES[k % len(_PREFIXES)]
        suffix = _SUFFIXES[(k // len(_PREFIXES)) % len(_SUFFIXES)]
        tag = f" #{k}" if k >= period else ""
        for speaker, text in base[: n - len(out)]:
            out.append(f"{speaker}: {prefix}{text}{suffix}{tag}")
        k += 1
    return out


@dataclass
class Corpus:
    """LoCoMo turns and questions (or the built-in sample when LoCoMo is absent).

    Attributes:
        turns: ``(speaker, text)`` in file order (5,882 for LoCoMo).
        questions: Distinct question texts (1,974 for LoCoMo).
        source: Path of ``locomo10.json``, or ``"sample"``.
    """

    turns: list[tuple[str, str]]
    questions: list[str]
    source: str


def load_corpus(path: Path | None) -> Corpus:
    """Read LoCoMo where :func:`lethe.locomo.find_locomo` finds it.

    Args:
        path: ``--locomo`` as given, or None for the usual places.

    Returns:
        Its turns and distinct questions; the built-in sample conversation when
        no ``locomo10.json`` is found.
    """
    found = find_locomo(path)
    convs = load_locomo(found) if found is not None else sample_conversation()
    turns = [(s, t) for c in convs for session in c.sessions.values() for s, _, t in session]
    seen: dict[str, None] = {}
    for c in convs:
        for q in c.qa:
            seen.setdefault(str(q["question"]), None)
    return Corpus(turns, list(seen), str(found) if found is not None else "sample")


class EmbeddingCache:
    """WordLlama embeddings of texts, cached as ``.npy`` files in a directory.

    The model is loaded on first use (about 1 s). Rows whose text has no
    tokens come back all zeros from the embedder; callers drop such queries.

    Args:
        directory: Cache directory (created on demand), or None for no cache.
    """

    def __init__(self, directory: Path | None) -> None:
        self._dir = directory
        self._embedder: object | None = None
        self.model = "wordllama-l2-supercat-256"

    def embed(self, texts: list[str]) -> Vectors:
        """Embed ``texts`` with the server's embedder, from the cache when present.

        Args:
            texts: ``n`` strings.

        Returns:
            ``(n, 256) float32``, rows of unit L2 norm (or zero, see the class).
        """
        digest = hashlib.sha256(self.model.encode())
        for t in texts:
            digest.update(t.encode())
            digest.update(b"\x00")
        path = None if self._dir is None else self._dir / f"{digest.hexdigest()[:32]}.npy"
        if path is not None and path.exists():
            cached: Vectors = np.load(path)
            if cached.shape == (len(texts), DIM):
                return cached
        from index import WordLlamaEmbedder

        if self._embedder is None:
            self._embedder = WordLlamaEmbedder()
        assert isinstance(self._embedder, WordLlamaEmbedder)
        chunks = [self._embedder.embed(texts[i : i + 4096]) for i in range(0, len(texts), 4096)]
        out = np.ascontiguousarray(np.concatenate(chunks) if chunks else np.zeros((0, DIM)))
        vectors = out.astype(np.float32, copy=False)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, vectors)
            tmp.replace(path)
        return vectors
