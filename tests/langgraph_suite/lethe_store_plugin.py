"""A pytest plugin that runs LangGraph's own store tests against ``LetheStore`` on a real server.

Loaded with ``-p lethe_store_plugin`` by ``test_langgraph_suite.py`` into a
pytest run of its own, in the unpacked source distribution of a LangGraph
package (their tests, their configuration; never copied into this
repository). At configure time it starts one ``lethe serve`` (loopback, a
free port, no embedder, its own data directory and KEK: ``bench/_server.py``) and makes
``langgraph.store.memory.InMemoryStore`` a ``LetheStore`` on it, each
instance on an owner of its own, before the test modules import it: the
tests run unchanged. ``LETHE_SUITE_REPORT`` names a JSON file that gets each
test's outcome (``{"nodeid": "passed" | "failed" | "skipped"}``); with
``LETHE_SUITE_BASELINE`` set, nothing is swapped (LangGraph's own store runs,
the baseline the Lethe run is compared with).

The SQLite store's tests (``langgraph-checkpoint-sqlite``) make their stores
in fixtures with ``SqliteStore.from_conn_string`` / ``AsyncSqliteStore.
from_conn_string`` and ``setup()``: the adapted fixture is those two
constructors, which here yield a ``LetheStore`` (its ``index``'s
``text_fields`` taken as ``fields``) on a fresh owner. The Postgres store's
(``langgraph-checkpoint-postgres``) also create and drop a database per test
through psycopg: here ``psycopg.Connection.connect`` and
``AsyncConnection.connect`` give a connection that executes nothing, and
``PostgresStore.from_conn_string`` / ``AsyncPostgresStore.from_conn_string``
yield a ``LetheStore`` whose ``setup``, TTL sweeper and ``_cursor`` do
nothing (SQL run on that cursor has no effect: the tests that rely on it
are listed as known failures).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from _server import served  # bench/_server.py: one lethe serve with an admin token

from lethe.client import Client
from lethe.langgraph import LetheStore

_server = contextlib.ExitStack()
_client: Client | None = None
_outcomes: dict[str, str] = {}


class SuiteStore(LetheStore):
    """``LetheStore`` with ``InMemoryStore``'s constructor: each instance a fresh owner."""

    def __init__(self, *, index: Any = None, ttl: Any = None) -> None:
        """Bind to the plugin's server, on an owner no other instance uses.

        Args:
            index: LangGraph's index config, as ``LetheStore`` takes it.
            ttl: LangGraph's ``TTLConfig``, as ``LetheStore`` takes it.
        """
        assert _client is not None
        super().__init__(_client, owner=f"s{secrets.token_hex(8)}", index=index, ttl=ttl)


class SqliteSuiteStore(SuiteStore):
    """``SuiteStore`` as the SQLite store's fixtures use it: ``setup()`` does nothing."""

    def setup(self) -> None:
        """Nothing to set up: the server's store is ready."""


class AsyncSqliteSuiteStore(SuiteStore):
    """``SuiteStore`` as the async SQLite store's fixtures use it: ``await setup()``."""

    async def setup(self) -> None:
        """Nothing to set up: the server's store is ready."""


def _sqlite_index(index: Any) -> Any:
    """The SQLite store's index config as ``LetheStore`` takes it (``text_fields``: ``fields``)."""
    if index is None:
        return None
    out = dict(index)
    fields = out.get("text_fields")
    if fields is not None and not out.get("fields"):
        out["fields"] = [fields] if isinstance(fields, str) else fields
    return out


@contextlib.contextmanager
def _sqlite_store(
    cls: type[Any], conn_string: str, *, index: Any = None, ttl: Any = None
) -> Iterator[SqliteSuiteStore]:
    yield SqliteSuiteStore(index=_sqlite_index(index), ttl=ttl)


@contextlib.asynccontextmanager
async def _async_sqlite_store(
    cls: type[Any], conn_string: str, *, index: Any = None, ttl: Any = None
) -> AsyncIterator[AsyncSqliteSuiteStore]:
    yield AsyncSqliteSuiteStore(index=_sqlite_index(index), ttl=ttl)


class _NullCursor:
    """A psycopg cursor (sync and async) that executes nothing and fetches nothing."""

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self._done()

    def fetchone(self) -> Any:
        return self._done(None)

    def fetchall(self) -> Any:
        return self._done([])

    def _done(self, value: Any = None) -> Any:
        return value


class _AsyncNullCursor(_NullCursor):
    async def _done(self, value: Any = None) -> Any:
        return value


