"""Durable LMDB environments."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from shredder import EnvironmentConfigError, open_durable_env


def test_open_durable_env_has_required_flags(tmp_path: Path) -> None:
    env = open_durable_env(tmp_path / "env", map_size=1 << 20, max_dbs=2)
    try:
        flags = env.flags()
        assert flags["sync"] is True
        assert flags["metasync"] is True
        assert flags["meminit"] is True
        assert flags["writemap"] is False
        assert flags["map_async"] is False
        assert flags["readonly"] is False
        assert env.info()["map_size"] == 1 << 20
        assert env.max_key_size() >= 511
    finally:
        env.close()


def test_open_durable_env_creates_private_files(tmp_path: Path) -> None:
    path = tmp_path / "env"
    open_durable_env(path, map_size=1 << 20, max_dbs=1).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((path / "data.mdb").stat().st_mode) == 0o600


def test_open_durable_env_readonly(tmp_path: Path) -> None:
    path = tmp_path / "env"
    env = open_durable_env(path, map_size=1 << 20, max_dbs=1)
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    env.close()
    ro = open_durable_env(path, map_size=1 << 20, max_dbs=1, readonly=True)
    try:
        assert ro.flags()["readonly"] is True
        assert ro.flags()["sync"] is True
        with ro.begin() as txn:
            assert txn.get(b"k") == b"v"
    finally:
        ro.close()


def test_open_durable_env_readonly_missing_fails(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentConfigError, match="cannot open"):
        open_durable_env(tmp_path / "absent", map_size=1 << 20, max_dbs=1, readonly=True)


_READER = """
import sys, time
from shredder import open_durable_env
env = open_durable_env(sys.argv[1], map_size=1 << 20, max_dbs=2)
txn = env.begin()  # holds a reader slot until the process dies
print("reading", flush=True)
time.sleep(600)
"""


def test_open_frees_reader_slots_of_a_process_killed_mid_read(tmp_path: Path) -> None:
    """Opening frees the reader slots of a process killed mid-read (mdb_reader_check).

    While another process keeps the environment open, LMDB does not reset its
    reader table, so a reader killed by SIGKILL leaves its slot behind; slots
    left by crashes add up until reads fail with MDB_READERS_FULL.
    """
    import subprocess
    import sys

    path = tmp_path / "env"
    holder = open_durable_env(path, map_size=1 << 20, max_dbs=2)  # keeps the table alive
    try:
        for _ in range(3):
            with subprocess.Popen(
                [sys.executable, "-c", _READER, str(path)], stdout=subprocess.PIPE, text=True
            ) as reader:
                assert reader.stdout is not None
                assert reader.stdout.readline() == "reading\n"
                reader.kill()
                reader.wait(timeout=30)
        check = (
            "import sys; from shredder import open_durable_env; "
            "env = open_durable_env(sys.argv[1], map_size=1 << 20, max_dbs=2); "
            "print(len([l for l in env.readers().splitlines()[1:] if l.strip()]))"
        )
        left = subprocess.run(
            [sys.executable, "-c", check, str(path)], capture_output=True, text=True, check=True
        )
        assert left.stdout.strip() == "0"  # three were stale before this open
    finally:
        holder.close()
