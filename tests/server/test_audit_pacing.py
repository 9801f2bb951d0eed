"""The periodic audit yields to calls: a Pacer sleeps between records while calls are in flight.

Before, the audit read every record of every owner in one burst on the
sweeper's thread; the searches beside it waited for the interpreter lock (a
16-client run that began inside the start-up audit measured 2.13 ms of server
CPU per search against 1.82 ms after it, ``bench/bench_processes.py``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import numpy as np
import pytest
from _helpers import wait_for
from conftest import Lethe

from server._metrics import Metrics
from server.lifecycle import Lifecycle, Sweeper
from server.lifecycle import _lifecycle as lifecycle_module
from server.lifecycle._pacing import MAX_SLEEP_SECONDS, SLICE_SECONDS, Pacer, never_busy
from server.retrieval import Retriever
from server.store import ForgetTargets, Store, TurnDraft

OWNER = "pace"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _pacer(busy: bool, duty: float = 0.2) -> tuple[Pacer, _Clock, list[int]]:
    clock = _Clock()
    asked: list[int] = []

    def is_busy() -> bool:
        asked.append(1)
        return busy

    return Pacer(is_busy, duty, clock=clock, sleep=clock.sleep), clock, asked


def test_a_pacer_sleeps_four_times_its_work_at_a_fifth_duty_while_busy() -> None:
    pace, clock, _ = _pacer(busy=True, duty=0.2)
    clock.now += 0.004  # a spent slice of 4 ms
    pace()
    assert clock.sleeps == [pytest.approx(0.016)]
    assert pace.slept == pytest.approx(0.016)
    clock.now += 0.001  # under a slice: no look at busy, no sleep
    pace()
    assert len(clock.sleeps) == 1


def test_a_pacer_never_sleeps_while_idle_and_looks_once_a_slice() -> None:
    pace, clock, asked = _pacer(busy=False)
    for _ in range(100):
        clock.now += SLICE_SECONDS / 4
        pace()
    assert clock.sleeps == []
    assert len(asked) == 25  # once every fourth call: each slice spent


def test_a_long_stretch_of_work_sleeps_at_most_the_cap() -> None:
    pace, clock, _ = _pacer(busy=True, duty=0.2)
    clock.now += 1.0
    pace()
    assert clock.sleeps == [MAX_SLEEP_SECONDS]


def test_a_full_duty_never_sleeps_and_a_bad_one_is_refused() -> None:
    pace, clock, asked = _pacer(busy=True, duty=1.0)
    clock.now += 1.0
    pace()
    assert clock.sleeps == []
    assert asked == []  # nothing to decide: busy is not even asked
    for duty in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="duty"):
            Pacer(never_busy, duty)


def _draft(i: int, rng: np.random.Generator) -> TurnDraft:
    text, vector = f"turn {i} about the garden", rng.random(8, np.float32)
    return TurnDraft(1, "ann", text, 1.68e9 + i, vector, "", [], True, 3600.0)


@pytest.fixture
def lifecycle(tmp_path: Path, kek_env: str) -> Iterator[Lifecycle]:
    store = Store(tmp_path / "d")
    retriever = Retriever(store, None)
    store.create_thread(OWNER, "t1", "")
    rng = np.random.default_rng(0)
    for start in range(0, 3000, 500):
        drafts = [_draft(i, rng) for i in range(start, start + 500)]
        metas, _, _ = store.append_turns(OWNER, "t1", drafts, "")
        retriever.on_write(OWNER, metas, None, retriever.removals(OWNER))
    retriever.owner_bundle(OWNER)  # loaded: the audit measures its drift too
    yield Lifecycle(store, retriever, Metrics(), rotation_interval=0.0)
    store.close()


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[Pacer]:
    """Every pacer the periodic audit makes, in order."""
    pacers: list[Pacer] = []

    class Recording(Pacer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            pacers.append(self)

    monkeypatch.setattr(lifecycle_module, "Pacer", Recording)
    return pacers


def test_the_store_audit_paces_each_record_read_and_each_checked(lifecycle: Lifecycle) -> None:
    calls: list[int] = []
    counts = lifecycle.store.audit(OWNER, integrity=False, pace=lambda: calls.append(1))
    assert counts.checked == 3000
    assert len(calls) == 2 * 3000  # each turn read, then each turn's key looked up


def test_the_periodic_audit_sleeps_while_calls_are_in_flight(
    lifecycle: Lifecycle, made: list[Pacer]
) -> None:
    assert lifecycle.periodic_audit() is True  # idle: busy is never_busy
    assert len(made) == 1
    assert made[0].slept == 0.0
    assert lifecycle.periodic_audit(busy=lambda: True) is True
    assert len(made) == 2
    assert made[1].slept > 0.0  # 3,000 turns read and checked take several slices


def test_the_periodic_audit_counts_neither_drift_nor_keys_no_gauge_shows(
    lifecycle: Lifecycle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index drift and the keys without a record were counted, then dropped (40 % of it)."""

    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("the periodic audit has no gauge for this")

    monkeypatch.setattr(lifecycle.retriever, "index_drift", refuse)
    monkeypatch.setattr(lifecycle.store, "_unused", refuse)
    assert lifecycle.periodic_audit() is True
    monkeypatch.undo()
    assert lifecycle.audit(OWNER, integrity=False).checked == 3000  # asked for: counts all