class _NullConnection:
    """What ``psycopg.Connection.connect`` gives here: executes nothing."""

    def __enter__(self) -> _NullConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, *args: Any, **kwargs: Any) -> None:
        return None


class _AsyncNullConnection:
    """What ``psycopg.AsyncConnection.connect`` gives here: executes nothing."""

    async def __aenter__(self) -> _AsyncNullConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def execute(self, *args: Any, **kwargs: Any) -> None:
        return None


class PostgresSuiteStore(SqliteSuiteStore):
    """``SuiteStore`` as the Postgres store's fixtures use it (no migrations, no sweeper)."""

    MIGRATIONS: ClassVar[list[str]] = []

    def start_ttl_sweeper(self, *args: Any) -> None:
        """Nothing to start: the Lethe server sweeps."""

    def stop_ttl_sweeper(self, *args: Any) -> bool:
        """Nothing to stop."""
        return True

    @contextlib.contextmanager
    def _cursor(self, *args: Any, **kwargs: Any) -> Iterator[_NullCursor]:
        yield _NullCursor()


class AsyncPostgresSuiteStore(AsyncSqliteSuiteStore):
    """``SuiteStore`` as the async Postgres store's fixtures use it."""

    MIGRATIONS: ClassVar[list[str]] = []

    async def start_ttl_sweeper(self, *args: Any) -> None:
        """Nothing to start: the Lethe server sweeps."""

    async def stop_ttl_sweeper(self, *args: Any) -> bool:
        """Nothing to stop."""
        return True

    @contextlib.asynccontextmanager
    async def _cursor(self, *args: Any, **kwargs: Any) -> AsyncIterator[_AsyncNullCursor]:
        yield _AsyncNullCursor()


@contextlib.contextmanager
def _postgres_store(
    cls: type[Any], conn_string: str, /, *, index: Any = None, ttl: Any = None, **_: Any
) -> Iterator[PostgresSuiteStore]:
    yield PostgresSuiteStore(index=index, ttl=ttl)


@contextlib.asynccontextmanager
async def _async_postgres_store(
    cls: type[Any], conn_string: str, /, *, index: Any = None, ttl: Any = None, **_: Any
) -> AsyncIterator[AsyncPostgresSuiteStore]:
    yield AsyncPostgresSuiteStore(index=index, ttl=ttl)


def _null_connect(cls: type[Any], *args: Any, **kwargs: Any) -> _NullConnection:
    return _NullConnection()


async def _async_null_connect(cls: type[Any], *args: Any, **kwargs: Any) -> _AsyncNullConnection:
    return _AsyncNullConnection()


def pytest_configure(config: pytest.Config) -> None:
    """Start the server and swap the stores before any test module is imported."""
    global _client
    if os.environ.get("LETHE_SUITE_BASELINE"):
        return
    import langgraph.store.memory

    port, token = _server.enter_context(served("--embedder", "none", "--metrics-listen", "off"))
    _client = Client(f"127.0.0.1:{port}", token)
    langgraph.store.memory.InMemoryStore = SuiteStore  # type: ignore[misc, assignment]
    with contextlib.suppress(ImportError):  # only where the SQLite store's tests run
        sqlite = importlib.import_module("langgraph.store.sqlite")
        sqlite.SqliteStore.from_conn_string = classmethod(_sqlite_store)
        sqlite.AsyncSqliteStore.from_conn_string = classmethod(_async_sqlite_store)
    with contextlib.suppress(ImportError):  # only where the Postgres store's tests run
        postgres = importlib.import_module("langgraph.store.postgres")
        psycopg = importlib.import_module("psycopg")
        postgres.PostgresStore.from_conn_string = classmethod(_postgres_store)
        postgres.AsyncPostgresStore.from_conn_string = classmethod(_async_postgres_store)
        psycopg.Connection.connect = classmethod(_null_connect)
        psycopg.AsyncConnection.connect = classmethod(_async_null_connect)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record each test's outcome (a failure in any phase fails it)."""
    wanted = report.when == "call" or report.outcome != "passed"
    if wanted and _outcomes.get(report.nodeid) != "failed":
        _outcomes[report.nodeid] = report.outcome


def pytest_unconfigure(config: pytest.Config) -> None:
    """Write the outcomes; stop the server."""
    path = os.environ.get("LETHE_SUITE_REPORT")
    if path:
        Path(path).write_text(json.dumps(_outcomes, indent=1, sort_keys=True))
    if _client is not None:
        _client.close()
    _server.close()
