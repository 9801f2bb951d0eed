"""LangGraph's own store tests against ``LetheStore`` on a real ``lethe serve``.

The tests are LangGraph's: ``tests/test_store.py`` of ``langgraph-checkpoint``
(unchanged: ``InMemoryStore`` made a ``LetheStore``), and the store tests of
``langgraph-checkpoint-sqlite`` and ``langgraph-checkpoint-postgres`` (their
store fixtures adapted by ``lethe_store_plugin``), each from its source
distribution, fetched from PyPI at test time with pip, pinned by version and
sha256 (:data:`SDISTS`), unpacked under ``.cache/langgraph-suite/`` and never
copied into this repository. They run in pytests of their own in the
unpacked directory (its ``pyproject.toml`` configures them): with the plugin
on a real server, and, where the package's own store can run here, once as
LangGraph ships them (the baseline). Every test must pass on Lethe, except
those in :data:`KNOWN_FAILURES`, each with why (docs/api-guide.md lists the
same), and every test the baseline ran must have run. A known failure that
passes fails this test too, so the list stays true.

``LETHE_NO_NETWORK=1`` skips it (PyPI unreachable); CI runs it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "langgraph-suite"
SDISTS = {
    "langgraph-checkpoint": (
        "4.3.2",
        "fcab8468c7e965d7055e2a35c253d73a145624ef4728b150ca7c361f4afca286",
        ["tests/test_store.py"],
    ),
    "langgraph-checkpoint-sqlite": (
        "3.1.2",
        "4e3f376fa6f192d6ad2a1a4643b039986f1593552ef870e9e45281575de6fbf2",
        ["tests/test_store.py", "tests/test_async_store.py"],
    ),
    "langgraph-checkpoint-postgres": (
        "3.2.0",
        "dffef0e6822d7c614019f7f2c4bdbef42859746aee2d3e6d9d9747cf3744ca90",
        ["tests/test_store.py", "tests/test_async_store.py"],
    ),
}
"""Package → (version, sha256 of its sdist, the test files run). The installed
package must be that version (the ``dev`` extra pins it): its tests import it."""

SELECT = {
    "langgraph-checkpoint-postgres": "not pipe and not pool and not test_large_batches_async",
}
"""Package → the ``-k`` expression of the tests run. The Postgres store's tests
run each store test three times, over a plain connection, a pipeline and a
pool (``[pipe]``, ``[pool]``): one store to Lethe, so the plain one alone is
run (and ``test_abatch_uses_single_pool_checkout``, psycopg's pool, goes
with them); ``test_large_batches_async`` (60,000 operations gathered at once,
20,000 of them listings of the whole store) outlasts its 120 s here, a call
per operation."""

NO_BASELINE = {"langgraph-checkpoint-postgres"}
"""Packages whose own store cannot run here (the Postgres store needs a Postgres server)."""

_ASYNC_ONLY = (
    "an async SQL store (AsyncSqliteStore, AsyncPostgresStore) refuses its blocking "
    "methods on the event loop's thread (asyncio.InvalidStateError); LetheStore's "
    "blocking methods are blocking calls that work from any thread, as InMemoryStore's"
)
_SQL_KEYS = (
    "the SQLite store refuses filter keys that are not JSON-path identifiers, its guard "
    "against SQL injection; LetheStore evaluates filters in Python, so any string is "
    "a key, matched literally, and nothing is refused"
)
_SQL_EXPIRY = (
    "it backdates a row's expires_at with SQL through store._cursor(), which reaches "
    "nothing here (the item's expiry is its memory's retention, set by ttl)"
)
KNOWN_FAILURES: dict[str, dict[str, str]] = {
    "langgraph-checkpoint-postgres": {
        "tests/test_async_store.py::test_no_running_loop[default]": _ASYNC_ONLY,
        **{
            f"tests/{f}::test_omit_expired_{t}[default]": _SQL_EXPIRY
            for f in ("test_store.py", "test_async_store.py")
            for t in (
                "filters_read_paths",
                "refresh_ttl_only_refreshes_live_rows",
                "search_pagination",
            )
        },
    },
    "langgraph-checkpoint-sqlite": {
        "tests/test_store.py::test_vector_store_initialization": (
            "after checking the index config (which passes), it reads SQLite's own tables "
            "(store.conn, sqlite_master) for the vector table"
        ),
        "tests/test_async_store.py::test_no_running_loop[memory]": _ASYNC_ONLY,
        "tests/test_async_store.py::test_no_running_loop[file]": _ASYNC_ONLY,
        "tests/test_store.py::test_sql_injection_vulnerability[memory]": _SQL_KEYS,
        "tests/test_store.py::test_sql_injection_vulnerability[file]": _SQL_KEYS,
    },
}
"""Package → test node id → why it fails on ``LetheStore`` (docs/api-guide.md says the same)."""


def _fetch(package: str, version: str, sha256: str) -> Path:
    """The unpacked sdist of ``package==version``, downloaded once and checked.

    Raises:
        AssertionError: pip failed, or the archive's sha256 is not ``sha256``.
    """
    where = CACHE / f"{package}-{version}"
    unpacked = where / "src"
    if (unpacked / "pyproject.toml").exists():
        return unpacked
    where.mkdir(parents=True, exist_ok=True)
    requirement = where / "requirement.txt"
    requirement.write_text(f"{package}=={version} --hash=sha256:{sha256}\n")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--require-hashes",
            "-r",
            str(requirement),
            "-d",
            str(where),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [archive] = where.glob("*.tar.gz")
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == sha256
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        tar.extractall(where, filter="data")
    (where / top).rename(unpacked)
    return unpacked


def _run(
    src: Path, files: list[str], report: Path, *, baseline: bool, select: str | None = None
) -> dict[str, str]:
    """Run LangGraph's ``files`` in ``src``; each test's outcome."""
    env = {**os.environ, "LETHE_SUITE_REPORT": str(report)}
    here = [Path(__file__).parent, ROOT / "bench", ROOT, src]
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in here)
    if baseline:
        env["LETHE_SUITE_BASELINE"] = "1"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-p",
            "lethe_store_plugin",
            "--timeout",
            "120",
            *(["-k", select] if select else []),
            *files,
        ],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert report.exists(), run.stdout[-4000:] + run.stderr[-4000:]
    outcomes: dict[str, str] = json.loads(report.read_text())
    return outcomes


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get("LETHE_NO_NETWORK")), reason="LETHE_NO_NETWORK set")
@pytest.mark.parametrize("package", sorted(SDISTS))
def test_langgraph_store_tests_pass_on_lethe(package: str, tmp_path: Path) -> None:
    version, sha256, files = SDISTS[package]
    assert importlib.metadata.version(package) == version  # the tests import the package
    src = _fetch(package, version, sha256)
    select = SELECT.get(package)
    ours = _run(src, files, tmp_path / "lethe.json", baseline=False, select=select)
    assert sum(o == "passed" for o in ours.values()) > 50  # the suite ran
    base: dict[str, str] = {}
    if package not in NO_BASELINE:
        base = _run(src, files, tmp_path / "baseline.json", baseline=True, select=select)
    passed_on_baseline = {t for t, o in base.items() if o == "passed"}
    assert len(ours) >= len(base)
    failing = {t for t, o in ours.items() if o == "failed"}
    known = set(KNOWN_FAILURES.get(package, {}))
    unexpected = sorted(failing - known)
    assert unexpected == [], "\n".join(unexpected)
    mended = sorted(t for t in known if ours.get(t) == "passed")
    assert mended == [], "known failures that pass now: " + ", ".join(mended)
    missing = sorted(passed_on_baseline - set(ours))
    assert missing == []
