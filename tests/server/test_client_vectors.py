"""``--embedder none``: clients send vectors, and the owner's first one fixes the dimension.

Mismatches are refused (API.md, DIMENSION_MISMATCH).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from lethe._rpc import reason_of as _reason
from lethe.v1 import common_pb2, retrieval_pb2, threads_pb2


def _vec(i: int, d: int = 8) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(d)]


def test_client_vectors_set_the_dimension_and_are_searchable(
    tmp_path: Path, lethe_at: Callable[..., Any]
) -> None:
    lethe = lethe_at(tmp_path / "d", embedder="none")
    c = lethe.client("alice")
    c.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent="owners/alice", thread_id="t1"), metadata=c.md
    )
    # A search before any vector exists builds an empty index of unknown dimension.
    empty = c.retrieval.Search(
        retrieval_pb2.SearchRequest(parent="owners/alice", query_embedding=_vec(0)),
        metadata=c.md,
    )
    assert list(empty.hits) == []
    c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent="owners/alice/threads/t1",
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.USER, text=f"turn {i}", embedding=_vec(i), commit=True
                )
                for i in range(3)
            ],
        ),
        metadata=c.md,
    )
    hits = c.retrieval.Search(
        retrieval_pb2.SearchRequest(parent="owners/alice", query_embedding=_vec(2), top_k=1),
        metadata=c.md,
    ).hits
    assert [h.turn.text for h in hits] == ["turn 2"]
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)

    with pytest.raises(grpc.RpcError) as err:
        c.threads.AppendTurns(
            threads_pb2.AppendTurnsRequest(
                parent="owners/alice/threads/t1",
                turns=[threads_pb2.TurnInput(role=common_pb2.USER, text="x", embedding=_vec(0, 4))],
            ),
            metadata=c.md,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _reason(err.value) == "DIMENSION_MISMATCH"

    # Without an embedder, text-only HYBRID search is the lexical legs alone ...
    lexical = c.retrieval.Search(
        retrieval_pb2.SearchRequest(parent="owners/alice", query_text="turn 2", top_k=3),
        metadata=c.md,
    ).hits
    assert {h.turn.text for h in lexical} == {"turn 0", "turn 1", "turn 2"}
    # ... and DENSE with text only cannot be served.
    with pytest.raises(grpc.RpcError) as err:
        c.retrieval.Search(
            retrieval_pb2.SearchRequest(
                parent="owners/alice", query_text="turn", mode=retrieval_pb2.SearchRequest.DENSE
            ),
            metadata=c.md,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    lethe.restart()
    c = lethe.client("alice")
    hits = c.retrieval.Search(
        retrieval_pb2.SearchRequest(parent="owners/alice", query_embedding=_vec(1), top_k=1),
        metadata=c.md,
    ).hits
    assert [h.turn.text for h in hits] == ["turn 1"]


def test_client_vector_of_other_dimension_than_embedder_is_refused(
    tmp_path: Path, lethe_at: Callable[..., Any]
) -> None:
    lethe = lethe_at(tmp_path / "d")
    c = lethe.client("alice")
    c.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent="owners/alice", thread_id="t1"), metadata=c.md
    )
    with pytest.raises(grpc.RpcError) as err:
        c.threads.AppendTurns(
            threads_pb2.AppendTurnsRequest(
                parent="owners/alice/threads/t1",
                turns=[threads_pb2.TurnInput(role=common_pb2.USER, text="x", embedding=_vec(0))],
            ),
            metadata=c.md,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _reason(err.value) == "DIMENSION_MISMATCH"
    listed = c.threads.ListTurns(
        threads_pb2.ListTurnsRequest(parent="owners/alice/threads/t1"), metadata=c.md
    )
    assert list(listed.turns) == []
