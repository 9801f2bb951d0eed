"""Lethe's threads carry their names to the operating system (``server._thread_names``)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from server._thread_names import TASK_COMM_LEN, name_os_threads

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc/TID/comm is Linux's")


def _comm_of(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()


def test_lethe_threads_give_their_names_to_the_operating_system_cut_to_15_bytes() -> None:
    stop = threading.Event()
    ours = threading.Thread(target=stop.wait, name="lethe-rpc-12-and-more")
    other = threading.Thread(target=stop.wait, name="someone-else")
    ours.start()
    other.start()
    try:
        assert ours.native_id is not None
        assert other.native_id is not None
        before = _comm_of(other.native_id)
        assert name_os_threads() >= 1
        assert _comm_of(ours.native_id) == "lethe-rpc-12-and-more"[:TASK_COMM_LEN]
        assert _comm_of(ours.native_id) == "lethe-rpc-12-an"
        assert _comm_of(other.native_id) == before  # not ours: left alone
    finally:
        stop.set()
        ours.join()
        other.join()


def test_a_serving_server_names_its_threads(lethe: object) -> None:
    """The server in process (``lethe`` fixture): its loop, workers and writer are named."""
    import os

    names = {
        (Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        for tid in os.listdir("/proc/self/task")
    }
    assert {"lethe-loop", "lethe-writer"} <= names
    assert any(n.startswith("lethe-rpc-") for n in names)
