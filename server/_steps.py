"""Step boundaries of long calls: where a call gives the CPU back to other principals.

A large write (an ``AppendTurns`` of hundreds of 16 KiB turns) runs for
seconds on a worker of the fair pool (:class:`server.edge.FairExecutor`).
Python threads share one interpreter lock, so while it runs it takes a share
of the CPU from every other call; if one principal has several such calls
running when another principal's call arrives, that call waits behind all of
them. The pool bounds what one principal may run at once while others have
work, but it can only start fewer calls, not stop running ones: so long
calls mark their step boundaries with :func:`step`, and at each one the pool
may park the call (its worker waits, its running slot goes to another
principal's call) until the principal's turn comes again.

:func:`step` must be called with no lock held (a parked call keeps what it
holds): between whole phases of a call (embedding a chunk of texts, tagging
a chunk of turns), never inside the store's or an index's critical section.
Outside the pool (tests, the CLI, the Connect transport's own threads) it
does nothing.

Waits: the pool also bounds how many calls run *at once*, whoever they are
(``--max-running``: Python threads share one interpreter lock, and more
threads running Python at once only cost more switching). A call that waits
— for the writer's group commit, for another call's build of an owner's
index — runs nothing meanwhile, so it waits inside :func:`blocking`: its
running slot goes to the next call for the wait and it takes a slot again
before it goes on. Outside the pool :func:`blocking` does nothing either.

Thread rules: :func:`bind`, :func:`step` and :func:`blocking` act on the
calling thread only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol

_local = threading.local()


class Slot(Protocol):
    """What the pool binds to the thread of a running call (:func:`bind`)."""

    def step(self) -> None:
        """A step boundary: the call may be parked here until its turn comes again."""

    def release(self) -> None:
        """The call is about to wait: its running slot may go to another call."""

    def resume(self) -> None:
        """The wait is over: return once the call holds a running slot again."""


def bind(slot: Slot | None) -> None:
    """Make ``slot`` the running call's (None: the thread runs no pool call)."""
    _local.slot = slot
    _local.waiting = False


def step() -> None:
    """A step boundary of the running call: the pool may park it here (see the module docstring)."""
    slot: Slot | None = getattr(_local, "slot", None)
    if slot is not None and not _local.waiting:
        slot.step()


@contextlib.contextmanager
def blocking() -> Iterator[None]:
    """The block waits, running no Python to speak of: the call's running slot is lent meanwhile.

    Nested blocks lend it once. The block may hold locks: the call takes a
    slot again after it, whatever it holds (slots are never waited for while
    holding one).
    """
    slot: Slot | None = getattr(_local, "slot", None)
    if slot is None or _local.waiting:
        yield
        return
    _local.waiting = True
    slot.release()
    try:
        yield
    finally:
        _local.waiting = False
        slot.resume()
