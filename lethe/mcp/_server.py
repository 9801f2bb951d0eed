"""The MCP server: the tool list, each call checked and dispatched, every refusal a tool error.

:func:`build_server` makes the SDK's low-level ``mcp.server.Server`` with two
handlers:

- ``tools/list`` answers :data:`lethe.mcp._schemas.TOOLS`, each with its
  strict input schema and its hints (read-only, destructive, idempotent);
- ``tools/call`` checks the arguments against the tool's schema (JSON Schema
  2020-12, every violation reported), asks ``session_for`` who the call acts
  for, runs the tool (:data:`lethe.mcp._tools.HANDLERS`) and answers its JSON
  both as structured content and as text.

A refused call is a tool result with ``isError`` set, never a protocol error
and never a traceback: its text starts with the reason — Lethe's
``ErrorReason`` (``RECORD_DELETED``, ``OWNER_NOT_ALLOWED``…), the status
code's name when Lethe sent none (``UNAVAILABLE``), ``BAD_FIELD`` for
arguments the schema refuses, ``INTERNAL`` for a failure of this server
(logged on stderr, not shown) — then ``: `` and the message; its structured
content is ``{"error": {"reason", "code", "message", "fields", "subject"}}``.
Only a call of a tool that does not exist is a protocol error
(``INVALID_PARAMS``), as MCP asks.

:func:`serve_stdio` serves one session over stdin and stdout.

Imports ``mcp`` (the SDK), ``jsonschema`` (the SDK's dependency),
``lethe.client`` and this package.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
    ToolAnnotations,
)

from lethe.client import LetheError
from lethe.mcp._schemas import RULES, TOOLS, ToolSpec, tool_spec
from lethe.mcp._tools import HANDLERS, Refusal, Session

__all__ = ["SERVER_NAME", "SessionFor", "build_server", "serve_stdio", "tool_error"]

SERVER_NAME = "lethe"
"""The ``serverInfo.name`` of ``lethe mcp``."""
_MAX_PROBLEMS = 10
"""Most schema violations one refusal lists."""
_MAX_PROBLEM_CHARS = 300
"""Longest description of one violation (the SDK quotes the value; a text may be 64 KiB)."""

_log = logging.getLogger("lethe.mcp")

SessionFor = Callable[[ServerRequestContext[Any, Any]], Awaitable[Session]]
"""Who a call acts for: the session of a request context (stdio: one for the
process; HTTP: from the request's bearer token and headers). Raises
:class:`lethe.mcp._tools.Refusal` when it cannot tell."""

_VALIDATORS = {spec.name: Draft202012Validator(spec.input_schema) for spec in TOOLS}


def _version() -> str:
    for dist in ("lethe-store", "lethe-store-client"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


def _tool(spec: ToolSpec) -> Tool:
    return Tool(
        name=spec.name,
        title=spec.title,
        description=spec.description,
        input_schema=spec.input_schema,
        annotations=ToolAnnotations(
            title=spec.title,
            read_only_hint=spec.read_only,
            destructive_hint=spec.destructive,
            idempotent_hint=spec.idempotent,
            open_world_hint=False,
        ),
    )


def _path(error: ValidationError) -> str:
    """``turns[0].role`` for an error's location in the arguments."""
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problems(spec: ToolSpec, arguments: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The schema violations of ``arguments``: (descriptions, fields at fault)."""
    errors = sorted(
        _VALIDATORS[spec.name].iter_errors(arguments), key=lambda e: list(map(str, e.path))
    )
    lines, fields = [], []
    for error in errors[:_MAX_PROBLEMS]:
        where = _path(error)
        text = error.message
        if len(text) > _MAX_PROBLEM_CHARS:
            text = text[:_MAX_PROBLEM_CHARS] + "…"
        lines.append(f"{where or 'arguments'}: {text}")
        fields.append(where or "arguments")
    return lines, fields


def tool_error(
    reason: str,
    message: str,
    *,
    code: str = "",
    fields: list[str] | None = None,
    subject: str = "",
) -> CallToolResult:
    """A tool result with ``isError`` set whose text starts with ``reason``.

    Args:
        reason: the ``ErrorReason`` name (or status code name) the model reads first.
        message: what went wrong, in words.
        code: the gRPC status code's name, when Lethe refused.
        fields: the arguments (or request fields) at fault.
        subject: the record the refusal names ("" for none).

    Returns:
        The result: text ``"{reason}: {message}"`` and structured
        ``{"error": {"reason", "code", "message", "fields", "subject"}}``.
    """
    error = {
        "reason": reason,
        "code": code,
        "message": message,
        "fields": fields or [],
        "subject": subject,
    }
    return CallToolResult(
        content=[TextContent(type="text", text=f"{reason}: {message}")],
        structured_content={"error": error},
        is_error=True,
    )


def _lethe_error(err: LetheError) -> CallToolResult:
    code = err.code().name
    return tool_error(
        err.reason_name or code,
        err.message or code,
        code=code,
        fields=err.fields,
        subject=err.subject,
    )


def build_server(session_for: SessionFor) -> Server[Any]:
    """The low-level MCP server of ``lethe mcp``: the tool list and the tool calls.

    Args:
        session_for: who each call acts for (see :data:`SessionFor`).

    Returns:
        The server; run it with :func:`serve_stdio`, or serve
        ``server.streamable_http_app()`` (:mod:`lethe.mcp._http`).
    """

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=[_tool(spec) for spec in TOOLS])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams
    ) -> CallToolResult:
        spec = tool_spec(params.name)
        if spec is None:
            names = ", ".join(s.name for s in TOOLS)
            raise MCPError(INVALID_PARAMS, f"no tool named {params.name!r}; the tools: {names}")
        arguments = params.arguments or {}
        lines, fields = _problems(spec, arguments)
        if lines:
            return tool_error("BAD_FIELD", "; ".join(lines), code="INVALID_ARGUMENT", fields=fields)
        try:
            session = await session_for(ctx)
            answer = await HANDLERS[spec.name](session, arguments)
        except Refusal as refusal:
            return tool_error(refusal.reason, refusal.message, fields=refusal.fields)
        except LetheError as err:
            return _lethe_error(err)
        except Exception:
            _log.exception("tool %s failed", spec.name)
            return tool_error(
                "INTERNAL", f"{spec.name} failed inside the MCP server; its log has the details"
            )
        return CallToolResult(
            content=[TextContent(type="text", text=json.dumps(answer, ensure_ascii=False))],
            structured_content=answer,
        )

    return Server(
        SERVER_NAME,
        version=_version(),
        title="Lethe memory",
        instructions=RULES,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(server: Server[Any]) -> None:
    """Serve one MCP session over this process's stdin and stdout until stdin closes.

    Args:
        server: from :func:`build_server`.
    """
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
