"""The sweeper's schedule, on a real store: the audit must not run back to back with searches.

The periodic audit reads every owner's records, so on a large store it must not
run back to back with the searches. At a million turns an audit took about 20 s
of the server's CPU every 60 s interval (a third of the samples of the
benchmark's search rounds); the next audit now starts ``duration / AUDIT_DUTY``
after the last one began.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from server._metrics import Metrics
from server.lifecycle import AUDIT_DUTY, Lifecycle, Sweeper
from server.retrieval import Retriever
from server.store import Store


@pytest.fixture
def lifecycle(tmp_path: Path, kek_env: str) -> Iterator[Lifecycle]:
    store = Store(tmp_path / "d")
    yield Lifecycle(store, Retriever(store, None), Metrics(), rotation_interval=0.0)
    store.close()


def _audits_in(
    lifecycle: Lifecycle,
    monkeypatch: pytest.MonkeyPatch,
    audit_seconds: float,
    interval: float,
    *,
    real: bool,
) -> list[float]:
    """Start times of the audits a sweeper runs in one second, each taking ``audit_seconds``.

    When ``real``, the real audit runs first and ``audit_seconds`` follow it.
    """
    starts: list[float] = []
    periodic_audit = lifecycle.periodic_audit

    def audit(stopped: Callable[[], bool], busy: Callable[[], bool]) -> bool:
        starts.append(time.monotonic())
        if real:
            periodic_audit(stopped, busy)
        time.sleep(audit_seconds)
        return True

    monkeypatch.setattr(lifecycle, "periodic_audit", audit)
    sweeper = Sweeper(lifecycle, 0.01, audit_interval=interval)
    sweeper.start()
    time.sleep(1.0)
    sweeper.stop()
    return starts


def test_a_slow_audit_waits_for_its_duty_share(
    lifecycle: Lifecycle, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts = _audits_in(lifecycle, monkeypatch, audit_seconds=0.1, interval=0.0, real=True)
    # back to back it ran about nine times; a 0.1 s audit now waits 0.1 / AUDIT_DUTY
    assert 0.1 / AUDIT_DUTY > 1.0
    assert len(starts) == 1


def test_a_fast_audit_keeps_its_interval(
    lifecycle: Lifecycle, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no real audit here: one stalled by the machine for over 10 ms would
    # rightly push the next one past the 0.2 s interval
    starts = _audits_in(lifecycle, monkeypatch, audit_seconds=0.0, interval=0.2, real=False)
    assert 3 <= len(starts) <= 6
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.19
