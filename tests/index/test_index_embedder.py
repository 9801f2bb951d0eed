"""Tests for the WordLlama embedder (real model from the installed wheel)."""

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from index import Embedder, VectorIndex, WordLlamaEmbedder, load_embedder
from index._embedder import _GATHER_TOKENS


@pytest.fixture(scope="module")
def embedder() -> WordLlamaEmbedder:
    return WordLlamaEmbedder()


def test_embed_returns_unit_float32_rows(embedder: WordLlamaEmbedder) -> None:
    out = embedder.embed(["I adopted a puppy", "my new dog", "quarterly tax filing"])
    assert isinstance(embedder, Embedder)
    assert embedder.name == "wordllama-l2-supercat-256"
    assert embedder.dim == 256
    assert out.shape == (3, 256)
    assert out.dtype == np.float32
    assert out.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)


def test_embed_ranks_related_text_closer(embedder: WordLlamaEmbedder) -> None:
    puppy, dog, tax = embedder.embed(["I adopted a puppy", "my new dog", "quarterly tax filing"])
    assert float(puppy @ dog) > float(puppy @ tax) + 0.1


def test_embed_empty_input_has_shape_zero_by_dim(embedder: WordLlamaEmbedder) -> None:
    out = embedder.embed([])
    assert out.shape == (0, 256)
    assert out.dtype == np.float32


def test_embed_text_without_tokens_gives_zero_row_not_nan(embedder: WordLlamaEmbedder) -> None:
    out = embedder.embed(["", "my new dog"])
    assert np.all(np.isfinite(out))
    assert np.all(out[0] == 0.0)
    assert np.linalg.norm(out[1]) == pytest.approx(1.0, rel=1e-5)


def test_embed_is_deterministic_across_batches(embedder: WordLlamaEmbedder) -> None:
    alone = embedder.embed(["my new dog"])
    batched = embedder.embed(["quarterly tax filing", "my new dog"])
    np.testing.assert_allclose(alone[0], batched[1], atol=1e-6)


def test_embed_rejects_non_strings(embedder: WordLlamaEmbedder) -> None:
    with pytest.raises(TypeError):
        embedder.embed(["ok", 3])  # type: ignore[list-item]


def test_concurrent_embeds_agree(embedder: WordLlamaEmbedder) -> None:
    texts = [f"turn {i} about my dog and the park" for i in range(20)]
    expected = embedder.embed(texts)
    got: list[np.ndarray] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(10):
            out = embedder.embed(texts)
            with lock:
                got.append(out)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(got) == 40
    for out in got:
        np.testing.assert_array_equal(out, expected)


def test_embeddings_search_in_vector_index(embedder: WordLlamaEmbedder) -> None:
    docs = ["I adopted a puppy", "quarterly tax filing", "the weather in Lisbon"]
    ix = VectorIndex(embedder.dim)
    ix.add([1, 2, 3], embedder.embed(docs))
    assert ix.search(embedder.embed(["my new dog"])[0], k=1)[0][0] == 1


def test_load_embedder_wordllama() -> None:
    e = load_embedder("wordllama")
    assert isinstance(e, WordLlamaEmbedder)
    assert e.dim == 256


def test_load_embedder_none_returns_none() -> None:
    assert load_embedder("none") is None


def test_load_embedder_unknown_name_fails() -> None:
    with pytest.raises(ValueError, match="'wordllama', 'none'"):
        load_embedder("bogus")


def _library_rows(embedder: WordLlamaEmbedder, texts: list[str]) -> np.ndarray:
    """What the embedder returned when it called WordLlama's own padded ``embed``."""
    rows = np.asarray(embedder._model.embed(texts, norm=False), dtype=np.float64)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    out = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0.0)
    return np.ascontiguousarray(out, dtype=np.float32)


def test_embed_equals_wordllamas_padded_pooling(
    embedder: WordLlamaEmbedder, locomo_path: Path
) -> None:
    conversation = json.loads(locomo_path.read_text())[0]["conversation"]
    texts = [
        turn["text"]
        for key, turns in conversation.items()
        if key.startswith("session_") and isinstance(turns, list)
        for turn in turns
    ][:300]
    texts += ["", "   ", "x" * 20_000, "héllo wörld ☃"]
    np.testing.assert_array_equal(embedder.embed(texts), _library_rows(embedder, texts))


def test_embed_of_a_text_past_one_gather_matches_the_library(
    embedder: WordLlamaEmbedder,
) -> None:
    long_text = " ".join(f"word{i % 997} garden violin" for i in range(15_000))
    assert len(embedder._tokenizer.encode(long_text, add_special_tokens=False).ids) > (
        _GATHER_TOKENS
    )
    got = embedder.embed([long_text, "my new dog"])
    np.testing.assert_allclose(got, _library_rows(embedder, [long_text, "my new dog"]), atol=1e-4)


def test_a_query_is_not_held_behind_a_large_batch(embedder: WordLlamaEmbedder) -> None:
    """A one-line query beside a 256 x 16 KiB batch finishes before the batch does.

    With the old lock around WordLlama's ``embed`` the query waited for the whole
    batch (3.3 s); nothing is timed here beyond that ordering.
    """
    big = [" ".join(f"garden{i} violin{j}" for j in range(900))[:16_384] for i in range(256)]
    done: list[str] = []
    started = threading.Event()

    def batch() -> None:
        started.set()
        embedder.embed(big)
        done.append("batch")

    worker = threading.Thread(target=batch)
    worker.start()
    started.wait()
    time.sleep(0.05)
    embedder.embed_queries(["what did I say about the garden"])
    done.append("query")
    worker.join(timeout=120)
    assert done == ["query", "batch"]


def test_embed_queries_equals_embed(embedder: WordLlamaEmbedder) -> None:
    texts = ["what did I say about the garden", "", "héllo ☃", "x " * 5000]
    np.testing.assert_array_equal(embedder.embed_queries(texts), embedder.embed(texts))
    assert embedder.embed_queries([]).shape == (0, 256)
    with pytest.raises(TypeError):
        embedder.embed_queries([b"bytes"])  # type: ignore[list-item]
