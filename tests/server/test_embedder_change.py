"""``--embedder onnx:DIR`` end to end, and what a change of embedder does.

The start check records the change, and each owner's vectors are re-embedded on
its first use — every vector then the new model's, never two models in one
owner.

The models are tiny real ONNX encoders built at test time (tests/_onnx_model.py);
two seeds of the same shape are two models whose vectors have the same dimension,
so only the check by name can tell them apart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import _onnx_model
import numpy as np
import pytest
from _helpers import append, create_thread
from conftest import Client, Lethe

from index import OnnxEmbedder, WordLlamaEmbedder
from lethe.v1 import lifecycle_pb2, retrieval_pb2

TEXTS = ["I adopted a puppy named Biscuit", "the weather is mild today", "alpha harbour"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    return _onnx_model.build(root / "a", seed=0), _onnx_model.build(root / "b", seed=1)


def _vectors(c: Client, thread: str) -> dict[str, np.ndarray]:
    resp = c.list_turns(thread, page_size=100, view="FULL")
    return {t.text: np.asarray(t.embedding, dtype=np.float32) for t in resp.turns}


def _pending_vectors(c: Client, thread: str) -> dict[str, np.ndarray]:
    resp = c.list_turns(thread, page_size=100, view="FULL", states=["PENDING"])
    return {t.text: np.asarray(t.embedding, dtype=np.float32) for t in resp.turns}


def _memory_vectors(lethe: Lethe) -> dict[str, np.ndarray]:
    """Every current memory vector of alice, by the memory's version name, from the server's store.

    Read from the server's own store: the API takes memory vectors as input
    only.
    """
    assert lethe.server is not None
    store = lethe.server.store
    metas = [m for m in store.owner_memories("alice") if not m.deleted]
    rids, vecs = store.memory_embeddings(metas)
    names = {m.rid: f"{m.name}@{m.version}" for m in metas}
    return {names[rid]: vecs[i] for i, rid in enumerate(rids)}


def _dense(c: Client, query: str) -> list[str]:
    resp = c.retrieval.Search(
        retrieval_pb2.SearchRequest(
            parent="owners/alice", query_text=query, mode=retrieval_pb2.SearchRequest.DENSE
        ),
        metadata=c.md,
    )
    return [h.turn.text for h in resp.hits]


def _audit(c: Client) -> tuple[int, int]:
    r = c.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent="owners/alice"), metadata=c.md)
    return int(r.index_drift), int(r.unreadable_records)


def _setup(lethe_at: Callable[..., Lethe], data: Path, model: Path) -> tuple[Lethe, str, str]:
    lethe = lethe_at(data, embedder=f"onnx:{model}")
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    append(c, thread, TEXTS, commit=True)
    pending = create_thread(c, "alice", "t2")
    append(c, pending, ["my sister plays cello"])  # pending
    return lethe, thread, pending


def test_the_onnx_embedder_makes_the_stored_and_query_vectors(
    lethe_at: Callable[..., Lethe], tmp_path: Path, models: tuple[Path, Path]
) -> None:
    lethe, thread, _ = _setup(lethe_at, tmp_path / "d", models[0])
    c = lethe.client("alice")
    model = OnnxEmbedder(models[0])
    stored = _vectors(c, thread)
    for text in TEXTS:
        np.testing.assert_allclose(stored[text], model.embed([text])[0], atol=1e-6)
    assert _dense(c, "puppy named biscuit")[0] == "I adopted a puppy named Biscuit"


def test_a_change_of_embedder_reembeds_every_vector_on_first_use(
    lethe_at: Callable[..., Lethe],
    tmp_path: Path,
    models: tuple[Path, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = tmp_path / "d"
    lethe, thread, pending = _setup(lethe_at, data, models[0])
    c = lethe.client("alice")
    fact = c.create_memory(
        "owners/alice", {"kind": "FACT", "text": "likes carrots", "state": "COMMITTED"}
    )
    question = c.create_memory(
        "owners/alice", {"kind": "OPEN_QUESTION", "text": "which dog", "state": "COMMITTED"}
    )
    lethe.stop()
    old, new = OnnxEmbedder(models[0]), OnnxEmbedder(models[1])
    assert old.dim == new.dim  # same shape ...
    assert old.name != new.name  # ... another model

    caplog.set_level(logging.INFO, logger="server.retrieval._reembed")
    lethe = lethe_at(data, embedder=f"onnx:{models[1]}")
    changed = [r.getMessage() for r in caplog.records if "embedder changed" in r.getMessage()]
    assert changed == [
        f"embedder changed from {old.name} (16 dimensions) to {new.name} (16): the vectors "
        "of 1 owner(s) will be re-embedded on each owner's first use"
    ]
    c = lethe.client("alice")
    # Not a use of the vectors: the new version carries the old model's vector along.
    c.transition_memory(question.name, status="ANSWERED")
    assert _dense(c, "puppy named biscuit")  # the first use: re-embeds, then searches
    progress = [
        r.getMessage() for r in caplog.records if "re-embedding owner alice" in r.getMessage()
    ]
    assert progress[0] == (
        f"re-embedding owner alice: 6 records, {old.name} -> {new.name} (16 dimensions)"
    )
    assert progress[-1] == "re-embedding owner alice: 6/6 records"
    turns = {**_vectors(c, thread), **_pending_vectors(c, pending)}
    assert sorted(turns) == sorted([*TEXTS, "my sister plays cello"])
    for text, vec in turns.items():
        np.testing.assert_allclose(vec, new.embed([text])[0], atol=1e-6)
        assert not np.allclose(vec, old.embed([text])[0], atol=1e-3)
    memories = _memory_vectors(lethe)
    assert set(memories) == {f"{fact.name}@1", f"{question.name}@2"}
    np.testing.assert_allclose(
        memories[f"{fact.name}@1"], new.embed(["likes carrots"])[0], atol=1e-6
    )
    np.testing.assert_allclose(
        memories[f"{question.name}@2"], new.embed(["which dog"])[0], atol=1e-6
    )
    assert lethe.server is not None
    assert lethe.server.store.owner_embedder("alice") == new.name
    assert _audit(c) == (0, 0)

    # Once per owner: a restart with the same embedder re-embeds nothing.
    caplog.clear()
    lethe.stop()
    lethe = lethe_at(data, embedder=f"onnx:{models[1]}")
    _dense(lethe.client("alice"), "puppy")
    assert not [r for r in caplog.records if "re-embed" in r.getMessage()]


def test_an_append_after_the_change_reembeds_first(
    lethe_at: Callable[..., Lethe], tmp_path: Path, models: tuple[Path, Path]
) -> None:
    data = tmp_path / "d"
    lethe, thread, _ = _setup(lethe_at, data, models[0])
    lethe.stop()
    lethe = lethe_at(data, embedder="wordllama")  # another dimension too: 256
    c = lethe.client("alice")
    append(c, thread, ["lunch was good"], commit=True)  # first use is a write
    stored = _vectors(c, thread)
    wl = WordLlamaEmbedder()
    assert {v.shape for v in stored.values()} == {(256,)}
    for text, vec in stored.items():
        np.testing.assert_allclose(vec, wl.embed([text])[0], atol=1e-5)
    assert "lunch was good" in _dense(c, "lunch")
    assert _audit(c) == (0, 0)


def test_a_change_to_no_embedder_keeps_the_vectors(
    lethe_at: Callable[..., Lethe], tmp_path: Path, models: tuple[Path, Path]
) -> None:
    data = tmp_path / "d"
    lethe, thread, _ = _setup(lethe_at, data, models[0])
    lethe.stop()
    lethe = lethe_at(data, embedder="none")
    c = lethe.client("alice")
    model = OnnxEmbedder(models[0])
    for text, vec in _vectors(c, thread).items():
        np.testing.assert_allclose(vec, model.embed([text])[0], atol=1e-6)
    # Clients now send vectors of the owner's dimension; the stored ones serve them.
    query = model.embed(["puppy named biscuit"])[0].tolist()
    resp = c.retrieval.Search(
        retrieval_pb2.SearchRequest(
            parent="owners/alice",
            query_embedding=query,
            mode=retrieval_pb2.SearchRequest.DENSE,
        ),
        metadata=c.md,
    )
    assert resp.hits[0].turn.text == "I adopted a puppy named Biscuit"


def test_a_swap_with_a_memory_changed_meanwhile_writes_nothing(
    lethe_at: Callable[..., Lethe], tmp_path: Path, models: tuple[Path, Path]
) -> None:
    """The swap is all or nothing: a memory changed since it was embedded makes it write nothing.

    A memory whose version moved since it was embedded makes
    :meth:`Store.replace_vectors` write no vector and keep the owner's
    embedder, so the re-embed retries rather than leave the old model's vector.
    """
    lethe, thread, _ = _setup(lethe_at, tmp_path / "d", models[0])
    c = lethe.client("alice")
    fact = c.create_memory(
        "owners/alice", {"kind": "FACT", "text": "likes carrots", "state": "COMMITTED"}
    )
    assert lethe.server is not None
    store = lethe.server.store
    before = store.owner_embedder("alice")
    (meta,) = [m for m in store.owner_memories("alice") if m.name == fact.name]
    turn = store.owner_turns("alice")[0]
    zero = np.zeros(16, dtype=np.float32)
    zero[0] = 1.0
    swap = store.replace_vectors("alice", "other", 16, {turn.rid: zero}, {meta.rid: (2, zero)})
    assert (swap.replaced, swap.stale) == (0, [meta.rid])
    assert store.owner_embedder("alice") == before
    model = OnnxEmbedder(models[0])
    for text, vec in _vectors(c, thread).items():
        np.testing.assert_allclose(vec, model.embed([text])[0], atol=1e-6)
    swap = store.replace_vectors("alice", "other", 16, {turn.rid: zero}, {meta.rid: (1, zero)})
    assert (swap.replaced, swap.stale) == (2, [])
    assert store.owner_embedder("alice") == "other"
