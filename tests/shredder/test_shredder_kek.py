"""The KEK ring: file format, permissions, placement and key hygiene."""

from __future__ import annotations

import base64
import copy
import json
import os
import pickle
import stat
from pathlib import Path

import pytest

from shredder import EnvironmentConfigError, KekRing, check_kek_placement, default_kek_path


def _material(ring: KekRing) -> list[bytes]:
    return [key._material for key in ring._keys.values()]


def test_kek_file_created_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "keks" / "s.kek"
    ring = KekRing.load_or_create(path, create=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert ring.current_version == 1
    assert ring.path == path
    doc = json.loads(path.read_text())
    assert doc["format"] == "lethe-kek/1"
    assert doc["current"] == 1
    assert len(base64.b64decode(doc["keys"]["1"])) == 32
    assert [p.name for p in path.parent.iterdir()] == ["s.kek"]  # no temporary left


def test_kek_file_reloads_same_keys(tmp_path: Path) -> None:
    path = tmp_path / "s.kek"
    first = KekRing.load_or_create(path, create=True)
    again = KekRing.load_or_create(path, create=True)
    loaded = KekRing.load_or_create(path, create=False)
    assert _material(first) == _material(again) == _material(loaded)


def test_kek_file_is_not_replaced_when_created_twice(tmp_path: Path) -> None:
    path = tmp_path / "s.kek"
    KekRing.load_or_create(path, create=True)
    before = path.read_bytes()
    KekRing.load_or_create(path, create=True)
    assert path.read_bytes() == before


def test_missing_kek_file_without_create_fails(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentConfigError, match="does not exist"):
        KekRing.load_or_create(tmp_path / "absent.kek", create=False)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_kek_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "s.kek"
    KekRing.load_or_create(path, create=True)
    os.chmod(path, mode)
    with pytest.raises(EnvironmentConfigError, match="chmod 600"):
        KekRing.load_or_create(path, create=False)


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        json.dumps({"format": "other", "current": 1, "keys": {"1": "AA=="}}).encode(),
        json.dumps({"format": "lethe-kek/1", "current": 2, "keys": {"1": "A" * 44}}).encode(),
        json.dumps({"format": "lethe-kek/1", "current": 1, "keys": {"1": "AAAA"}}).encode(),
        json.dumps({"format": "lethe-kek/1", "current": 1, "keys": {"1": "!!"}}).encode(),
        json.dumps({"format": "lethe-kek/1", "current": 1, "keys": {"x": "A" * 44}}).encode(),
        json.dumps({"format": "lethe-kek/1", "current": 1, "keys": {}}).encode(),
        json.dumps({"format": "lethe-kek/1", "current": "1", "keys": {"1": "A" * 44}}).encode(),
    ],
)
def test_malformed_kek_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "s.kek"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    with pytest.raises(EnvironmentConfigError, match="malformed"):
        KekRing.load_or_create(path, create=False)


def test_kek_file_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.kek"
    path.mkdir(mode=0o700)
    with pytest.raises(EnvironmentConfigError, match="regular file"):
        KekRing.load_or_create(path, create=False)


def test_from_env_round_trip() -> None:
    value = KekRing.generate_env_value()
    ring = KekRing.from_env(value)
    assert ring.current_version == 1
    assert ring.path is None
    assert _material(ring) == [base64.urlsafe_b64decode(value)]
    assert KekRing.generate_env_value() != value


@pytest.mark.parametrize(
    "value", ["", "not base64 at all!", base64.urlsafe_b64encode(b"x" * 31).decode()]
)
def test_from_env_with_bad_value_fails(value: str) -> None:
    with pytest.raises(EnvironmentConfigError):
        KekRing.from_env(value)


def test_pickling_kek_ring_fails(tmp_path: Path) -> None:
    ring = KekRing.load_or_create(tmp_path / "s.kek", create=True)
    with pytest.raises(TypeError):
        pickle.dumps(ring)
    with pytest.raises(TypeError):
        copy.copy(ring)


def test_kek_ring_repr_shows_no_material(tmp_path: Path) -> None:
    value = KekRing.generate_env_value()
    for ring in (KekRing.from_env(value), KekRing.load_or_create(tmp_path / "s.kek", create=True)):
        shown = repr(ring) + str(ring)
        assert "KekRing" in shown
        for material in _material(ring):
            for encoding in (
                material.hex(),
                base64.b64encode(material).decode(),
                base64.urlsafe_b64encode(material).decode(),
                repr(material),
            ):
                assert encoding not in shown


def test_default_kek_path_honours_xdg_config_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert default_kek_path("abc123") == tmp_path / "cfg" / "lethe" / "keks" / "abc123.kek"


@pytest.mark.parametrize("store_id", ["", "../x", "a/b", ".hidden"])
def test_default_kek_path_with_unsafe_store_id_fails(store_id: str) -> None:
    with pytest.raises(ValueError, match="store id"):
        default_kek_path(store_id)


def test_kek_inside_data_dir_is_refused(tmp_path: Path) -> None:
    data, backup = tmp_path / "data", tmp_path / "backup"
    data.mkdir()
    backup.mkdir()
    with pytest.raises(EnvironmentConfigError, match="inside"):
        check_kek_placement(data / "keys" / "s.kek", [data, backup])
    with pytest.raises(EnvironmentConfigError, match="inside"):
        check_kek_placement(backup / "s.kek", [data, backup])
    with pytest.raises(EnvironmentConfigError, match="inside"):
        check_kek_placement(data / ".." / "data" / "s.kek", [data])


def test_kek_via_symlink_into_data_dir_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "innocent").symlink_to(data)
    with pytest.raises(EnvironmentConfigError, match="inside"):
        check_kek_placement(tmp_path / "innocent" / "s.kek", [data])
    # and a forbidden directory given through a symlink
    with pytest.raises(EnvironmentConfigError, match="inside"):
        check_kek_placement(data / "s.kek", [tmp_path / "innocent"])


def test_kek_outside_forbidden_dirs_is_accepted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    check_kek_placement(tmp_path / "data-keks" / "s.kek", [data])  # a name prefix is not inside
    check_kek_placement(tmp_path / "s.kek", [data])
