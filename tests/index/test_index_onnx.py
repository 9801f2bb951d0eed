"""index.OnnxEmbedder on a real ONNX graph run by onnxruntime.

The graph is built at test time by tests/_onnx_model.py: nothing is downloaded,
nothing is mocked.
"""

from __future__ import annotations

from pathlib import Path

import _onnx_model  # tests/: on sys.path through tests/conftest.py
import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from tokenizers import Tokenizer

from index import Embedder, OnnxEmbedder, load_embedder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _onnx_model.build(tmp_path_factory.mktemp("tiny") / "tiny-encoder")


def _expected(directory: Path, text: str) -> np.ndarray:
    """Mean pooling of tanh(E[ids] @ W) over the tokens, L2-normalised, in numpy."""
    model = onnx.load(str(directory / "model.onnx"))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ids = Tokenizer.from_file(str(directory / "tokenizer.json")).encode(text).ids
    states = np.tanh(weights["table"][ids].astype(np.float64) @ weights["weight"])
    row = states.mean(axis=0)
    return np.asarray(row / np.linalg.norm(row), dtype=np.float64)


def test_mean_pooling_and_l2_match_a_numpy_reference(model_dir: Path) -> None:
    emb = OnnxEmbedder(model_dir)
    assert isinstance(emb, Embedder)
    assert emb.dim == 16
    texts = ["I adopted a puppy named Biscuit", "the weather is mild today"]
    rows = emb.embed(texts)
    assert rows.shape == (2, 16)
    assert rows.dtype == np.float32
    assert rows.flags.c_contiguous
    for row, text in zip(rows, texts, strict=True):
        np.testing.assert_allclose(row, _expected(model_dir, text), atol=1e-5)


def test_padding_does_not_change_a_row(model_dir: Path) -> None:
    emb = OnnxEmbedder(model_dir)
    alone = emb.embed(["cat"])
    beside_a_long_text = emb.embed(["cat", "my sister plays cello and tennis on sunday"])[:1]
    np.testing.assert_allclose(alone, beside_a_long_text, atol=1e-6)


def test_batches_and_empty_texts(model_dir: Path) -> None:
    emb = OnnxEmbedder(model_dir)
    texts = [f"{w} lake" for w in _onnx_model.WORDS] + ["", "   "]
    rows = emb.embed(texts)
    assert len(texts) > 32  # more than one batch
    np.testing.assert_allclose(np.linalg.norm(rows[:-2], axis=1), 1.0, rtol=1e-5)
    assert not rows[-2:].any()
    np.testing.assert_allclose(rows[40:41], emb.embed([texts[40]]), atol=1e-6)
    assert emb.embed([]).shape == (0, 16)
    with pytest.raises(TypeError):
        emb.embed([b"bytes"])  # type: ignore[list-item]


def test_prefixes_from_the_configuration_file(tmp_path: Path) -> None:
    d = _onnx_model.build(tmp_path / "e5like", config={"query_prefix": "cat ", "text_prefix": ""})
    emb = OnnxEmbedder(d)
    np.testing.assert_allclose(emb.embed_queries(["dog"]), emb.embed(["cat dog"]), atol=1e-6)
    assert not np.allclose(emb.embed_queries(["dog"]), emb.embed(["dog"]))


def test_the_name_follows_the_files(model_dir: Path, tmp_path: Path) -> None:
    same = _onnx_model.build(tmp_path / "tiny-encoder", seed=0)
    other = _onnx_model.build(tmp_path / "other" / "tiny-encoder", seed=1)
    name = OnnxEmbedder(model_dir).name
    assert name.startswith("onnx-tiny-encoder-")
    assert len(name) == len("onnx-tiny-encoder-") + 12
    assert OnnxEmbedder(same).name == name
    assert OnnxEmbedder(other).name != name  # same shape, other weights: another model


def test_load_embedder_onnx(model_dir: Path) -> None:
    emb = load_embedder(f"onnx:{model_dir}")
    assert isinstance(emb, OnnxEmbedder)
    with pytest.raises(ValueError, match="unknown embedder"):
        load_embedder("onnx:")


def test_missing_files_and_bad_configuration_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"model\.onnx"):
        OnnxEmbedder(tmp_path)
    d = _onnx_model.build(tmp_path / "m")
    (d / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        OnnxEmbedder(d)
    d = _onnx_model.build(tmp_path / "c", config={"pooling": "max"})
    with pytest.raises(ValueError, match="pooling"):
        OnnxEmbedder(d)
    d = _onnx_model.build(tmp_path / "k", config={"prefix": "x"})
    with pytest.raises(ValueError, match="keys"):
        OnnxEmbedder(d)
