"""A tiny sentence encoder built at test time: a real ONNX graph and a real WordPiece tokenizer.

The tokenizer is built with the ``tokenizers`` library. For the tests of
``index.OnnxEmbedder`` and of ``lethe serve --embedder onnx:DIR`` (nothing may
be downloaded, so no real model).

The graph (``onnx.helper``): token embeddings ``E[input_ids]`` ``(batch, tokens, dim)``,
a dense layer with ``tanh``, then the token states as ``last_hidden_state`` — what a
BERT export looks like to the embedder (which mean-pools over the attention mask).
The tokenizer: lower-case, BERT pre-tokenizer, WordPiece over :data:`VOCAB`, ``[CLS]``
and ``[SEP]`` added. Weights come from a seeded generator, so two seeds are two
different models of the same shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

WORDS = (
    "i",
    "adopted",
    "a",
    "puppy",
    "named",
    "biscuit",
    "dog",
    "cat",
    "likes",
    "carrots",
    "the",
    "weather",
    "is",
    "mild",
    "today",
    "alpha",
    "harbour",
    "beta",
    "violin",
    "gamma",
    "orchard",
    "delta",
    "glacier",
    "we",
    "went",
    "camping",
    "by",
    "lake",
    "my",
    "sister",
    "plays",
    "cello",
    "tennis",
    "on",
    "sunday",
    "pasta",
    "lunch",
    "was",
    "good",
)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *dict.fromkeys(WORDS), "##s", "##ing", "##ed"]


def build(
    directory: Path, dim: int = 16, seed: int = 0, config: dict[str, object] | None = None
) -> Path:
    """Write ``model.onnx`` and ``tokenizer.json`` into ``directory``; returns it.

    ``lethe-embedder.json`` is written too when ``config`` is given.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((len(VOCAB), dim)).astype(np.float32)
    weight = (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["tokens"], axis=0),
        helper.make_node("MatMul", ["tokens", "weight"], ["mixed"]),
        helper.make_node("Tanh", ["mixed"], ["last_hidden_state"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny-encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"]),
        ],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", dim]
            )
        ],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(weight, "weight"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(directory / "model.onnx"))

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(directory / "tokenizer.json"))
    if config is not None:
        (directory / "lethe-embedder.json").write_text(json.dumps(config))
    return directory
