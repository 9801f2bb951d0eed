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

Thread rules: :func:`bind` and :func:`step` act on the calling thread only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_local = threading.local()


def bind(hook: Callable[[], None] | None) -> None:
    """Make ``hook`` what :func:`step` calls on this thread (None: nothing)."""
    _local.hook = hook


def step() -> None:
    """A step boundary of the running call: the pool may park it here (see the module docstring)."""
    hook: Callable[[], None] | None = getattr(_local, "hook", None)
    if hook is not None:
        hook()
