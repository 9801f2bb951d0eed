"""``lethe mcp`` (:mod:`lethe.mcp`) through the ``mcp`` SDK's own client, against real processes.

One real ``lethe serve`` for the module (``--embedder none``: lexical search
is enough here and starts faster), tokens made by ``lethe token create``;
each test starts real ``lethe mcp`` processes and talks to them with the
SDK's ``ClientSession``: over stdio (``stdio_client``, the command a desktop
agent runs) and over streamable HTTP (``streamable_http_client`` with the
``Authorization`` header), as docs/mcp.md describes.

What is checked (docs/mcp.md; the issue's "Done when"): the tool list
validates as strict JSON Schema 2020-12; a session writes a pending turn,
finds it in its own thread only, commits it, finds it everywhere, forgets it
with a content-free receipt and never finds it again; derived memories go
with their source; a second owner's token reaches nothing of the first
owner's through any tool; bad arguments and refused calls are tool errors
whose text starts with the reason; HTTP without a good token is refused
before any MCP processing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import free_port
from jsonschema import Draft202012Validator
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from shredder import KekRing

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "server.cli"]
TOOL_NAMES = [
    "remember_turns",
    "store_memory",
    "search_memory",
    "assemble_context",
    "list_pending",
    "commit",
    "reject",
    "correct_fact",
    "update_status",
    "forget",
    "seal_repair",
    "reopen_repair",
    "conclude_repair",
    "due_commitments",
    "lineage",
]
FIRST_OWNERS = ("alice", "carol", "dave", "erin", "frank")
"""Owners the first token may act for: one per test, so searches never meet."""


@dataclass(frozen=True)
class Served:
    """The module's ``lethe serve``: where it listens and two principals' tokens.

    Attributes:
        target: ``127.0.0.1:PORT``.
        first: a token for :data:`FIRST_OWNERS`.
        second: a token for ``bob`` only.
    """

    target: str
    first: str
    second: str


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")} | extra


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data = tmp_path_factory.mktemp("mcp") / "data"
    env = _env(LETHE_KEK=KekRing.generate_env_value())
    port = free_port()
    argv = [*CLI, "serve", "--data", str(data), "--listen", f"127.0.0.1:{port}"]
    argv += ["--metrics-listen", "off", "--embedder", "none"]
    with subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            assert "serving" in proc.stdout.readline()

            def token(*owners: str) -> str:
                flags = [w for o in owners for w in ("--owner", o)]
                done = subprocess.run(
                    [*CLI, "token", "create", "--data", str(data), *flags],
                    env=env,
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=True,
                )
                return done.stdout.strip()

            yield Served(f"127.0.0.1:{port}", token(*FIRST_OWNERS), token("bob"))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


@pytest.fixture(scope="module")
def mcp_http(served: Served) -> Iterator[str]:
    """A ``lethe mcp --transport http`` process (no --owner: each request names one); its URL."""
    port = free_port()
    argv = [*CLI, "mcp", "--transport", "http", "--listen", f"127.0.0.1:{port}"]
    with subprocess.Popen(
        [*argv, "--target", served.target],
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith(f"lethe mcp serving http://127.0.0.1:{port}/mcp "), line
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0


@asynccontextmanager
async def stdio_session(served: Served, token: str, *flags: str) -> AsyncIterator[ClientSession]:
    """An MCP session with ``lethe mcp`` started as a desktop agent would (token from the env)."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "server.cli", "mcp", "--target", served.target, *flags],
        env={"LETHE_TOKEN": token},
        cwd=str(ROOT),
    )
    with tempfile.TemporaryFile("w+") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@asynccontextmanager
