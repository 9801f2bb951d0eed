"""Regressions found by the adversarial review of the first release; each test
reproduced its bug before the fix."""

from __future__ import annotations

import stat
from pathlib import Path

import grpc
import pytest
from _helpers import append, create_thread, error_reason, forget, run_cli
from conftest import Lethe

from lethe.v1 import common_pb2, lifecycle_pb2, memories_pb2, retrieval_pb2, threads_pb2


def _search(c: object, query: str, **kw: object) -> list[str]:
    resp = c.retrieval.Search(  # type: ignore[attr-defined]
        retrieval_pb2.SearchRequest(parent="owners/alice", query_text=query, top_k=10, **kw),  # type: ignore[arg-type]
        metadata=tuple(c.md),  # type: ignore[attr-defined]
    )
    return [h.turn.name for h in resp.hits]


def test_commit_with_a_name_twice_commits_once_and_stays_searchable(lethe: Lethe) -> None:
    # Was INTERNAL (duplicate ids in one lexical add) with the turn committed but unsearchable.
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "t1")
    turn = append(c, thread, ["the marmalade jar is empty"])[0]
    resp = c.lifecycle.Commit(
        lifecycle_pb2.CommitRequest(names=[turn.name, turn.name]), metadata=tuple(c.md)
    )
    assert [r.name for r in resp.committed] == [turn.name]
    assert _search(c, "marmalade jar", mode=retrieval_pb2.SearchRequest.LEXICAL) == [turn.name]
    receipt = forget(c, turn.name, turn.name)
    assert list(receipt.targets) == [turn.name]


def test_a_forgotten_thread_id_used_again_numbers_on(lethe: Lethe) -> None:
    # Was: turn 1 of the new thread reused the forgotten turn 1's name.
    c = lethe.client("alice")
    thread = create_thread(c, "alice", "fg")
    old = append(c, thread, ["first life one", "first life two"], commit=True)
    forget(c, thread)
    create_thread(c, "alice", "fg")
    new = append(c, thread, ["second life"], commit=True)[0]
    assert new.seq == 3
    with pytest.raises(grpc.RpcError) as err:
        c.threads.GetTurn(threads_pb2.GetTurnRequest(name=old[0].name), metadata=tuple(c.md))
    assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "RECORD_DELETED")


def test_a_forgotten_memory_id_used_again_continues_its_versions(lethe: Lethe) -> None:
    c = lethe.client("alice")

    def create(text: str) -> memories_pb2.Memory:
        return c.memories.CreateMemory(
            memories_pb2.CreateMemoryRequest(
                parent="owners/alice",
                memory_id="m",
                memory=memories_pb2.Memory(kind=memories_pb2.Memory.FACT, text=text),
            ),
            metadata=tuple(c.md),
        )

    first = create("old content")
    forget(c, first.name)
    second = create("new content")
    assert (first.version, second.version) == (1, 2)
    with pytest.raises(grpc.RpcError) as err:  # a stale reference to version 1 is refused
        c.memories.CreateMemory(
            memories_pb2.CreateMemoryRequest(
                parent="owners/alice",
                memory=memories_pb2.Memory(
                    kind=memories_pb2.Memory.SUMMARY,
                    text="s",
                    sources=[common_pb2.SourceRef(name=first.name, version=1)],
                ),
            ),
            metadata=tuple(c.md),
        )
    assert error_reason(err.value) == (grpc.StatusCode.FAILED_PRECONDITION, "SOURCE_STALE")


def test_two_authorization_headers_are_refused(lethe: Lethe) -> None:
    # Was: the first header won, so the order of two credentials decided the outcome.
    alice = lethe.client("alice")
    bob_token = lethe.token("bob")
    both = (("authorization", f"Bearer {alice.token}"), ("authorization", f"Bearer {bob_token}"))
    with pytest.raises(grpc.RpcError) as err:
        alice.threads.ListThreads(
            threads_pb2.ListThreadsRequest(parent="owners/alice"), metadata=both
        )
    assert error_reason(err.value) == (grpc.StatusCode.UNAUTHENTICATED, "INVALID_TOKEN")


def test_search_in_a_thread_that_does_not_exist_is_not_found(lethe: Lethe) -> None:
    c = lethe.client("alice")
    with pytest.raises(grpc.RpcError) as err:
        _search(c, "x", thread="owners/alice/threads/nope", include_pending=True)
    assert error_reason(err.value) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


def test_token_create_refuses_a_directory_without_a_store(tmp_path: Path, kek_env: str) -> None:
    # Was: a typo in --data silently created a new store and printed a useless token.
    assert run_cli(["token", "create", "--data", str(tmp_path / "typo"), "--owner", "x"]) == 2
    assert not (tmp_path / "typo").exists()


def test_backup_files_are_private(lethe: Lethe, tmp_path: Path) -> None:
    c = lethe.client("alice")
    create_thread(c, "alice", "t1")
    out = tmp_path / "backup"
    assert run_cli(["backup", "--data", str(lethe.data_dir), "--out", str(out)]) == 0
    for name in ("data.mdb", "MANIFEST.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600
