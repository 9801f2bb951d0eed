"""A change of embedder killed at every step, on the real server process.

The store holds an owner's vectors made by model A; the server restarts with
model B and is SIGKILLed where a failpoint is armed — while recording the change
at start (``embedder.record.*``), between re-embedding and the swap
(``reembed.batch``: the owner's texts are embedded, nothing written), or around
the one write transaction that swaps every vector (``reembed.after_keystore``,
``reembed.after_commit``). After each kill the data on disk is read back: the
owner's vectors are all A's (and the owner still marked A's) or all B's (and
marked B's), never a mix. A clean restart with B then serves vectors that are
all B's, re-embedding only when the swap had not committed, and the audit is
clean.

The models are tiny real ONNX encoders built at test time (tests/_onnx_model.py).
"""

from __future__ import annotations

from pathlib import Path

import _onnx_model
import grpc
import numpy as np
import pytest
from _harness import OWNER, armed, audit, base_env, make_token, serving

from index import OnnxEmbedder
from lethe._rpc import Stubs
from lethe.v1 import common_pb2, lifecycle_pb2, memories_pb2, retrieval_pb2, threads_pb2
from server import Store
from server.store import TurnView

PARENT = f"owners/{OWNER}"
THREAD = f"{PARENT}/threads/t1"
TEXTS = ["I adopted a puppy named Biscuit", "the weather is mild today", "alpha harbour"]
PENDING = "my sister plays cello"
FACT = "likes carrots"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    return _onnx_model.build(root / "a", seed=0), _onnx_model.build(root / "b", seed=1)


def _fill(s: Stubs) -> None:
    s.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent=PARENT, thread_id="t1"), metadata=s.md
    )
    turns = [threads_pb2.TurnInput(role=common_pb2.USER, text=t, commit=True) for t in TEXTS]
    turns.append(threads_pb2.TurnInput(role=common_pb2.USER, text=PENDING))
    s.threads.AppendTurns(threads_pb2.AppendTurnsRequest(parent=THREAD, turns=turns), metadata=s.md)
    s.memories.CreateMemory(
        memories_pb2.CreateMemoryRequest(
            parent=PARENT,
            memory_id="f1",
            memory=memories_pb2.Memory(
                kind=memories_pb2.Memory.FACT, text=FACT, state=common_pb2.COMMITTED
            ),
        ),
        metadata=s.md,
    )


def _search(s: Stubs) -> list[str]:
    resp = s.retrieval.Search(
        retrieval_pb2.SearchRequest(
            parent=PARENT, query_text="puppy named biscuit", mode=retrieval_pb2.SearchRequest.DENSE
        ),
        metadata=s.md,
    )
    return [h.turn.text for h in resp.hits if h.WhichOneof("record") == "turn"]


def _on_disk(data: Path) -> tuple[str, dict[str, np.ndarray]]:
    """The owner's recorded embedder and every current vector, read from the data directory here.

    Turns are keyed by their text, and so is the memory.
    """
    store = Store(data, lock=False)
    try:
        turns = store.owner_turns(OWNER)
        rids, vecs = store.embeddings(turns)
        texts = {m.rid: m for m in turns}
        out: dict[str, np.ndarray] = {}
        for rid, vec in zip(rids, vecs, strict=True):
            meta, cts = store.fetch([rid])[rid]
            view = store.view_of(meta, cts)
            assert isinstance(view, TurnView)
            out[view.text] = vec
            assert texts[rid].has_embedding
        mems = store.owner_memories(OWNER)
        mrids, mvecs = store.memory_embeddings(mems)
        assert len(mrids) == 1
        out[FACT] = mvecs[0]
        return store.owner_embedder(OWNER), out
    finally:
        store.close()


def _model_of(vectors: dict[str, np.ndarray], a: OnnxEmbedder, b: OnnxEmbedder) -> str:
    """``a`` or ``b`` when every vector is that model's; fails on a mix."""
    assert sorted(vectors) == sorted([*TEXTS, PENDING, FACT])
    made = {
        text: [
            name
            for name, m in (("a", a), ("b", b))
            if np.allclose(vec, m.embed([text])[0], atol=1e-5)
        ]
        for text, vec in vectors.items()
    }
    assert all(len(v) == 1 for v in made.values()), made
    (model,) = {v[0] for v in made.values()}  # one model for all: never a mix
    return model


POINTS = [
    ("embedder.record.after_keystore", False),
    ("embedder.record.after_commit", False),
    ("reembed.batch", False),
    ("reembed.after_keystore", False),
    ("reembed.after_commit", True),
]
"""Each point, and whether the swap to B is on disk when the process dies there."""


@pytest.mark.parametrize(("point", "swapped"), POINTS, ids=[p for p, _ in POINTS])
def test_a_reembed_killed_at_each_step_converges_on_one_model(
    point: str, swapped: bool, tmp_path: Path, kek_env: str, models: tuple[Path, Path]
) -> None:
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    a, b = OnnxEmbedder(models[0]), OnnxEmbedder(models[1])
    with_a, with_b = ("--embedder", f"onnx:{models[0]}"), ("--embedder", f"onnx:{models[1]}")
    with serving(data, env, *with_a) as first:
        _fill(first.stubs(token))
    recorded, vectors = _on_disk(data)
    assert (recorded, _model_of(vectors, a, b)) == (a.name, "a")

    if point.startswith("embedder.record."):
        with (
            pytest.raises(RuntimeError, match="exit -9"),
            serving(data, armed(env, point), *with_b),
        ):
            pass  # dies at start, before it serves
    else:
        with serving(data, armed(env, point), *with_b) as doomed:
            with pytest.raises(grpc.RpcError) as err:
                _search(doomed.stubs(token))  # the owner's first use re-embeds
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert doomed.killed(), f"{point} was not reached"
    recorded, vectors = _on_disk(data)
    assert _model_of(vectors, a, b) == ("b" if swapped else "a")
    assert recorded == (b.name if swapped else a.name)

    with serving(data, env, *with_b) as again:
        s = again.stubs(token)
        assert _search(s)[0] == TEXTS[0]
        audit_rpc = s.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent=PARENT), metadata=s.md)
        assert (audit_rpc.index_drift, audit_rpc.unreadable_records) == (0, 0)
        again.proc.terminate()
        assert again.proc.wait(timeout=30) == 0
        log = again.stderr()
    reembedded = f"re-embedding owner {OWNER}: 5 records, {a.name} -> {b.name}" in log
    assert reembedded == (not swapped), log
    recorded, vectors = _on_disk(data)
    assert (recorded, _model_of(vectors, a, b)) == (b.name, "b")
    rc, out = audit(data, env)
    assert rc == 0, out
