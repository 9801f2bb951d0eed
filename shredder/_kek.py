"""The KEK ring: versioned key-encryption keys that wrap ring keys.

The KEK lives outside the data and backup paths (see `check_kek_placement`), so that a copy of
the data or of the keystore alone opens nothing, and destroying an old KEK version makes every
lingering copy of the keys it wrapped unrecoverable.

KEK file (written by `KekRing.load_or_create`), UTF-8 JSON, mode 0600 in a 0700 directory::

    {"format": "lethe-kek/1", "current": 1, "keys": {"1": "<standard base64 of 32 bytes>"}}

``current`` is the version that wraps new ring keys; ``keys`` maps each live version (a decimal
string of an integer in ``[1, 2**32)``) to its 32-byte key.

Environment value (`KekRing.from_env`, for tests): URL-safe base64 of 32 bytes, used as version 1.

Every write of the KEK file goes through a temporary file beside it,
``.{name}.{16 hex}.tmp`` (mode 0600), synced, then renamed or linked into
place. A crash between the two leaves that temporary file behind, holding KEK
versions a later rotation destroys in the KEK file: with it, a keystore copy
from before a forget would open the forgotten record again. So no temporary
file outlives the next write or the next exclusive open of the store: each
write removes every stray one (`KekRing.remove_stray_files`: overwritten with
zeros, synced, unlinked, the directory synced) once its own file is in place,
and the server removes them at start-up before it serves. A rotation (phase 2
of a shred) ends with such a write, so after a completed rotation no file in
the KEK's directory holds a version it destroyed. `KekRing.stray_files` lists
them (``lethe audit`` counts them). Failpoints ``kek.write.after_temp`` and
``kek.write.after_replace`` mark the two moments a crash can cut a write at.

Thread rules: a `KekRing` is immutable after construction and safe to use from any thread.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import nacl.utils
import platformdirs

from shredder._aead import KEY_SIZE, _Key, _unwrap_key, _wrap_key, _wrapped_version
from shredder._failpoints import declare, failpoint
from shredder._lmdbenv import fsync_dir
from shredder.errors import EnvironmentConfigError, KeyNotFoundError

_FORMAT = "lethe-kek/1"
_U32_MAX = 2**32 - 1
_STORE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")

_TEMP_SUFFIX = re.compile(r"\.[0-9a-f]{16}\.tmp")
"""What follows ``.{KEK file name}`` in the name of a temporary KEK file."""

FP_KEK_AFTER_TEMP = declare(
    "kek.write.after_temp",
    "the new KEK file is written and synced under its temporary name; the old one is in place",
)
FP_KEK_AFTER_REPLACE = declare(
    "kek.write.after_replace",
    "the new KEK file is in place; stray temporary KEK files are not removed yet",
)

_AdBuilder = Callable[[int], bytes]
"""Builds the encoded associated data of a wrapped ring key for a given KEK version."""


class KekRing:
    """Versioned key-encryption keys.

    Refuses pickling and copying (``__reduce__`` and ``__getstate__`` raise TypeError); repr
    and str never show key material. Build one with `load_or_create` or `from_env`.
    """

    __slots__ = ("_current", "_keys", "_path")

    def __init__(self, keys: Mapping[int, _Key], current: int, path: Path | None) -> None:
        """Internal: use `load_or_create` or `from_env`.

        Args:
            keys: KEK version to key.
            current: Version used to wrap new ring keys; must be in `keys`.
            path: The KEK file, or None for an in-memory ring.

        Raises:
            EnvironmentConfigError: If `current` is not in `keys`.
        """
        if current not in keys:
            raise EnvironmentConfigError("current KEK version has no key")
        self._keys = dict(keys)
        self._current = current
        self._path = path

    @classmethod
    def load_or_create(cls, path: Path, *, create: bool) -> KekRing:
        """Load the KEK file at `path`, or create it with one new random version.

        A new file is written atomically: created with mode 0600 under a temporary name,
        fsynced, linked into place without replacing anything, and the directory fsynced. A
        missing parent directory is created with mode 0700. If another process creates the
        file concurrently, its file is loaded.

        Args:
            path: The KEK file.
            create: Whether to create the file if it does not exist.

        Returns:
            The KEK ring.

        Raises:
            EnvironmentConfigError: If the file is missing and `create` is False; if it is
                not a regular file, its mode grants any group or other permission, or it is
                malformed (bad JSON, format tag, versions or key sizes); or if it cannot be
                read or written.
        """
        path = Path(path)
        if create and not path.exists():
            keys = {1: _Key.generate()}
            try:
                _write_new_file(path, _dump(keys, 1))
            except FileExistsError:
                pass  # created concurrently: load that one
            except OSError as exc:
                raise EnvironmentConfigError(
                    f"cannot create KEK file {path}: {exc.strerror}"
                ) from None
        return cls._load(path)

    @classmethod
    def _load(cls, path: Path) -> KekRing:
        try:
            st = path.stat()
        except FileNotFoundError:
            raise EnvironmentConfigError(
                f"KEK file {path} does not exist, but the store was created with a KEK: "
                "pass the KEK's location with --kek-file (or restore the file there); "
                "without it the store's keys cannot be opened"
            ) from None
        except OSError as exc:
            raise EnvironmentConfigError(f"cannot stat KEK file {path}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise EnvironmentConfigError(f"KEK file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise EnvironmentConfigError(
                f"KEK file {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must not grant "
                "group or other access (chmod 600)"
            )
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise EnvironmentConfigError(f"cannot read KEK file {path}: {exc.strerror}") from None
        keys, current = _parse(raw, path)
        return cls(keys, current, path)

    @classmethod
    def from_env(cls, value: str) -> KekRing:
        """Build an in-memory ring with one version (1) from an environment value.

        Args:
            value: URL-safe base64 of 32 bytes, as made by `generate_env_value`.

        Returns:
            The KEK ring; its `path` is None.

        Raises:
            EnvironmentConfigError: If `value` is not URL-safe base64 of exactly 32 bytes.
        """
        try:
            material = base64.urlsafe_b64decode(value.strip().encode("ascii"))
        except (binascii.Error, ValueError, AttributeError):
            raise EnvironmentConfigError("KEK value is not URL-safe base64") from None
        if len(material) != KEY_SIZE:
            raise EnvironmentConfigError(f"KEK value must decode to {KEY_SIZE} bytes")
        return cls({1: _Key(material)}, 1, None)

    @staticmethod
    def generate_env_value() -> str:
        """Return a new random KEK as URL-safe base64 of 32 bytes, for `from_env`."""
        return base64.urlsafe_b64encode(nacl.utils.random(KEY_SIZE)).decode("ascii")

    @property
    def current_version(self) -> int:
        """The KEK version that wraps new ring keys."""
        return self._current

    @property
    def path(self) -> Path | None:
        """The KEK file, or None for a ring built by `from_env`."""
        return self._path

    @property
    def versions(self) -> frozenset[int]:
        """Every KEK version this ring holds."""
        return frozenset(self._keys)

    def _wrap(self, ad_for_version: _AdBuilder, key: _Key) -> bytes:
        """Wrap a ring key under the current KEK version.

        Args:
            ad_for_version: Builds the associated data for a given KEK version.
            key: The ring key.

        Returns:
            A 77-byte wrapped key whose version field is the KEK version.
        """
        version = self._current
        return _wrap_key(self._keys[version], version, ad_for_version(version), key)

    def _unwrap(self, ad_for_version: _AdBuilder, wrapped: bytes) -> _Key:
        """Unwrap a ring key under the KEK version named in `wrapped`.

        Args:
            ad_for_version: Builds the associated data for a given KEK version.
            wrapped: A 77-byte wrapped key.

        Returns:
            The ring key.

        Raises:
            KeyNotFoundError: If this ring has no key for the KEK version used.
            IntegrityError: If `wrapped` is malformed or fails authentication (wrong KEK).
        """
        version = _wrapped_version(wrapped)
        kek = self._keys.get(version)
        if kek is None and self._path is not None and version > max(self._keys):
            self.reload()  # another process sharing the store rotated: a newer version
            kek = self._keys.get(version)
        if kek is None:
            raise KeyNotFoundError(f"KEK version {version} is not available")
        return _unwrap_key(kek, ad_for_version(version), wrapped)

    def reload(self) -> bool:
        """Read the KEK file again (another process sharing the store rotated it).

        Versions the file no longer holds leave this ring's memory too; a ring
        in memory only (``from_env``) never changes.

        Returns:
            Whether the versions or the current one changed.

        Raises:
            EnvironmentConfigError: the file is missing, unreadable or malformed.
        """
        if self._path is None:
            return False
        fresh = KekRing._load(self._path)
        if fresh._current == self._current and fresh._keys.keys() == self._keys.keys():
            return False
        self._keys, self._current = fresh._keys, fresh._current
        return True

    def __repr__(self) -> str:
        where = "env" if self._path is None else str(self._path)
        return f"<KekRing current={self._current} versions={sorted(self._keys)} from={where}>"

    __str__ = __repr__

    def add_version(self) -> int:
        """Add a new random KEK version and make it current (persisted first).

        Returns:
            The new version.

        Raises:
            EnvironmentConfigError: the ring lives in memory only (``from_env``).
            OSError: the KEK file cannot be rewritten.
        """
        if self._path is None:
            raise EnvironmentConfigError(
                "an in-memory KEK (LETHE_KEK) cannot be rotated: the new version would not "
                "survive a restart; use a KEK file"
            )
        version = max(self._keys) + 1
        keys = {**self._keys, version: _Key.generate()}
        self._persist(keys, version)
        self._keys, self._current = keys, version
        return version

    def retire(self, versions: Sequence[int]) -> None:
        """Destroy KEK versions other than the current one (persisted).

        After this, nothing wrapped under a retired version can be unwrapped by
        anyone: copies of destroyed ring keys in free pages or old keystore
        snapshots become useless (the cryptographic completion of a shred).

        Raises:
            ValueError: a version is the current one.
            OSError: the KEK file cannot be rewritten.
        """
        if self._current in versions:
            raise ValueError("the current KEK version cannot be retired")
        keys = {v: k for v, k in self._keys.items() if v not in set(versions)}
        self._persist(keys, self._current)
        self._keys = keys

    def _persist(self, keys: Mapping[int, _Key], current: int) -> None:
        """Replace the KEK file atomically (temp file 0600, fsync, rename, fsync dir).

        Then every stray temporary KEK file is removed (see the module docstring).
        An in-memory ring (``from_env``) only changes in memory.
        """
        if self._path is None:
            return
        tmp = _temp_path(self._path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, _dump(keys, current))
            os.fsync(fd)
        finally:
            os.close(fd)
        failpoint(FP_KEK_AFTER_TEMP)
        os.replace(tmp, self._path)
        fsync_dir(self._path.parent)
        failpoint(FP_KEK_AFTER_REPLACE)
        self.remove_stray_files()

    def stray_files(self) -> list[Path]:
        """Temporary KEK files a write cut short by a crash left beside the KEK file.

        Returns:
            Their paths, sorted; empty for an in-memory ring or a missing directory.
        """
        return [] if self._path is None else _stray_files(self._path)

    def remove_stray_files(self) -> int:
        """Remove every stray temporary KEK file (overwritten with zeros, synced, unlinked).

        Only the process that writes the KEK file may call it (the one holding the
        store's lock): another process's write in flight would lose its file.

        Returns:
            How many were removed.

        Raises:
            OSError: a stray file cannot be overwritten or removed.
        """
        strays = self.stray_files()
        for stray in strays:
            _shred_file(stray)
        if strays and self._path is not None:
            fsync_dir(self._path.parent)
        return len(strays)

    def __reduce__(self) -> NoReturn:
        raise TypeError("KekRing cannot be pickled")

    def __getstate__(self) -> NoReturn:
        raise TypeError("KekRing cannot be pickled")


def default_kek_path(store_id: str) -> Path:
    """Return the default KEK file for a keystore.

    Args:
        store_id: The keystore's id (see `Keystore.store_id`).

    Returns:
        ``platformdirs.user_config_dir("lethe") / "keks" / f"{store_id}.kek"``; on Linux
        that honours ``XDG_CONFIG_HOME``.

    Raises:
        ValueError: If `store_id` is not 1 to 128 characters of ``[A-Za-z0-9_-]``.
    """
    if _STORE_ID.fullmatch(store_id) is None:
        raise ValueError("invalid store id")
    return Path(platformdirs.user_config_dir("lethe")) / "keks" / f"{store_id}.kek"


def check_kek_placement(kek_path: Path, forbidden: Sequence[Path]) -> None:
    """Refuse a KEK file inside the data or backup paths.

    Both sides are resolved (symlinks followed, relative paths made absolute) before
    comparing, so a symlink pointing into a forbidden directory is caught.

    Args:
        kek_path: The KEK file (need not exist yet).
        forbidden: Directories the KEK must not be in (data directory, backup directory).

    Raises:
        EnvironmentConfigError: If the resolved `kek_path` equals or lies inside any
            resolved directory of `forbidden`.
    """
    kek = Path(kek_path).resolve()
    for directory in forbidden:
        bad = Path(directory).resolve()
        if kek == bad or kek.is_relative_to(bad):
            raise EnvironmentConfigError(
                f"KEK file {kek_path} lies inside {directory}; keep the KEK outside the data "
                "and backup paths, or a copy of them would carry the key"
            )


def _dump(keys: Mapping[int, _Key], current: int) -> bytes:
    doc = {
        "format": _FORMAT,
        "current": current,
        "keys": {
            str(v): base64.b64encode(k._material).decode("ascii") for v, k in sorted(keys.items())
        },
    }
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def _parse(raw: bytes, path: Path) -> tuple[dict[int, _Key], int]:
    def bad(why: str) -> EnvironmentConfigError:
        return EnvironmentConfigError(f"KEK file {path} is malformed: {why}")

    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise bad("not UTF-8 JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise bad(f"format is not {_FORMAT!r}")
    current = doc.get("current")
    entries = doc.get("keys")
    if isinstance(current, bool) or not isinstance(current, int):
        raise bad("'current' is not an integer")
    if not isinstance(entries, dict) or not entries:
        raise bad("'keys' is not a non-empty object")
    keys: dict[int, _Key] = {}
    for name, encoded in entries.items():
        if not (isinstance(name, str) and name.isdigit() and 1 <= int(name) <= _U32_MAX):
            raise bad("a key version is not an integer in [1, 2**32)")
        if not isinstance(encoded, str):
            raise bad(f"key {name} is not a string")
        try:
            material = base64.b64decode(encoded.encode("ascii"), validate=True)
        except (binascii.Error, ValueError):
            raise bad(f"key {name} is not base64") from None
        if len(material) != KEY_SIZE:
            raise bad(f"key {name} is not {KEY_SIZE} bytes")
        keys[int(name)] = _Key(material)
    if current not in keys:
        raise bad("'current' names no key")
    return keys, current


def _write_new_file(path: Path, data: bytes) -> None:
    """Atomically create `path` with mode 0600 holding `data`; never replace an existing file.

    Raises:
        FileExistsError: If `path` already exists.
        OSError: On any other I/O failure.
    """
    parent = path.parent
    if not parent.exists():
        parent.mkdir(mode=0o700, parents=True)
        os.chmod(parent, 0o700)  # mkdir's mode is reduced by the umask
        fsync_dir(parent.parent)
    tmp = _temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(tmp, path)  # unlike rename, fails rather than replace an existing KEK
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(parent)


def _temp_path(path: Path) -> Path:
    """A new temporary name beside the KEK file ``path``: ``.{name}.{16 hex}.tmp``."""
    return path.parent / f".{path.name}.{nacl.utils.random(8).hex()}.tmp"


def _stray_files(path: Path) -> list[Path]:
    """The temporary files of KEK writes of ``path`` present in its directory."""
    prefix = f".{path.name}"
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return []
    return sorted(
        path.parent / name
        for name in names
        if name.startswith(prefix) and _TEMP_SUFFIX.fullmatch(name[len(prefix) :])
    )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _shred_file(path: Path) -> None:
    """Overwrite ``path`` with zeros (synced), then unlink it; a file already gone is fine.

    The overwrite keeps a copy of the bytes out of the file's blocks on file
    systems that rewrite in place; on copy-on-write or journalled data it is
    best effort, and the rotation's destroyed KEK versions are what guarantees
    that an old copy opens nothing.
    """
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        _write_all(fd, bytes(os.fstat(fd).st_size))
        os.fsync(fd)
    finally:
        os.close(fd)
    path.unlink(missing_ok=True)
