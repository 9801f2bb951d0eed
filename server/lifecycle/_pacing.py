"""Background work that yields the interpreter to calls: the audit's pace.

The periodic audit reads every record of every owner (a quarter of a second
of one core at 20k turns) on the sweeper's thread. In one
process the threads share one interpreter lock, so while it reads, the
searches beside it waited for that lock: a run of 16 clients that began with
the audit at a server's start measured 2.13 ms of server CPU per search
against 1.82 ms once it was over, and answered 14 % fewer searches a second
(``bench/bench_processes.py``, docs/benchmarks.md "Several processes").

A :class:`Pacer` is called between records. While calls are running or
waiting (``busy``), each slice of work is followed by a sleep that keeps the
work to about ``duty`` of the time (stretches of work without a call to the
pacer count in full: at 20k turns the periodic audit worked 23-25 % of the
time at a duty of 20 %): the lock goes to the calls, and the audit takes
longer. With no call in flight it runs at full speed. Once ``stopped`` it
raises :class:`Stopped` and the work is abandoned.

Thread rules: one pacer per thread of background work (it keeps that thread's
slice); ``busy`` is called from that thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["AUDIT_DUTY_UNDER_LOAD", "Pacer", "Stopped", "never_busy", "never_stopped"]

AUDIT_DUTY_UNDER_LOAD = 0.2
"""Most share of the time the audit works while calls are in flight."""
SLICE_SECONDS = 0.002
"""Work between two looks at ``busy`` (and, when busy, two sleeps)."""
MAX_SLEEP_SECONDS = 0.05
"""Longest single sleep: a call that arrives during it finds the lock free anyway."""


def never_busy() -> bool:
    """The ``busy`` of work with no calls to yield to (tools, tests)."""
    return False


def never_stopped() -> bool:
    """The ``stopped`` of work nobody abandons (an audit outside the sweeper)."""
    return False


class Stopped(Exception):
    """Raised by a :class:`Pacer` whose ``stopped`` is true: the work is abandoned."""


class Pacer:
    """Call it between units of background work; it sleeps while calls are in flight.

    Args:
        busy: whether calls are running or waiting now (the edge's admitted
            calls of this process, for a server; streams are not counted).
        duty: the share of wall time the work may take while ``busy``,
            ``0 < duty <= 1`` (1: never sleeps).
        stopped: whether the work should be abandoned (the sweeper's stop):
            checked at each slice, before any sleep.
        clock: seconds, monotonic (tests pass their own).
        sleep: sleeps for seconds (tests pass their own).

    Raises:
        ValueError: ``duty`` outside ``(0, 1]``.
    """

    def __init__(
        self,
        busy: Callable[[], bool],
        duty: float = AUDIT_DUTY_UNDER_LOAD,
        stopped: Callable[[], bool] = never_stopped,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0.0 < duty <= 1.0:
            raise ValueError(f"duty must be in (0, 1], got {duty}")
        self._busy = busy
        self._stopped = stopped
        self._rest = (1.0 - duty) / duty  # seconds of sleep per second of work
        self._clock = clock
        self._sleep = sleep
        self._since = clock()
        self.slept = 0.0
        """Seconds slept so far."""

    def __call__(self) -> None:
        """Between two units of work: sleep if a slice is spent and calls are in flight.

        Raises:
            Stopped: ``stopped`` is true (looked at once a slice).
        """
        now = self._clock()
        worked = now - self._since
        if worked < SLICE_SECONDS:
            return
        if self._stopped():
            raise Stopped("the work was stopped")
        if self._rest and self._busy():
            pause = min(worked * self._rest, MAX_SLEEP_SECONDS)
            self._sleep(pause)
            self.slept += pause
            now = self._clock()
        self._since = now