async def http_session(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    """An MCP session over streamable HTTP, every request carrying ``headers``."""
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def _call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> CallToolResult:
    result = await session.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    return result


def _text(result: CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, TextContent)
    assert "Traceback" not in block.text
    return block.text


async def ok(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Call ``tool``; it must succeed; its structured content (the same JSON as its text)."""
    result = await _call(session, tool, arguments)
    assert not result.is_error, _text(result)
    data = result.structured_content
    assert isinstance(data, dict)
    assert json.loads(_text(result)) == data
    return data


async def refused(
    session: ClientSession, tool: str, arguments: dict[str, Any], reason: str
) -> dict[str, Any]:
    """Call ``tool``; it must be a tool error led by ``reason``; the structured error."""
    result = await _call(session, tool, arguments)
    text = _text(result)
    assert result.is_error, text
    assert text.startswith(f"{reason}: "), text
    assert isinstance(result.structured_content, dict)
    error: dict[str, Any] = result.structured_content["error"]
    assert error["reason"] == reason
    return error


def _hit_names(answer: dict[str, Any]) -> list[str]:
    return [h.get("turn", h.get("memory", {}))["name"] for h in answer["hits"]]


def _objects(schema: Any) -> Iterator[dict[str, Any]]:
    """Every object schema inside ``schema``."""
    if isinstance(schema, dict):
        if schema.get("type") == "object":
            yield schema
        for value in schema.values():
            yield from _objects(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _objects(value)


# ---------------------------------------------------------------------- the tool list


def test_the_tool_list_is_strict_json_schema(served: Served) -> None:
    async def scenario() -> None:
        async with stdio_session(served, served.first, "--owner", "alice") as session:
            tools = (await session.list_tools()).tools
        assert [t.name for t in tools] == TOOL_NAMES
        for tool in tools:
            schema = tool.input_schema
            Draft202012Validator.check_schema(schema)
            assert schema["type"] == "object"
            assert not {"anyOf", "oneOf", "allOf"} & set(schema), tool.name
            objects = list(_objects(schema))
            assert objects, tool.name
            assert all(o["additionalProperties"] is False for o in objects), tool.name
            assert len(tool.description or "") > 100, tool.name
            assert tool.annotations is not None
        by_name = {t.name: t for t in tools}
        assert "PENDING" in (by_name["remember_turns"].description or "")
        forget = by_name["forget"]
        assert "final" in (forget.description or "")
        assert "backup" in (forget.description or "")
        assert forget.annotations is not None
        assert forget.annotations.destructive_hint is True
        search = by_name["search_memory"].annotations
        assert search is not None
        assert search.read_only_hint is True
        roles = by_name["remember_turns"].input_schema["properties"]["turns"]["items"]
        assert roles["properties"]["role"]["enum"] == ["USER", "ASSISTANT", "SYSTEM", "TOOL"]

    asyncio.run(scenario())


# ---------------------------------------------------------------------- the lifecycle, stdio


def test_stdio_session_writes_pending_commits_finds_forgets(served: Served) -> None:
    async def scenario() -> None:
        flags = ("--owner", "alice", "--thread", "chat-1")
        async with stdio_session(served, served.first, *flags) as s:
            wrote = await ok(
                s,
                "remember_turns",
                {"turns": [{"role": "USER", "text": "I adopted a puppy called Biscuit"}]},
            )
            assert wrote["thread"] == "owners/alice/threads/chat-1"
            assert wrote["thread_created"] is True
            (turn,) = wrote["turns"]
            name = turn["name"]
            assert name == "owners/alice/threads/chat-1/turns/1"
            assert turn["state"] == "PENDING"
            assert "expire_time" in turn
            other = await ok(
                s, "remember_turns", {"thread": "chat-2", "turns": [{"role": "USER", "text": "hi"}]}
            )
            assert other["thread"] == "owners/alice/threads/chat-2"

            # pending: found in its own thread only
            own = await ok(s, "search_memory", {"query": "puppy"})
            assert own["thread"] == "owners/alice/threads/chat-1"
            assert _hit_names(own) == [name]
            assert own["hits"][0]["turn"]["text"] == "I adopted a puppy called Biscuit"
            assert (
                _hit_names(await ok(s, "search_memory", {"query": "puppy", "thread": "chat-2"}))
                == []
            )
            committed_only = {"query": "puppy", "include_pending": False}
            assert _hit_names(await ok(s, "search_memory", committed_only)) == []
            pending = await ok(s, "list_pending", {})
            assert [t["name"] for t in pending["turns"]] == [name]

            # committed: found everywhere
            done = await ok(s, "commit", {"names": [name]})
            assert done["committed"] == [{"name": name, "version": 1}]
            assert _hit_names(await ok(s, "search_memory", committed_only)) == [name]
            in_other = await ok(s, "search_memory", {"query": "puppy", "thread": "chat-2"})
            assert _hit_names(in_other) == [name]
            assert (await ok(s, "list_pending", {}))["turns"] == []

            # a memory derived from it, with lineage
            fact = (
                await ok(
                    s,
                    "store_memory",
                    {
                        "kind": "FACT",
                        "text": "has a puppy named Biscuit",
                        "slot": "pet.name",
                        "sources": [{"name": name, "version": 1}],
                        "commit": True,
                    },
                )
            )["memory"]
            assert fact["state"] == "COMMITTED"
            assert fact["kind"] == "FACT"
            assert fact["direction"] == "ABOUT_PERSON"
            assert fact["status"] == "ACTIVE"
            edges = (await ok(s, "lineage", {"name": fact["name"]}))["edges"]
            assert edges == [
                {
                    "source": {"name": name, "version": 1},
                    "derivative": {"name": fact["name"], "version": 1},
                }
            ]
            fixed = (
                await ok(
                    s,
                    "correct_fact",
                    {
                        "name": fact["name"],
                        "text": "has a puppy named Biscuit (a beagle)",
                        "expected_version": 1,
                    },
                )
            )["memory"]
            assert (fixed["version"], fixed["supersedes"]) == (2, 1)

            # forgotten: a content-free receipt, then never found again
            receipt = (await ok(s, "forget", {"names": [name], "reason": "asked"}))["receipt"]
            assert receipt["targets"] == [name]
            assert receipt["deleted"] == 2
            assert receipt["cascaded"] == 1
            assert {d["name"] for d in receipt["destinations"]} >= {"lmdb", "index", "keystore"}
            assert all(d["done"] for d in receipt["destinations"])
            assert receipt["name"].startswith("owners/alice/deletions/")
            assert "puppy" not in json.dumps(receipt)
            assert "Biscuit" not in json.dumps(receipt)
            for query in ("puppy", "Biscuit", "beagle"):
                for args in ({"query": query}, {"query": query, "include_pending": False}):
                    assert _hit_names(await ok(s, "search_memory", args)) == []
            context = await ok(s, "assemble_context", {"query": "puppy"})
            assert "Biscuit" not in json.dumps(context)
            await refused(s, "commit", {"names": [name]}, "RECORD_DELETED")
            await refused(s, "lineage", {"name": fact["name"]}, "RECORD_DELETED")
            error = await refused(s, "forget", {"names": [name]}, "RECORD_DELETED")
            assert error["code"] == "NOT_FOUND"

    asyncio.run(scenario())


# ---------------------------------------------------------------------- errors


def test_bad_arguments_and_refusals_are_tool_errors_with_reasons(served: Served) -> None:
    async def scenario() -> None:
        async with stdio_session(served, served.first, "--owner", "carol") as s:
            error = await refused(
                s, "remember_turns", {"turns": [{"role": "BOSS", "text": "x"}]}, "BAD_FIELD"
            )
            assert error["fields"] == ["turns[0].role"]
            error = await refused(
                s, "search_memory", {"query": "x", "top_k": 5000, "extra": 1}, "BAD_FIELD"
            )
            assert sorted(error["fields"]) == ["arguments", "top_k"]
            await refused(s, "commit", {}, "BAD_FIELD")  # names is required
            await refused(s, "commit", {"names": ["carol's turn"]}, "BAD_FIELD")  # no such name
            await refused(
                s, "remember_turns", {"turns": [{"role": "USER", "text": ""}]}, "BAD_FIELD"
            )
            await refused(s, "forget", {}, "BAD_FIELD")  # names or a range
            await refused(s, "assemble_context", {}, "BAD_FIELD")  # no thread in this session
            await refused(
                s,
                "store_memory",
                {"kind": "COMMITMENT", "text": "call back", "due_time": "next tuesday"},
                "BAD_FIELD",
            )
            await refused(
                s,
                "conclude_repair",
                {"repair": "owners/carol/threads/r", "outcome": "DISTILL"},
                "BAD_FIELD",
            )

            # Lethe's own refusals, by reason
            wrote = await ok(
                s,
                "remember_turns",
                {"turns": [{"role": "USER", "text": "we will be 12"}], "commit": True},
            )
            turn = wrote["turns"][0]["name"]
            await refused(s, "reject", {"names": [turn]}, "ILLEGAL_TRANSITION")  # committed
            fact = (
                await ok(
                    s,
                    "store_memory",
                    {"kind": "FACT", "text": "12 guests", "slot": "guests", "commit": True},
                )
            )["memory"]
            await refused(
                s,
                "store_memory",
                {"kind": "FACT", "text": "13 guests", "slot": "guests"},
                "SLOT_CONFLICT",
            )
            error = await refused(
                s,
                "correct_fact",
                {"name": fact["name"], "text": "14", "expected_version": 7},
                "VERSION_MISMATCH",
            )
            assert error["code"] == "ABORTED"
            await refused(
                s,
                "update_status",
                {"name": fact["name"], "status": "ANSWERED"},
                "ILLEGAL_TRANSITION",
            )
            await refused(s, "commit", {"names": ["owners/carol/memories/never"]}, "NOT_FOUND")
            await refused(
                s,
                "store_memory",
                {"kind": "SUMMARY", "text": "s", "sources": [{"name": turn, "version": 9}]},
                "SOURCE_STALE",
            )
            candidate = await ok(
                s,
                "remember_turns",
                {"thread": wrote["thread"], "turns": [{"role": "USER", "text": "maybe"}]},
            )
            receipt = (await ok(s, "reject", {"names": [candidate["turns"][0]["name"]]}))["receipt"]
            assert receipt["deleted"] == 1
            with pytest.raises(MCPError, match="no tool named 'recall'"):
                await s.call_tool("recall", {})

    asyncio.run(scenario())


def test_stdio_refuses_to_start_without_a_token_or_an_owner(served: Served) -> None:
    for flags, missing in ((["--owner", "alice"], "--token"), (["--token", "t"], "--owner")):
        done = subprocess.run(
            [*CLI, "mcp", "--target", served.target, *flags],
            env=_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 2
        assert done.stderr.startswith(f"lethe mcp: {missing} ")
        assert done.stdout == ""


# ---------------------------------------------------------------------- owners


def _every_tool(
    owner: str, turn: str, memory: str, thread: str
) -> list[tuple[str, dict[str, Any]]]:
    """A call of every tool, each naming ``owner``'s records."""
    ref = {"name": turn, "version": 1}
    return [
        ("remember_turns", {"thread": thread, "turns": [{"role": "USER", "text": "x"}]}),
        ("store_memory", {"kind": "FACT", "text": "x", "sources": [ref]}),
        ("search_memory", {"query": "lighthouse", "thread": thread}),
        ("assemble_context", {"thread": thread, "query": "lighthouse"}),
        ("list_pending", {"thread": thread}),
        ("commit", {"names": [turn]}),
        ("reject", {"names": [memory]}),
        ("correct_fact", {"name": memory, "text": "x"}),
        ("update_status", {"name": memory, "status": "ANSWERED"}),
        ("forget", {"names": [turn, memory]}),
        ("seal_repair", {"thread": thread, "from_seq": 1}),
        ("reopen_repair", {"repair": thread}),
        ("conclude_repair", {"repair": thread, "outcome": "DESTROY"}),
        ("due_commitments", {}),
        ("lineage", {"name": memory}),
    ]


def test_a_second_owners_token_reaches_nothing_of_the_first_owner(served: Served) -> None:
    async def scenario() -> None:
        async with stdio_session(served, served.first, "--owner", "dave") as alice:
            wrote = await ok(
                alice,
                "remember_turns",
                {"thread": "secret", "turns": [{"role": "USER", "text": "the lighthouse key"}]},
            )
            turn, thread = wrote["turns"][0]["name"], wrote["thread"]
            memory = (
                await ok(
                    alice,
                    "store_memory",
                    {
                        "kind": "OPEN_QUESTION",
                        "text": "which lighthouse?",
                        "sources": [{"name": turn, "version": 1}],
                    },
                )
            )["memory"]["name"]
        calls = _every_tool("dave", turn, memory, thread)
        assert [tool for tool, _ in calls] == TOOL_NAMES

        # bob's session (bob's token, owner bob): dave's names are refused by the session
        async with stdio_session(served, served.second, "--owner", "bob") as bob:
            for tool, arguments in calls:
                if tool == "due_commitments":
                    assert (await ok(bob, tool, arguments))["due"] == []
                    continue
                if tool == "search_memory":
                    arguments = {"query": "lighthouse"}
                    assert (await ok(bob, tool, arguments))["hits"] == []
                    continue
                await refused(bob, tool, arguments, "OWNER_NOT_ALLOWED")
        # bob's token in a session for owner dave: Lethe itself refuses every tool
        async with stdio_session(served, served.second, "--owner", "dave") as bob:
            for tool, arguments in calls:
                error = await refused(bob, tool, arguments, "OWNER_NOT_ALLOWED")
                assert error["code"] == "PERMISSION_DENIED", tool
        # dave's data is untouched: still pending, still found in its thread
        async with stdio_session(served, served.first, "--owner", "dave") as alice:
            found = await ok(alice, "search_memory", {"query": "lighthouse", "thread": "secret"})
            assert _hit_names(found) == [turn]
            pending = await ok(alice, "list_pending", {"thread": "secret"})
            assert [t["name"] for t in pending["turns"]] == [turn]
            assert memory in [m["name"] for m in pending["memories"]]

    asyncio.run(scenario())


# ---------------------------------------------------------------------- repairs, commitments


def test_repairs_context_manifests_and_due_commitments(served: Served) -> None:
    async def scenario() -> None:
        async with stdio_session(served, served.first, "--owner", "erin", "--thread", "trip") as s:
            # a fresh session's thread reads as empty before anything is written to it
            assert (await ok(s, "search_memory", {"query": "Lisbon"}))["hits"] == []
            assert (await ok(s, "list_pending", {}))["turns"] == []
            turns = [
                {"role": "USER", "text": "Let's plan the trip to Lisbon"},
                {"role": "USER", "text": "My father is in hospital, I cannot think about it"},
                {"role": "ASSISTANT", "text": "I am so sorry. The trip can wait."},
            ]
            await ok(s, "remember_turns", {"turns": turns, "commit": True})
            repair = (await ok(s, "seal_repair", {"from_seq": 2}))["repair"]
            assert repair["kind"] == "REPAIR"
            assert repair["repair"] == {
                "source_thread": "owners/erin/threads/trip",
                "from_seq": 2,
                "state": "PAUSED",
            }
            assert _hit_names(await ok(s, "search_memory", {"query": "hospital"})) == []
            reopened = await ok(s, "reopen_repair", {"repair": repair["name"]})
            assert [t["seq"] for t in reopened["turns"]] == [2, 3]
            concluded = await ok(
                s,
                "conclude_repair",
                {
                    "repair": repair["name"],
                    "outcome": "DISTILL",
                    "lesson": "Ask after her father first",
                },
            )
            assert concluded["receipt"]["deleted"] == 2
            lesson = concluded["lesson"]
            assert (lesson["kind"], lesson["state"], "sources" in lesson) == (
                "LESSON",
                "COMMITTED",
                False,
            )

            bundle = await ok(s, "assemble_context", {"query": "Lisbon trip"})
            assert bundle["manifest"].startswith("owners/erin/manifests/")
            assert "hospital" not in json.dumps(bundle)
            assert [t["seq"] for t in bundle["recent_turns"]] == [1]
            reply = await ok(
                s,
                "remember_turns",
                {
                    "turns": [
                        {
                            "role": "ASSISTANT",
                            "text": "Lisbon in May, then?",
                            "context_manifest": bundle["manifest"],
                        }
                    ]
                },
            )
            assert reply["turns"][0]["context_manifest"] == bundle["manifest"]

            due = await ok(
                s,
                "store_memory",
                {
                    "kind": "COMMITMENT",
                    "text": "send the hotel list",
                    "due_time": "2020-01-01T09:00:00Z",
                    "commit": True,
                },
            )
            later = await ok(
                s,
                "store_memory",
                {
                    "kind": "COMMITMENT",
                    "text": "book the flights",
                    "due_time": "2999-01-01T09:00:00+02:00",
                    "commit": True,
                },
            )
            commitment = due["memory"]
            assert commitment["direction"] == "OWED_BY_SYSTEM"
            assert commitment["status"] == "OPEN"
            listed = (await ok(s, "due_commitments", {}))["due"]
            assert [(c["name"], c["overdue"]) for c in listed] == [(commitment["name"], True)]
            assert later["memory"]["name"] not in json.dumps(listed)
            closed = await ok(
                s, "update_status", {"name": commitment["name"], "status": "FULFILLED"}
            )
            assert closed["memory"]["status"] == "FULFILLED"
            assert (await ok(s, "due_commitments", {}))["due"] == []

    asyncio.run(scenario())


# ---------------------------------------------------------------------- HTTP


def _post(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], dict[str, Any]]:
    """POST a ``tools/call`` of remember_turns to ``url``: (status, headers, JSON body)."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "remember_turns",
            "arguments": {"thread": "door", "turns": [{"role": "USER", "text": "let me in"}]},
        },
    }
    request = urllib.request.Request(  # noqa: S310 (the test's own loopback URL)
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **headers,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (loopback)
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def test_http_without_a_good_token_is_refused_before_mcp(served: Served, mcp_http: str) -> None:
    status, headers, body = _post(mcp_http, {"X-Lethe-Owner": "frank"})
    assert status == 401
    assert headers["www-authenticate"].startswith("Bearer")
    assert body == {"error": {"reason": "MISSING_TOKEN", "message": body["error"]["message"]}}
    status, headers, body = _post(
        mcp_http, {"Authorization": "Bearer lethe_not-a-token", "X-Lethe-Owner": "frank"}
    )
    assert (status, body["error"]["reason"]) == (401, "INVALID_TOKEN")
    assert 'error="invalid_token"' in headers["www-authenticate"]
    status, _, body = _post(
        mcp_http, {"Authorization": f"Basic {served.first}", "X-Lethe-Owner": "frank"}
    )
    assert (status, body["error"]["reason"]) == (401, "MISSING_TOKEN")
    status, _, body = _post(
        mcp_http, {"Authorization": f"Bearer {served.second}", "X-Lethe-Owner": "frank"}
    )
    assert (status, body["error"]["reason"]) == (403, "OWNER_NOT_ALLOWED")
    status, _, body = _post(mcp_http, {"Authorization": f"Bearer {served.first}"})
    assert (status, body["error"]["reason"]) == (400, "BAD_FIELD")  # no owner, and no --owner

    async def nothing_was_written() -> None:
        headers = {"Authorization": f"Bearer {served.first}", "X-Lethe-Owner": "frank"}
        async with http_session(mcp_http, headers) as s:
            await refused(s, "list_pending", {"thread": "door"}, "NOT_FOUND")

    asyncio.run(nothing_was_written())
    with pytest.raises(BaseException):  # noqa: B017, PT011 (the SDK's error for a 401)
        asyncio.run(_initialize_only(mcp_http, {"X-Lethe-Owner": "frank"}))


async def _initialize_only(url: str, headers: dict[str, str]) -> None:
    async with http_session(url, headers):
        pass


def test_http_session_writes_pending_commits_finds_forgets(served: Served, mcp_http: str) -> None:
    async def scenario() -> None:
        headers = {"Authorization": f"Bearer {served.first}", "X-Lethe-Owner": "frank"}
        async with http_session(mcp_http, headers) as s:
            assert [t.name for t in (await s.list_tools()).tools] == TOOL_NAMES
            wrote = await ok(
                s,
                "remember_turns",
                {"turns": [{"role": "USER", "text": "my cello teacher is Ana"}]},
            )
            thread, name = wrote["thread"], wrote["turns"][0]["name"]
            assert thread.startswith("owners/frank/threads/")
            assert wrote["thread_created"] is True
            assert wrote["turns"][0]["state"] == "PENDING"
            assert _hit_names(
                await ok(s, "search_memory", {"query": "cello", "thread": thread})
            ) == [name]
            assert _hit_names(await ok(s, "search_memory", {"query": "cello"})) == []
            assert (await ok(s, "commit", {"names": [name]}))["committed"] == [
                {"name": name, "version": 1}
            ]
            assert _hit_names(await ok(s, "search_memory", {"query": "cello"})) == [name]
            receipt = (await ok(s, "forget", {"names": [name]}))["receipt"]
            assert receipt["targets"] == [name]
            assert receipt["deleted"] == 1
            assert "cello" not in json.dumps(receipt)
            assert _hit_names(await ok(s, "search_memory", {"query": "cello"})) == []
            assert (
                _hit_names(await ok(s, "search_memory", {"query": "cello", "thread": thread})) == []
            )
            await refused(s, "commit", {"names": [name]}, "RECORD_DELETED")
        # the same endpoint, another principal with its own token: refused for frank's data
        bob = {"Authorization": f"Bearer {served.second}", "X-Lethe-Owner": "bob"}
        async with http_session(mcp_http, bob) as s:
            await refused(s, "forget", {"names": [name]}, "OWNER_NOT_ALLOWED")
            assert (await ok(s, "search_memory", {"query": "cello"}))["hits"] == []

    asyncio.run(scenario())
