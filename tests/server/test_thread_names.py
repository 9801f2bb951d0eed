"""Lethe's threads carry their names to the operating system (``server._thread_names``)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from server._thread_names import TASK_COMM_LEN, name_os_thread

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc/TID/comm is Linux's")


def _comm_of(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()


def test_a_thread_gives_its_name_to_the_operating_system_cut_to_15_bytes() -> None:
    seen: dict[str, str] = {}

    def body() -> None:
        before = _comm_of(threading.get_native_id())
        name_os_thread()
        seen["before"], seen["after"] = before, _comm_of(threading.get_native_id())

    thread = threading.Thread(target=body, name="lethe-rpc-12-and-more")
    thread.start()
    thread.join()
    assert seen["after"] == "lethe-rpc-12-and-more"[:TASK_COMM_LEN] == "lethe-rpc-12-an"
    assert seen["before"] != seen["after"]
