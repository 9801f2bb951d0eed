"""The index cache is bounded by bytes (``--index-cache-size``).

Past the bound the least recently searched owner's indexes are dropped and
rebuilt from the store on its next search, which answers as before.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from _helpers import append, create_thread, search_texts
from conftest import Lethe

from server.retrieval import Retriever, _build


def test_owners_past_the_byte_bound_are_dropped_and_rebuilt(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    srv = lethe_at(tmp_path / "d", index_cache_size=1 << 20)  # 1 MiB: about one owner here
    c = srv.client(admin=True)
    for owner, pet in (("alice", "puppy"), ("bob", "kitten")):
        thread = create_thread(c, owner)
        texts = [f"{owner} note {i} about the weather and the garden" for i in range(300)]
        append(c, thread, [*texts, f"{owner} adopted a {pet}"], commit=True)
    assert server_cache(srv) == []  # nothing searched yet: nothing loaded
    assert search_texts(c, "alice", "puppy", top_k=1) == ["alice adopted a puppy"]
    alice_bytes = srv_retriever(srv).cache.total_bytes()
    assert 0 < alice_bytes < 1 << 20 < 2 * alice_bytes  # one owner fits, two do not
    assert search_texts(c, "bob", "kitten", top_k=1) == ["bob adopted a kitten"]
    assert server_cache(srv) == ["o/bob"]  # alice's bundle was dropped for bytes
    assert srv_retriever(srv).cache.evicted_for_bytes == 1
    # Alice is rebuilt from the store on her next search and answers as before.
    assert search_texts(c, "alice", "puppy", top_k=1) == ["alice adopted a puppy"]
    assert server_cache(srv) == ["o/alice"]
    # Writes to a loaded owner grow its bundle in place; the bound still holds.
    more = [f"alice extra {i} with many distinct words w{i}a w{i}b w{i}c" for i in range(900)]
    append(c, create_thread(c, "alice"), more, commit=True)
    assert search_texts(c, "alice", "w899b", top_k=1) == [more[-1]]


def srv_retriever(srv: Lethe) -> Retriever:
    assert srv.server is not None
    return srv.server.retriever


def server_cache(srv: Lethe) -> list[str]:
    return srv_retriever(srv).cache.keys()


def test_a_slow_owner_index_build_is_logged_with_its_size(
    lethe: Lethe, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Indexes are built on an owner's first search, not at start, and a slow build is logged.

    A build of ``SLOW_BUILD_SECONDS`` or more says so in the log (here every
    build is slow).
    """
    c = lethe.client("alice")
    append(c, create_thread(c, "alice"), ["alice adopted a puppy", "it likes walks"], commit=True)
    monkeypatch.setattr(_build, "SLOW_BUILD_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="server"):
        assert search_texts(c, "alice", "puppy", top_k=1) == ["alice adopted a puppy"]
        assert search_texts(c, "alice", "walks", top_k=1) == ["it likes walks"]  # cached
    lines = [r.getMessage() for r in caplog.records if "search index" in r.getMessage()]
    assert len(lines) == 1
    assert re.fullmatch(
        r"built the search index of owners/alice on its first search: 2 texts in \d+\.\d s",
        lines[0],
    )
