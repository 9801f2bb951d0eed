"""Lethe's thread names, shown by the operating system too.

Python names a thread for itself only: ``top -H``, ``ps -L`` and
``/proc/PID/task/TID/comm`` show every thread of a server as ``python``.
Each of Lethe's threads (the event loop ``lethe-loop``, the workers
``lethe-rpc-N``, ``lethe-writer``, ``lethe-sweeper``, ``lethe-follow``) calls
:func:`name_os_thread` as it starts, so an operator (and
``bench/bench_processes.py``, which splits a search's server CPU by thread)
can tell them apart.
"""

from __future__ import annotations

import contextlib
import threading

TASK_COMM_LEN = 15
"""Most bytes of a thread name Linux keeps (``TASK_COMM_LEN`` 16, less the NUL)."""


def name_os_thread() -> None:
    """Give the calling thread's Python name (its first 15 bytes) to the operating system.

    Linux only (``/proc/self/task/TID/comm``); elsewhere, or where the write is
    refused, nothing changes.
    """
    name = threading.current_thread().name.encode("ascii", "replace")[:TASK_COMM_LEN]
    with (
        contextlib.suppress(OSError),
        open(f"/proc/self/task/{threading.get_native_id()}/comm", "wb") as comm,
    ):
        comm.write(name)
