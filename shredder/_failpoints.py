"""Named crash points inside multi-step operations, for the crash tests.

A failpoint is a place in a multi-step operation (between the keystore commit
and the data commit, between tombstones and key destruction, mid-rotation, …)
where a test can make the process die or fail, to prove that the store
converges when it next opens. They are inert unless the environment variable
``LETHE_FAILPOINTS`` is set when this module is imported::

    LETHE_FAILPOINTS="seal.after_keystore=kill"
    LETHE_FAILPOINTS="keystore.rotate.after_kek=kill;backup.after_copy=kill@2"

Actions:

==========  ==================================================================
``kill``    SIGKILL this process the first time the point is reached
``kill@N``  SIGKILL it the N-th time (1-based)
``eio``     raise ``OSError(EIO)`` there (a disk error)
``enospc``  raise ``OSError(ENOSPC)`` there (a full disk)
==========  ==================================================================

Each package declares its points with :func:`declare` (name and what has
happened when it is reached); :data:`POINTS` lists them all, so a test can
walk every one. Names are ``<operation>.<moment>``.

Thread rules: :func:`failpoint` may be called from any thread.
"""

from __future__ import annotations

import errno
import os
import signal
import threading

__all__ = ["FAILPOINTS_ENV", "POINTS", "declare", "failpoint"]

FAILPOINTS_ENV = "LETHE_FAILPOINTS"
POINTS: dict[str, str] = {}
"""Every declared failpoint: name → what has been done when it is reached."""


def _parse(value: str) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for item in value.replace(",", ";").split(";"):
        if not item.strip():
            continue
        name, _, action = item.strip().partition("=")
        kind, _, count = action.partition("@")
        out[name.strip()] = (kind.strip() or "kill", int(count) if count else 1)
    return out


_ARMED = _parse(os.environ.get(FAILPOINTS_ENV, ""))
_HITS: dict[str, int] = {}
_GUARD = threading.Lock()


def declare(name: str, doc: str) -> str:
    """Declare a failpoint; returns its name (for use as a module constant).

    Raises:
        ValueError: the name is declared twice with another description.
    """
    if POINTS.get(name, doc) != doc:
        raise ValueError(f"failpoint {name} declared twice")
    POINTS[name] = doc
    return name


def failpoint(name: str) -> None:
    """Reach failpoint ``name``: nothing happens unless it is armed.

    Raises:
        OSError: the point is armed with ``eio`` or ``enospc``.
    """
    if not _ARMED:
        return
    armed = _ARMED.get(name)
    if armed is None:
        return
    action, nth = armed
    with _GUARD:
        _HITS[name] = _HITS.get(name, 0) + 1
        hit = _HITS[name]
    if action == "kill" and hit == nth:
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "eio":
        raise OSError(errno.EIO, f"failpoint {name}: injected I/O error")
    elif action == "enospc":
        raise OSError(errno.ENOSPC, f"failpoint {name}: injected full disk")