def test_a_forget_that_lands_during_the_audit_is_not_counted_as_a_key_loss(
    lifecycle: Lifecycle,
) -> None:
    """A record the audit's snapshot showed live may have lost its key by its check.

    A forget marks its records deleted, then destroys their keys.
    """
    lifecycle.store.create_thread(OWNER, "t2", "")
    drafts = [_draft(i, np.random.default_rng(1)) for i in range(500)]
    lifecycle.store.append_turns(OWNER, "t2", drafts, "")
    calls: list[int] = []

    def forget_mid_way() -> None:
        calls.append(1)
        if len(calls) == 3600:  # every turn read; 100 keys checked
            done = threading.Thread(
                target=lifecycle.forget, args=(OWNER, ForgetTargets(threads=("t2",)))
            )
            done.start()
            done.join()

    counts = lifecycle.store.audit(OWNER, integrity=False, pace=forget_mid_way)
    assert len(calls) > 3600
    assert counts.records_without_key == 0
    assert lifecycle.store.audit(OWNER, integrity=False).checked == 3000  # t2 is gone


def test_a_stopped_periodic_audit_is_abandoned_and_leaves_the_gauges(
    lifecycle: Lifecycle,
) -> None:
    lifecycle.metrics.records_without_key.set(7)
    assert lifecycle.periodic_audit(stopped=lambda: True) is False
    assert lifecycle.metrics.records_without_key._value.get() == 7


def test_the_sweeper_hands_its_stop_and_its_busy_to_the_audit(
    lifecycle: Lifecycle, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[tuple[Callable[[], bool], Callable[[], bool]]] = []

    def audit(stopped: Callable[[], bool], busy: Callable[[], bool]) -> bool:
        handed.append((stopped, busy))
        return True

    def calls_in_flight() -> bool:
        return True

    monkeypatch.setattr(lifecycle, "periodic_audit", audit)
    sweeper = Sweeper(lifecycle, 0.01, busy=calls_in_flight)
    sweeper.start()
    wait_for(lambda: bool(handed), "the sweeper's first audit")
    stopped, busy = handed[0]
    assert busy is calls_in_flight
    assert stopped() is False
    sweeper.stop()
    assert stopped() is True


def _on_loop(lethe: Lethe, step: Callable[[], object]) -> None:
    """Run ``step`` on the server's event loop (Admission's only thread) and wait for it."""
    assert lethe.server is not None
    loop = lethe.server._loop
    assert loop is not None

    async def run() -> None:
        step()

    asyncio.run_coroutine_threadsafe(run(), loop).result(timeout=10)


def test_a_serving_server_tells_its_audit_when_calls_are_in_flight(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    lethe = lethe_at(tmp_path / "d", sweep_interval=60.0)  # a sweeper that waits
    assert lethe.server is not None
    sweeper = lethe.server._sweeper
    assert sweeper is not None
    busy = sweeper._busy
    assert busy is not never_busy
    assert busy() is False  # no call in flight
    edge = lethe.server.edge
    assert edge is not None
    _on_loop(lethe, lambda: edge.admission.enter_call("someone"))
    try:
        assert busy() is True
    finally:
        _on_loop(lethe, lambda: edge.admission.exit_call("someone"))
    assert busy() is False


def test_an_audit_stopped_mid_way_is_abandoned_at_its_next_slice(
    lifecycle: Lifecycle, made: list[Pacer]
) -> None:
    """A stop never waits out a paced audit.

    Calls cancelled by the drain never give their admission back, so busy may
    stay true; the stop is looked at before each sleep.
    """
    stops: list[int] = []

    def stop_after_one_sleep() -> bool:
        stops.append(1)
        return len(stops) > 1

    assert lifecycle.periodic_audit(stop_after_one_sleep, busy=lambda: True) is False
    assert 0.0 < made[0].slept <= MAX_SLEEP_SECONDS  # one slice's sleep, then abandoned
