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
