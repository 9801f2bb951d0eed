"""The Search reply on the wire: full hits built in place, and a byte budget that keeps the best.

Hits carry every field of their turn (built in place inside the reply), and a
reply over the byte budget keeps the best hits and leaves out the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lethe.v1 import common_pb2, retrieval_pb2, threads_pb2
from server.services import _common


def _vec(i: int, d: int = 8) -> list[float]:
    return [1.0 if j == i else 0.25 for j in range(d)]


def _served(tmp_path: Path, lethe_at: Callable[..., Any]) -> Any:
    lethe = lethe_at(tmp_path / "d", embedder="none")
    c = lethe.client("alice")
    c.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent="owners/alice", thread_id="t1"), metadata=c.md
    )
    c.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent="owners/alice/threads/t1",
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.USER,
                    speaker=f"s{i}",
                    text=f"turn {i} " + "x" * 3000,
                    embedding=_vec(i),
                    commit=True,
                )
                for i in range(5)
            ],
        ),
        metadata=c.md,
    )
    return c


def _search(c: Any) -> retrieval_pb2.SearchResponse:
    return c.retrieval.Search(  # type: ignore[no-any-return]
        retrieval_pb2.SearchRequest(
            parent="owners/alice",
            query_embedding=_vec(2),
            top_k=5,
            mode=retrieval_pb2.SearchRequest.DENSE,
        ),
        metadata=c.md,
    )


def test_hits_carry_their_turns_fields(tmp_path: Path, lethe_at: Callable[..., Any]) -> None:
    c = _served(tmp_path, lethe_at)
    hits = list(_search(c).hits)
    assert len(hits) == 5
    best = hits[0]
    assert best.turn.name == "owners/alice/threads/t1/turns/3"
    assert (best.turn.seq, best.turn.speaker, best.turn.role) == (3, "s2", common_pb2.USER)
    assert best.turn.text.startswith("turn 2 ")
    assert best.turn.state == common_pb2.COMMITTED
    assert best.turn.version == 1
    assert best.turn.HasField("time")
    assert best.turn.HasField("create_time")
    assert best.turn.create_time.seconds > 1_600_000_000
    assert best.score > hits[1].score


def test_a_reply_over_the_byte_budget_keeps_the_best_hits(
    tmp_path: Path, lethe_at: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = _served(tmp_path, lethe_at)
    full = [h.turn.name for h in _search(c).hits]
    monkeypatch.setattr(_common, "MAX_REPLY_BYTES", 7000)  # room for two 3 KB hits
    cut = [h.turn.name for h in _search(c).hits]
    assert cut == full[:2]
