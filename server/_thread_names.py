"""Lethe's thread names, shown by the operating system too.

Python names a thread for itself only: ``top -H``, ``ps -L`` and
``/proc/PID/task/TID/comm`` show every thread of a server as ``python``.
Once a server has started its threads (the event loop ``lethe-loop``, the
workers ``lethe-rpc-N``, ``lethe-writer``, ``lethe-sweeper``,
``lethe-follow``), :func:`name_os_threads` gives their names to the
operating system, so an operator (and ``bench/bench_processes.py``, which
splits a search's server CPU by thread) can tell them apart. A thread's
``comm`` may be written by any thread of its process, so the rooms that start
threads need not know of this.
"""

from __future__ import annotations

import contextlib
import threading

TASK_COMM_LEN = 15
"""Most bytes of a thread name Linux keeps (``TASK_COMM_LEN`` 16, less the NUL)."""


def name_os_threads(prefix: str = "lethe-") -> int:
    """Give each running thread whose Python name starts with ``prefix`` that name (15 bytes).

    Linux only (``/proc/self/task/TID/comm``); elsewhere, or where a write is
    refused, nothing changes.

    Returns:
        How many threads were named.
    """
    named = 0
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None or not thread.name.startswith(prefix):
            continue
        name = thread.name.encode("ascii", "replace")[:TASK_COMM_LEN]
        with (
            contextlib.suppress(OSError),
            open(f"/proc/self/task/{tid}/comm", "wb") as comm,
        ):
            comm.write(name)
            named += 1
    return named
