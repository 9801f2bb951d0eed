"""Store.visible_neighbours on a real store: nearest visible turns, exact, and in O(n) row reads.

The nearest visible turn before and after each asked seq, equal to a
brute-force scan for any visibility, and a forgotten range of n turns costs
O(n) row reads, not O(n^2) (the bug that made forgetting 1,000 turns of a
30k-turn owner take a minute).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from _one_thread import one_thread_store

from server.store import Store, TurnMeta

N = 400


@pytest.fixture
def store(tmp_path: Path, kek_env: str) -> Iterator[Store]:
    s = one_thread_store(tmp_path / "d", N)
    yield s
    s.close()


def _brute(seq: int, hidden: set[int]) -> tuple[int | None, int | None]:
    before = next((s for s in range(seq - 1, 0, -1) if s not in hidden), None)
    after = next((s for s in range(seq + 1, N + 1) if s not in hidden), None)
    return before, after


@pytest.mark.parametrize("seed", range(6))
def test_neighbours_match_a_brute_force_scan(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    hidden = set(rng.sample(range(1, N + 1), rng.choice([0, 20, 200, 399])))
    if seed == 5:
        hidden = set(range(50, 351))  # one long forgotten run
    asked = sorted(rng.sample(range(1, N + 1), 60) + sorted(hidden)[:40])

    def visible(meta: TurnMeta, now: float) -> bool:
        return meta.seq not in hidden

    got = store.visible_neighbours("alice", "t1", asked, visible)
    assert set(got) == set(asked)
    for seq in asked:
        before, after = got[seq]
        assert (
            before.seq if before else None,
            after.seq if after else None,
        ) == _brute(seq, hidden), seq


def test_a_forgotten_run_reads_each_row_a_bounded_number_of_times(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = set(range(101, 301))  # 200 consecutive hidden turns, all asked about
    reads = 0
    real = store._turn_read

    def counting(*args: object) -> TurnMeta | None:
        nonlocal reads
        reads += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_turn_read", counting)
    got = store.visible_neighbours("alice", "t1", run, lambda m, now: m.seq not in run)
    assert {got[s][0].seq for s in run} == {100}  # type: ignore[union-attr]
    assert {got[s][1].seq for s in run} == {301}  # type: ignore[union-attr]
    assert reads <= 2 * (len(run) + 2)  # one forward and one backward pass (was ~n^2/2)


def test_rows_named_gone_are_stepped_over_unread(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forget's re-context passes its own turns as ``gone``, and the walks step over them unread.

    The walks around a forgotten run of 200 turns read the few rows outside it,
    not the run twice (which made forgetting a 1,000-turn range read 3,000
    rows).
    """
    run = set(range(101, 301))
    rids = {m.seq: m.rid for m in store.thread_turns("alice", "t1")}
    gone = frozenset(rids[s] for s in run)
    read: list[int] = []
    real = store._turn_read

    def counting(txn: object, rid: int, now: float) -> TurnMeta | None:
        read.append(rid)
        return real(txn, rid, now)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_turn_read", counting)
    visible = lambda m, now: m.seq not in run  # noqa: E731
    later = store.visible_neighbours("alice", "t1", run, visible, gone=gone, earlier=False)
    assert {n.seq for _, n in later.values()} == {301}  # type: ignore[union-attr]
    assert all(b is None for b, _ in later.values())
    earlier = store.visible_neighbours("alice", "t1", [301], visible, gone=gone, later=False)
    assert earlier[301][0].seq == 100  # type: ignore[union-attr]
    assert earlier[301][1] is None
    assert not gone & set(read)
    assert len(read) == 2
